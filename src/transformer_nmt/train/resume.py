"""Save and resume a training run: the trainer's named parts to a checkpoint and back.

The parts are :class:`transformer_nmt.train.setup.Setup`'s (model, optimizer, scheduler,
grad scaler), the loop's :class:`transformer_nmt.train.state.TrainState` (counters and the
sampler position) and the RNG states, stored by :func:`transformer_nmt.checkpoint.training_checkpoint`
(format described there). Resume restores them exactly: an interrupted run continues as an
uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from transformer_nmt.checkpoint import (
    BEST_NAME,
    UNREADABLE_SUFFIX,
    UnreadableCheckpointError,
    check_same_model,
    check_training_checkpoint,
    checkpoint_dir,
    config_differences,
    load_checkpoint,
    prune_checkpoints,
    restore_modules,
    save_checkpoint,
    step_checkpoints,
    training_checkpoint,
)
from transformer_nmt.config import Config, to_plain
from transformer_nmt.errors import UserError
from transformer_nmt.runtime import LOCK_NAME as _LOCK_NAME
from transformer_nmt.runtime import folder_lock, rng_state, set_rng_state
from transformer_nmt.train.distributed import DistInfo
from transformer_nmt.train.setup import Setup
from transformer_nmt.train.state import TrainState

log = logging.getLogger(__name__)

LOCK_NAME = _LOCK_NAME
"""The run directory's lock file while a command writes in it (:func:`run_lock`)."""


def run_lock(run_dir: str | Path) -> contextlib.AbstractContextManager[Path]:
    """Hold the run directory's lock while a run trains
    (:func:`transformer_nmt.runtime.folder_lock` as ``nmt-train``), so that a second
    ``nmt-train``, or an ``nmt-evaluate`` / ``nmt-average`` beside it, stops instead of
    interleaving its files with the run's.

    Raises:
        UserError: ``run_dir`` is a file, or another live process holds the lock (named).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run_dir={run_dir} is a file, not a folder; give the run another run_dir=")
    return folder_lock(run_dir, "nmt-train")


def save_training(
    run_dir: str | Path, s: Setup, state: TrainState, info: DistInfo, *, config: Config,
    seed: int, keep_last: int, best: bool = False, regular: bool = True,
) -> None:
    """Write ``checkpoint_<step>.pt`` (pruning to the last ``keep_last`` periodic ones and the
    newest, :func:`transformer_nmt.checkpoint.prune_checkpoints`) and / or
    ``checkpoint_best.pt`` from the trainer's parts (with the vocabulary's and the training
    data's identities).

    Every rank calls it (the RNG states are gathered); rank 0 writes.

    Args:
        s: :class:`transformer_nmt.train.setup.Setup` (model, optimizer, scheduler, scaler,
            vocab_size, vocab).
        state: :class:`transformer_nmt.train.state.TrainState`.
        info: this process's :class:`transformer_nmt.train.distributed.DistInfo`.
    """
    from transformer_nmt.train import distributed

    rngs = distributed.all_gather_object(rng_state())
    if not info.is_main:
        return
    ckpt = training_checkpoint(
        model=s.model, optimizer=s.optimizer, scheduler=s.scheduler, scaler=s.scaler,
        sampler=state.sampler_state(seed), rng=rngs, train_state=state.state_dict(),
        config=config, vocab_size=s.vocab_size, vocab=s.vocab, data=getattr(s, "data", None),
    )
    folder = checkpoint_dir(run_dir)
    if regular:
        path = save_checkpoint(folder / f"checkpoint_{state.step}.pt", ckpt)
        prune_checkpoints(run_dir, keep_last, config.trainer.save_every_steps)
        log.info("saved %s", path)
    if best:
        save_checkpoint(folder / BEST_NAME, ckpt)
        log.info("saved %s (step %d)", folder / BEST_NAME, state.step)


def _load_resumable(run_dir: str | Path, info: Any) -> tuple[Path, dict[str, Any]] | None:
    """The newest step checkpoint of the run that loads, and its contents; None when the run
    has no step checkpoint.

    An unreadable newer one (empty, truncated: a job killed while copying or a full disk) is
    named in a warning and, on rank 0, renamed to ``<name>.unreadable`` so that averaging and
    later resumes skip it.

    Raises:
        UnreadableCheckpointError: no step checkpoint of the run can be read (all named).
    """
    paths = step_checkpoints(run_dir)
    bad: list[str] = []
    for path in reversed(paths):
        try:
            return path, load_checkpoint(path, map_location="cpu")
        except FileNotFoundError:  # renamed by rank 0 meanwhile
            continue
        except UnreadableCheckpointError as e:
            bad.append(str(e))
            if info.is_main:
                aside = path.with_name(path.name + UNREADABLE_SUFFIX)
                try:
                    path.replace(aside)
                    moved = f"; moved it to {aside.name}"
                except OSError:
                    moved = ""
                log.warning("%s%s; resuming from the newest checkpoint before it", e, moved)
    if bad:
        raise UnreadableCheckpointError(
            f"no checkpoint of {checkpoint_dir(run_dir)} can be read ({'; '.join(bad)}); "
            "remove them to start the run again from step 0"
        )
    return None


def check_same_data(saved: dict[str, Any], path: str | Path, data: dict[str, Any] | None) -> None:
    """Fail unless the binarized training data is the one the checkpoint ``saved`` was
    trained on (``"data"``: :func:`transformer_nmt.data.prepare.training_data_identity`;
    not checked where either side does not record it). The data position is counted in
    batches of that data: on other data (prepared again with other limits, or another
    corpus under the name) a resume would continue somewhere else in another dataset.

    Raises:
        UserError: one line naming the run, both identities and the ways out.
    """
    theirs = saved.get("data")
    if not isinstance(theirs, dict) or not isinstance(data, dict) or not theirs.get("sha256"):
        return
    if theirs.get("sha256") == data.get("sha256"):
        return
    run_dir = Path(path).parent.parent
    raise UserError(
        f"{run_dir} was trained on other training data ({Path(path).name}: "
        f"{theirs.get('pairs')} {theirs.get('split')} pairs of {theirs.get('name')}, sha256 "
        f"{str(theirs['sha256'])[:12]}; the data now: {data.get('pairs')} pairs, sha256 "
        f"{str(data.get('sha256'))[:12]}): it was prepared again since (other "
        "model.max_positions or trainer.max_tokens, or another corpus under this data.name); "
        "run nmt-prepare with the settings the run was started with, or give a new run "
        "another run_dir= or name= (trainer.init_from= starts it from these weights)"
    )


RESUME_GROUPS = ("name", "model", "data", "trainer")
"""The config groups a resume compares (:func:`transformer_nmt.checkpoint.config_differences`)."""


def check_resume_changed(config: Config) -> None:
    """Fail unless every entry of ``trainer.resume_changed`` is ``*`` or a setting a resume
    compares (``name``, ``model.*``, ``data.*``, ``trainer.*`` of this config): a misspelt key
    would otherwise let nothing through, silently.

    Raises:
        UserError: naming the entry and the closest setting.
    """
    import difflib

    plain = to_plain(config)
    known: list[str] = []

    def walk(node: Any, key: str) -> None:
        known.append(key)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}")

    for group in RESUME_GROUPS:
        walk(plain.get(group), group)
    for entry in config.trainer.resume_changed or []:
        if entry != "*" and entry not in known:
            close = difflib.get_close_matches(str(entry), known, n=1)
            raise UserError(
                f"trainer.resume_changed=[{entry}]: {entry} is not a setting a resume compares "
                f"(name, model.*, data.*, trainer.*)"
                + (f"; did you mean {close[0]}?" if close else "")
                + " Name each changed key as the refusal names it, or use [*]")


def check_same_settings(saved: dict[str, Any], path: str | Path, config: Config | None,
                        vocab: dict[str, Any] | None) -> None:
    """Fail unless ``config`` continues the run the checkpoint ``saved`` belongs to: the same
    vocabulary (``spm_sha256``, where recorded) and the same settings apart from the
    allow-list :data:`transformer_nmt.checkpoint.RESUME_HARMLESS_KEYS` and the keys named in
    ``trainer.resume_changed`` (:func:`transformer_nmt.checkpoint.config_differences`).

    A change of the model (``model.heads``, dropout), the optimisation (learning rate, label
    smoothing, seed) or the data order (``max_tokens``, ``update_freq``: the data position is
    counted in batches) would otherwise be resumed silently.

    Raises:
        UserError: one line naming the run, every key that differs with both values, and the
            override.
    """
    run_dir = Path(path).parent.parent
    theirs = saved.get("vocab")
    if vocab is not None and isinstance(theirs, dict) and theirs.get("spm_sha256") and (
            theirs.get("spm_sha256") != vocab.get("spm_sha256")):
        raise UserError(
            f"{run_dir} was trained with another vocabulary ({Path(path).name}: "
            f"{theirs.get('vocab_size')} pieces, spm.model sha256 {theirs['spm_sha256'][:12]}; "
            f"the data now: {vocab.get('vocab_size')} pieces, sha256 "
            f"{str(vocab.get('spm_sha256'))[:12]}); resume it with the data it was started "
            "with, or give a new run another run_dir= or name="
        )
    if config is None:
        return
    diff = config_differences(saved.get("config"), to_plain(config))
    if diff:
        keys = ",".join(d.split(":")[0] for d in diff)
        raise UserError(
            f"{run_dir} was started with other settings ({Path(path).name}: "
            + "; ".join(diff) + "); resume it with the settings it was started with, add "
            f"trainer.resume_changed=[{keys}] to change them deliberately, or give a new run "
            "another run_dir= or name="
        )


def resume_training(run_dir: str | Path, s: Setup, state: TrainState, seed: int,
                    info: DistInfo, config: Config | None = None) -> Path | None:
    """Load the run's newest readable checkpoint into ``s`` and ``state``; returns its path
    (or None when the run has no checkpoint).

    The same world size restores every rank's RNG states (bit-exact continuation); another
    world size rescales the data position and reseeds, with a warning. An unreadable newer
    checkpoint is skipped with a warning (:func:`_load_resumable`).

    Args:
        config: the run's config (its ``model`` sizes are named if the checkpoint holds
            another model).

    Raises:
        ValueError: the checkpoint lacks a part (names the file and the parts).
        UserError: the run directory holds another model (:func:`check_same_model`), was
            started with other settings or another vocabulary (:func:`check_same_settings`),
            or trained on other training data (:func:`check_same_data`);
            UnreadableCheckpointError: no checkpoint of the run can be read.
    """
    from transformer_nmt.runtime import seed_everything

    found = _load_resumable(run_dir, info)
    if found is None:
        return None
    path, saved = found
    check_training_checkpoint(saved, path)
    check_same_model(saved, s.model, path, config)
    check_same_settings(saved, path, config, getattr(s, "vocab", None))
    check_same_data(saved, path, getattr(s, "data", None))
    restore_modules(saved, model=s.model, optimizer=s.optimizer, scheduler=s.scheduler,
                    scaler=s.scaler)
    state.load_state_dict(saved["train_state"])
    state.epoch, state.position = int(saved["sampler"]["epoch"]), int(saved["sampler"]["position"])
    saved_ws = int(state.world_size)
    if saved_ws != info.world_size:
        log.warning(
            "%s was written with world_size=%d, now %d: the data position is rescaled and "
            "RNG streams reseeded, so the run will not match an uninterrupted one exactly",
            path, saved_ws, info.world_size,
        )
        state.position = state.position * saved_ws // info.world_size
        if state.position >= len(s.sampler):
            state.epoch += 1
            state.position = 0
        seed_everything(seed + info.rank + 1000 * int(state.step))
    else:
        set_rng_state(saved["rng"][info.rank])
    state.world_size = info.world_size
    if info.is_main:
        log.info("resumed from %s (step %d, epoch %d, batch %d of the epoch)", path,
                 state.step, state.epoch, state.position)
    return path
