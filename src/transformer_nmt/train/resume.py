"""Save and resume a training run: the trainer's named parts to a checkpoint and back.

The parts are :class:`transformer_nmt.train.setup.Setup`'s (model, optimizer, scheduler,
grad scaler), the loop's :class:`transformer_nmt.train.state.TrainState` (counters and the
sampler position) and the RNG states, stored by
:func:`transformer_nmt.checkpoint.training_checkpoint` (format described there). Resume restores
them exactly: an interrupted run continues as an uninterrupted one would.
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
from transformer_nmt.data.bpe import describe_vocabulary, file_only_note, same_vocabulary
from transformer_nmt.errors import UserError
from transformer_nmt.run.lock import folder_lock
from transformer_nmt.runtime import rng_state, seed_everything, set_rng_state
from transformer_nmt.train import distributed
from transformer_nmt.train.distributed import DistInfo
from transformer_nmt.train.setup import Setup
from transformer_nmt.train.state import TrainState

log = logging.getLogger(__name__)


def run_lock(run_dir: str | Path) -> contextlib.AbstractContextManager[Path]:
    """Hold the run directory's lock while a run trains
    (:func:`transformer_nmt.run.lock.folder_lock` as ``nmt-train``), so that a second
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
    rngs = distributed.all_gather_object(rng_state())
    if not info.is_main:
        return
    ckpt = training_checkpoint(
        model=s.model, optimizer=s.optimizer, scheduler=s.scheduler, scaler=s.scaler,
        sampler={**state.sampler_state(seed), **consumed_part(s.sampler, state)},
        rng=rngs, train_state=state.state_dict(),
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


def consumed_part(sampler: Any, state: TrainState) -> dict[str, Any]:
    """The checkpoint's data position as sentences: ``{"sentences": K, "consumed": (ceil(N /
    8),) uint8 tensor}``, the bits (``np.packbits``) of the K sentences of the N in the
    split that the ranks consumed in the current epoch
    (:meth:`~transformer_nmt.data.batching.LengthBucketSampler.consumed`)."""
    import numpy as np
    import torch

    done = sampler.consumed(state.epoch, state.position)
    mask = np.zeros(sampler.num_examples, dtype=bool)
    mask[done] = True
    return {"sentences": len(done), "consumed": torch.from_numpy(np.packbits(mask))}


def _consumed_indices(part: dict[str, Any], n: int, path: Path) -> Any:
    """The sentence indices of a checkpoint's ``consumed`` bits (:func:`consumed_part`).

    Raises:
        UserError: the bits are of another split size, or disagree with their count.
    """
    import numpy as np

    bits = np.asarray(part["consumed"], dtype=np.uint8)
    if len(bits) != -(-n // 8):
        raise UserError(f"{path} was written for a training split of about {len(bits) * 8} "
                        f"pairs, the split now holds {n}; resume it with the data it was "
                        "started with")
    done = np.flatnonzero(np.unpackbits(bits, count=n))
    if len(done) != int(part.get("sentences", len(done))):
        raise UserError(f"{path}: its data position is damaged ({len(done)} sentences marked, "
                        f"{part.get('sentences')} recorded); resume from an earlier checkpoint")
    return done


def restore_data_position(saved: dict[str, Any], path: Path, s: Setup, state: TrainState,
                          world_size: int) -> bool:
    """Put the checkpoint's data position into ``state`` (and ``s.sampler``); True when it
    is the same batch layout (position in batches, exact), False when the epoch continues
    from the sentences consumed (another world size, ``max_tokens`` or padding).

    A checkpoint with ``consumed`` bits continues in any layout: when the layout differs,
    :meth:`~transformer_nmt.data.batching.LengthBucketSampler.resume_epoch` batches the
    rest of the epoch anew, so every sentence of the epoch is seen once. An older
    checkpoint (batches only) of another world size rescales the position (approximate).
    """
    part = saved["sampler"]
    state.epoch, state.position = int(part["epoch"]), int(part["position"])
    saved_ws = int(state.world_size)
    if "consumed" not in part:
        saved_mt = ((saved.get("config") or {}).get("trainer") or {}).get("max_tokens")
        if saved_mt is not None and int(saved_mt) != int(s.sampler.max_tokens):
            raise UserError(
                f"{path} holds its data position in batches of max_tokens {saved_mt}, this "
                f"run plans {s.sampler.max_tokens}; resume it with trainer.max_tokens={saved_mt} "
                "trainer.auto_max_tokens=false")
        if saved_ws == world_size:
            return True
        state.position = state.position * saved_ws // world_size
        if state.position >= len(s.sampler):
            state.epoch, state.position = state.epoch + 1, 0
        return False
    done = _consumed_indices(part, s.sampler.num_examples, path)
    if saved_ws == world_size and state.position <= len(s.sampler):
        same = s.sampler.consumed(state.epoch, state.position)
        if len(same) == len(done) and (same == done).all():
            return True
    s.sampler.resume_epoch(state.epoch, done)
    state.position = 0
    if len(s.sampler) == 0:
        state.epoch += 1
    return False


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


def _same_data_as_recorded(theirs: dict[str, Any], saved: dict[str, Any], vocab: dict[str, Any],
                           data: dict[str, Any] | None) -> bool:
    """Whether a checkpoint whose vocabulary record holds only the file's SHA-256
    (``theirs`` lacks ``vocab_sha256``) was trained on the binarized training data ``data``
    (equal ``sha256``) with a vocabulary of the same size: the data's ids then come from a
    tokenizer that encodes the corpus as the checkpoint's did. Logged when so."""
    recorded = saved.get("data")
    if (theirs.get("vocab_sha256") or theirs.get("vocab_size") != vocab.get("vocab_size")
            or not isinstance(recorded, dict) or not isinstance(data, dict)
            or not recorded.get("sha256") or recorded.get("sha256") != data.get("sha256")):
        return False
    log.info("the checkpoint records its vocabulary by the SHA-256 of its spm.model file "
             "only, and the file differs (the corpus was prepared again); the training data "
             "it records is the data now, token for token, so the vocabulary is the same")
    return True


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
                        vocab: dict[str, Any] | None, data: dict[str, Any] | None = None) -> None:
    """Fail unless ``config`` continues the run the checkpoint ``saved`` belongs to: the same
    vocabulary (:func:`transformer_nmt.data.bpe.same_vocabulary`, where recorded) and the
    same settings apart from the allow-list :data:`transformer_nmt.checkpoint.RESUME_HARMLESS_KEYS`
    and the keys named in ``trainer.resume_changed``
    (:func:`transformer_nmt.checkpoint.config_differences`).

    A checkpoint that records only its ``spm.model`` file's SHA-256 (written before the
    vocabulary's own identity was) passes with another file when the binarized training data
    ``data`` (:func:`transformer_nmt.data.prepare.training_data_identity`) is the one it
    records: the tokenizer then gives every training sentence the ids it gave before (the
    same corpus prepared again).

    A change of the model (``model.heads``, dropout), the optimisation (learning rate, label
    smoothing, seed) or the data order would otherwise be resumed silently. A run with a
    batch target (``trainer.tokens_per_step``) keeps it, and may change the ``max_tokens`` and
    ``update_freq`` derived from it (another GPU count or memory); its data position carries
    over as sentences (:func:`restore_data_position`).

    Raises:
        UserError: one line naming the run, every key that differs with both values, and the
            override.
    """
    run_dir = Path(path).parent.parent
    theirs = saved.get("vocab")
    if (vocab is not None and isinstance(theirs, dict) and not same_vocabulary(theirs, vocab)
            and not _same_data_as_recorded(theirs, saved, vocab, data)):
        raise UserError(
            f"{run_dir} was trained with another vocabulary ({Path(path).name}: "
            f"{describe_vocabulary(theirs, vocab)}; the data now: "
            f"{describe_vocabulary(vocab, theirs)})"
            + (file_only_note(theirs, vocab, "resume it with the spm.model file it was "
                              "trained with")
               or "; resume it with the data it was started with")
            + ", or give a new run another run_dir= or name="
        )
    if config is None:
        return
    _check_same_target(saved.get("config"), config)
    diff = config_differences(saved.get("config"), to_plain(config))
    if diff:
        keys = ",".join(d.split(":")[0] for d in diff)
        raise UserError(
            f"{run_dir} was started with other settings ({Path(path).name}: "
            + "; ".join(diff) + "); resume it with the settings it was started with, add "
            f"trainer.resume_changed=[{keys}] to change them deliberately, or give a new run "
            "another run_dir= or name="
        )


def _check_same_target(saved_cfg: Any, config: Config) -> None:
    """A resumed run keeps its batch target (``trainer.tokens_per_step``), and so its schedule;
    the ``max_tokens`` and ``update_freq`` derived from it may change with the GPUs
    (:data:`transformer_nmt.checkpoint.REPLANNED_KEYS`).

    Raises:
        UserError: the run had a target and this one sets another or none (or the reverse),
            unless ``trainer.resume_changed`` names ``trainer.tokens_per_step``.
    """
    theirs = (((saved_cfg or {}).get("trainer") or {}).get("tokens_per_step")
              if isinstance(saved_cfg, dict) else None)
    mine = config.trainer.tokens_per_step
    changed = set(config.trainer.resume_changed or [])
    if theirs == mine or not isinstance(saved_cfg, dict) \
            or changed & {"*", "trainer.tokens_per_step"}:
        return
    if theirs is None or mine is None or float(theirs) != float(mine):
        raise UserError(
            f"the run was started with trainer.tokens_per_step={theirs}, now {mine}: a resumed "
            f"run keeps its batch (and so its schedule); resume it with "
            f"trainer.tokens_per_step={theirs}, add "
            "trainer.resume_changed=[trainer.tokens_per_step] to change it deliberately, or "
            "give a new run another run_dir= or name=")


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
    found = _load_resumable(run_dir, info)
    if found is None:
        return None
    path, saved = found
    check_training_checkpoint(saved, path)
    check_same_model(saved, s.model, path, config)
    check_same_settings(saved, path, config, getattr(s, "vocab", None), getattr(s, "data", None))
    check_same_data(saved, path, getattr(s, "data", None))
    restore_modules(saved, model=s.model, optimizer=s.optimizer, scheduler=s.scheduler,
                    scaler=s.scaler)
    state.load_state_dict(saved["train_state"])
    saved_ws = int(state.world_size)
    if restore_data_position(saved, path, s, state, info.world_size):
        set_rng_state(saved["rng"][info.rank])
        where = f"batch {state.position} of the epoch"
    else:
        log.warning(
            "%s was written with world_size=%d and max_tokens %s, now %d and %d: epoch %d "
            "continues with the sentences it has not given yet, batched anew, and the RNG "
            "streams are reseeded, so the run will not match an uninterrupted one exactly",
            path, saved_ws, (saved.get("config") or {}).get("trainer", {}).get("max_tokens"),
            info.world_size, int(s.sampler.max_tokens), state.epoch,
        )
        seed_everything(seed + info.rank + 1000 * int(state.step))
        where = f"{len(s.sampler)} batches per rank left in the epoch"
    state.world_size = info.world_size
    if info.is_main:
        log.info("resumed from %s (step %d, epoch %d, %s)", path, state.step, state.epoch, where)
    return path
