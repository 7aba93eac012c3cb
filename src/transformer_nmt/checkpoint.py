"""Checkpoints: named parts, save, load, find, keep-last-N, parameter averaging, RNG states.

A training checkpoint is one ``torch.save`` file of plain types and tensors, loadable with
``torch.load(weights_only=True)``, made of named parts, each stored once::

    {
      "model":       state_dict of the plain (unwrapped, uncompiled) Transformer,
      "optimizer":   optimizer.state_dict(),
      "scheduler":   the learning-rate schedule's state_dict(),
      "scaler":      the fp16 GradScaler's state_dict() (empty when disabled),
      "sampler":     {"epoch", "position", "seed"}: the data position, in batches per rank
                     consumed by the training loop this epoch, and "sentences" and
                     "consumed" (np.packbits of the sentences consumed this epoch, a uint8
                     tensor): the same position in any batch layout,
      "rng":         a list indexed by rank of {"torch", "cuda", "numpy", "python"} RNG states,
      "train_state": the loop's counters (transformer_nmt.train.state.TrainState.state_dict():
                     step, micro_step, tokens_seen, train_seconds, skipped_steps, best
                     validation results, world_size, ...),
      "config":      the resolved run config as a plain dict,
      "vocab_size":  size of the shared vocabulary the model was built with,
    }

A model file (``averaged.pt``, written by :func:`average_run`) holds only ``"model"``,
``"config"``, ``"vocab_size"``, ``"step"`` (of the newest input) and ``"averaged_from"``
(the input file names). :func:`checkpoint_step` reads the step of either kind.

Files live in ``runs/<experiment>/checkpoints/``: ``checkpoint_<step>.pt`` (kept: the last
``trainer.keep_last`` periodic ones and the newest, :func:`prune_checkpoints`), ``checkpoint_best.pt`` and ``averaged.pt``. Every write goes
through a temporary file and a rename.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.config import Config, ModelConfig, to_plain
from transformer_nmt.errors import MissingFileError, UserError
from transformer_nmt.fileio import atomic_path

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^checkpoint_(\d+)\.pt$")
AVERAGED_NAME = "averaged.pt"
BEST_NAME = "checkpoint_best.pt"
TRAINING_PARTS = ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "train_state")
"""The named parts of a training checkpoint (besides the ``config`` and ``vocab_size``)."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints``."""
    return Path(run_dir) / "checkpoints"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file + rename). Returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


class UnreadableCheckpointError(UserError, RuntimeError):
    """A checkpoint file that ``torch.load`` cannot read (empty, truncated, not a checkpoint);
    the message names the file and its size."""


def unreadable(path: str | Path, error: BaseException) -> UnreadableCheckpointError:
    """The one-line :class:`UnreadableCheckpointError` for ``path`` after ``error``."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    detail = " ".join(str(error).split())
    detail = detail.split(". ")[0][:160] if detail else type(error).__name__
    what = ("an empty file (0 bytes)" if size == 0
            else f"truncated or not a checkpoint ({size:,} bytes; {type(error).__name__}: {detail})"
            if size is not None else f"{type(error).__name__}: {detail}")
    return UnreadableCheckpointError(f"cannot read checkpoint {path}: {what}")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    Raises:
        FileNotFoundError: naming the path when it does not exist.
        UnreadableCheckpointError (a UserError and a RuntimeError): naming the path and its
            size when the file is not a readable checkpoint (empty, truncated, other format).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, wrong format, unsafe pickle
        raise unreadable(path, e) from e


def training_checkpoint(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    sampler: dict[str, int],
    rng: list[dict[str, Any]],
    train_state: dict[str, Any],
    config: Config | DictConfig | dict[str, Any],
    vocab_size: int,
    vocab: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The training checkpoint dict (layout in the module docstring) of these parts.

    Args:
        model: the plain Transformer (not the DDP / compiled wrapper).
        sampler: ``{"epoch", "position", "seed"}`` as counted by the training loop, with
            ``"sentences"`` and ``"consumed"`` when given.
        rng: every rank's :func:`transformer_nmt.runtime.rng_state`, indexed by rank.
        config: the run config (DictConfig, structured config or plain dict).
        vocab: the vocabulary's identity (:func:`transformer_nmt.data.bpe.vocab_identity`).
    """
    if OmegaConf.is_config(config) or not isinstance(config, dict):
        config = to_plain(config)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "sampler": {**{k: int(sampler[k]) for k in ("epoch", "position", "seed")},
                    **{k: sampler[k] for k in ("sentences", "consumed") if k in sampler}},
        "rng": rng,
        "train_state": dict(train_state),
        "config": config,
        "vocab_size": int(vocab_size),
        **({"vocab": vocab} if vocab is not None else {}),
    }


def check_training_checkpoint(ckpt: dict[str, Any], path: str | Path) -> None:
    """Raise ValueError naming ``path`` and the missing parts when ``ckpt`` cannot resume a run."""
    missing = [k for k in (*TRAINING_PARTS, "config", "vocab_size") if k not in ckpt]
    if missing:
        raise ValueError(
            f"{path} is not a training checkpoint of this version: parts {missing} are missing "
            f"(expected {list(TRAINING_PARTS)}); move it out of the run directory or start a new run"
        )


def restore_modules(
    ckpt: dict[str, Any], *, model: torch.nn.Module, optimizer: Any, scheduler: Any, scaler: Any
) -> None:
    """Load the ``model``, ``optimizer``, ``scheduler`` and ``scaler`` parts (the scaler only
    when enabled and saved non-empty)."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(ckpt["scaler"])


UNREADABLE_SUFFIX = ".unreadable"
"""Appended to the name of a step checkpoint that cannot be read when a run resumes."""


def _model_summary(model_cfg: ModelConfig | DictConfig | dict[str, Any]) -> str:
    """``d_model=512, 6+6 layers`` of a model config (DictConfig or plain dict)."""
    get = model_cfg.get if hasattr(model_cfg, "get") else lambda k, d=None: getattr(model_cfg, k, d)
    return (f"d_model={get('d_model')}, d_ff={get('d_ff')}, heads={get('heads')}, "
            f"{get('encoder_layers')}+{get('decoder_layers')} encoder+decoder layers")


def check_same_model(saved: dict[str, Any], model: torch.nn.Module, path: str | Path,
                     config: Config | None = None) -> None:
    """Fail with one line unless ``saved["model"]`` has ``model``'s parameter names and shapes.

    Raises:
        UserError: naming the run directory, the stored model's sizes (``d_model``, layers,
            vocabulary) and the config's, and how to start a new run instead.
    """
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in saved["model"].items()}
    if ours == theirs:
        return
    path = Path(path)
    run_dir = path.parent.parent
    stored = saved.get("config") or {}
    stored_model = stored.get("model") if isinstance(stored, dict) else None
    have = (_model_summary(stored_model) if stored_model else
            f"{len(theirs)} tensors") + f", vocabulary {saved.get('vocab_size')}"
    want = (_model_summary(config.model) if config is not None else
            f"{len(ours)} tensors") + f", vocabulary {getattr(model, 'vocab_size', '?')}"
    raise UserError(
        f"{run_dir} holds another model ({path.name}: {have}) than the config ({want}); "
        "to start a new run, give it another run_dir= or name=, or resume this one with "
        "the model and data settings it was started with"
    )


def checkpoint_step(ckpt: dict[str, Any]) -> int | None:
    """The optimizer step of a training checkpoint (``train_state.step``) or a model file
    (``step``); None when it has neither."""
    if "train_state" in ckpt:
        return int(ckpt["train_state"]["step"])
    step = ckpt.get("step")
    return int(step) if step is not None else None


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's ``checkpoint_<step>.pt`` files, oldest (lowest step) first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The highest-step checkpoint of the run, or None when there is none."""
    paths = step_checkpoints(run_dir)
    return paths[-1] if paths else None


def non_finite_parameters(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors of a state dict that hold NaN or inf values."""
    return [k for k, v in state.items()
            if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def latest_finite_checkpoint(run_dir: str | Path) -> Path | None:
    """The highest-step checkpoint whose parameters are all finite (read through a memory
    map), or None when there is none (unreadable files are passed over)."""
    for path in reversed(step_checkpoints(run_dir)):
        try:
            model = torch.load(path, map_location="cpu", mmap=True, weights_only=True)["model"]
        except Exception as e:  # noqa: BLE001 - an unreadable file is not a finite one
            log.warning("cannot read %s (%s); passing over it", path, e)
            continue
        if not non_finite_parameters(model):
            return path
    return None


def _step_of(path: Path) -> int:
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else -1


def prune_checkpoints(run_dir: str | Path, keep_last: int,
                      save_every_steps: int | None = None) -> list[Path]:
    """Delete old step checkpoints so that the last ``keep_last`` periodic ones remain (what
    :func:`average_run` averages); returns the deleted paths.

    With ``save_every_steps``, a checkpoint is periodic when its step is a multiple of it; the
    newest checkpoint is always kept too (the one written when training stopped, off the
    interval, which a resumed run starts from), so it never takes a periodic one's slot, and
    older off-interval ones are deleted. Without it (time- or epoch-based saves) the steps do
    not say which one was written at a stop, so ``keep_last + 1`` are kept.
    """
    paths = step_checkpoints(run_dir)
    if save_every_steps:
        periodic = [p for p in paths if _step_of(p) % int(save_every_steps) == 0]
        kept = set(periodic[max(0, len(periodic) - keep_last):]) | set(paths[-1:])
        doomed = [p for p in paths if p not in kept]
    else:
        doomed = paths[: max(0, len(paths) - keep_last - 1)]
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


RESUME_HARMLESS_KEYS: tuple[str, ...] = (
    # limits: how long the run goes
    "trainer.max_steps", "trainer.max_epochs", "trainer.max_time_minutes", "trainer.patience",
    "trainer.max_bad_steps",
    # logging, validation and saving: how often, how much
    "trainer.log_every_steps", "trainer.validate_every_steps", "trainer.validate_every_epochs",
    "trainer.valid_bleu", "trainer.valid_bleu_sentences", "trainer.save_every_steps",
    "trainer.save_every_epochs", "trainer.save_every_minutes", "trainer.keep_last",
    "trainer.no_save",
    # worker processes
    "trainer.num_workers", "data.num_workers",
    # device, precision, compilation
    "trainer.precision", "trainer.tf32", "trainer.compile",
    # batch targets: the max_tokens and update_freq they derive are compared themselves,
    # unless both runs have the same target (config_differences)
    "trainer.tokens_per_step", "trainer.tokens_per_step_tolerance", "trainer.auto_max_tokens",
    # data loading and gradient communication (not what is computed)
    "trainer.prefetch_factor", "trainer.grad_compression", "trainer.bucket_cap_mb",
    # paths and sources of files whose content is checked otherwise (the vocabulary's
    # SHA-256 is compared on resume); init_from is ignored once a run has checkpoints
    "data.root", "data.mirror", "data.url", "trainer.init_from",
    # this list's own override
    "trainer.resume_changed",
)
"""The allow-list of settings that may change when a run is resumed or its checkpoints are
averaged (:func:`config_differences`): limits, logging / validation / saving frequencies,
worker counts, device / precision / compile, and paths. Any other ``name``, ``model``,
``data`` or ``trainer`` key, including a field added later, changes the model, the
optimisation or the data order and is refused unless named in ``trainer.resume_changed``
(:class:`transformer_nmt.config.TrainerConfig`)."""


def config_differences(saved: dict | None, new: dict | None,
                       allowed: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The settings a run was started with (``saved``) that ``new`` changes, as
    ``key: saved != new``; keys in :data:`RESUME_HARMLESS_KEYS`, in ``allowed`` or in either
    config's ``trainer.resume_changed`` are left out (``"*"`` there leaves all out).

    Only ``name``, ``model``, ``data`` and ``trainer`` are compared (decoding, averaging and
    table settings are not the run's). A key the saved config lacks (a checkpoint written
    before the field existed) is not compared. With the same batch target
    (``trainer.tokens_per_step``) on both sides, the :data:`REPLANNED_KEYS` derived from it
    for the GPUs of each segment are not compared either.

    Args:
        saved, new: plain configs (:func:`transformer_nmt.config.to_plain`), e.g. a checkpoint's ``"config"``.
    """
    if not isinstance(saved, dict) or not isinstance(new, dict):
        return []
    skip = set(RESUME_HARMLESS_KEYS) | set(allowed)
    for c in (saved, new):
        skip |= set(((c.get("trainer") or {}).get("resume_changed")) or [])
    targets = [(c.get("trainer") or {}).get("tokens_per_step") for c in (saved, new)]
    if targets[0] is not None and targets[0] == targets[1]:
        skip |= set(REPLANNED_KEYS)
    if "*" in skip:
        return []
    out: list[str] = []

    def walk(a: Any, b: Any, key: str) -> None:
        if key in skip:
            return
        if isinstance(a, dict) and isinstance(b, dict) and key not in _FREE_FORM:
            for k in sorted(a, key=str):
                walk(a[k], b.get(k), f"{key}.{k}" if key else str(k))
            return
        if a != b:
            out.append(f"{key}: {a!r} != {b!r}")

    for group in ("name", "model", "data", "trainer"):
        if group in saved:
            walk(saved[group], new.get(group), group)
    return out


REPLANNED_KEYS = ("trainer.max_tokens", "trainer.update_freq")
"""What ``nmt-train`` derives from ``trainer.tokens_per_step`` for the GPUs that run (their
number and memory): a resumed segment on other GPUs may differ in them, the data position
then carried over as sentences (transformer_nmt.train.resume)."""

_FREE_FORM = ("data.custom_files",)
"""Nested dicts compared as one value."""


def _load_mmap(path: Path) -> dict[str, Any]:
    """A checkpoint read through a memory map (tensors stay on disk until touched)."""
    if not path.is_file():
        raise MissingFileError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # truncated file, wrong format, unsafe pickle
        raise unreadable(path, e) from e


def check_same_run(paths: Sequence[Path], metas: Sequence[dict[str, Any]]) -> None:
    """Fail unless the checkpoints come from one run: equal configs apart from the allow-list
    :data:`RESUME_HARMLESS_KEYS` and the keys a resumed run named in
    ``trainer.resume_changed`` (:func:`config_differences`, the rule
    resuming applies), and equal vocabulary identity (``"vocab"``), where recorded.

    Raises:
        UserError: naming the two files and the keys and values that differ.
    """
    ref = next((i for i, m in enumerate(metas) if m.get("config") is not None), None)
    vref = next((i for i, m in enumerate(metas) if m.get("vocab") is not None), None)
    for i, meta in enumerate(metas):
        if ref is not None and meta.get("config") is not None:
            diff = config_differences(metas[ref]["config"], meta["config"])
            if diff:
                raise UserError(
                    f"{paths[i]} and {paths[ref]} come from different runs ("
                    + "; ".join(diff[:4]) + (f"; {len(diff) - 4} more" if len(diff) > 4 else "")
                    + "): average checkpoints of one run only"
                )
        if vref is not None and meta.get("vocab") is not None and meta["vocab"] != metas[vref]["vocab"]:
            raise UserError(
                f"{paths[i]} and {paths[vref]} were trained with different vocabularies "
                f"({meta['vocab']} != {metas[vref]['vocab']}): average checkpoints of one run only"
            )


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Average model parameters over checkpoints (the paper, section 6.1: last 5 or 20).

    Streams: one checkpoint at a time is read through a memory map and added into a float32
    sum (as fairseq's ``average_checkpoints.py``), so memory holds about two models (the sum
    and the checkpoint being read) whatever the number of files; the mean is cast back to
    each tensor's dtype. Integer buffers are taken from the last checkpoint.

    Args:
        paths: checkpoint files, each holding a ``"model"`` state dict.

    Returns:
        The averaged state dict.

    Raises:
        UserError (a ValueError): when ``paths`` is empty, the checkpoints differ in keys
            or shapes (the message names the files and the keys or shapes that differ), or
            one holds NaN or inf parameters (named).
        MissingFileError / UserError: a file missing or unreadable (named).
    """
    if not paths:
        raise UserError("average_checkpoints: no checkpoint files given")
    paths = [Path(p) for p in paths]
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    first = paths[0]
    for path in paths:
        model = _load_mmap(path)["model"]
        bad = non_finite_parameters(model)
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise UserError(
                f"{path}: {len(bad)} parameter tensors hold NaN or inf values ({shown}); "
                "average only checkpoints from before the run went non-finite "
                "('average.checkpoints=[...]')")
        if not total:
            for k, v in model.items():
                dtypes[k], shapes[k] = v.dtype, tuple(v.shape)
                total[k] = v.to(torch.float32, copy=True) if v.is_floating_point() else v.clone()
            del model
            continue
        missing = sorted(set(total) - set(model))
        extra = sorted(set(model) - set(total))
        if missing or extra:
            raise UserError(
                f"cannot average {path} with {first}: keys missing from {path.name}: {missing[:5]}, "
                f"keys only in {path.name}: {extra[:5]}"
            )
        for k, v in model.items():
            if tuple(v.shape) != shapes[k]:
                raise UserError(
                    f"cannot average {path} with {first}: {k} has shape {tuple(v.shape)} "
                    f"in {path.name} but {shapes[k]} in {first.name}"
                )
            if v.is_floating_point():
                total[k] += v  # in place: no float32 copy of the whole checkpoint
            else:
                total[k] = v.clone()
        del model
    n = len(paths)
    out = {}
    for k in list(total):
        v = total.pop(k)
        out[k] = v.div_(n).to(dtypes[k]) if dtypes[k].is_floating_point else v
    return out


def _periodic(paths: list[Path], metas: list[dict[str, Any]],
              save_every_steps: int | None) -> tuple[list[int], str]:
    """Indices of the checkpoints saved at the regular interval, and why others were left out.

    With ``trainer.save_every_steps`` set, a checkpoint is regular when its step is a multiple
    of it (the one written when training stops at another step is not). With time-based saves
    (``save_every_minutes``), the newest checkpoint is left out when it is less than half the
    median step interval after the one before it (written when training stopped).
    """
    steps = [int(checkpoint_step(m) or 0) for m in metas]
    if save_every_steps:
        keep = [i for i, s in enumerate(steps) if s % int(save_every_steps) == 0]
        left = [paths[i].name for i in range(len(paths)) if i not in keep]
        why = (f"left out {', '.join(left)}: step not a multiple of "
               f"trainer.save_every_steps={save_every_steps}") if left else ""
        return keep, why
    keep = list(range(len(paths)))
    if len(steps) >= 3:
        gaps = sorted(b - a for a, b in itertools.pairwise(steps[:-1]))
        median = gaps[len(gaps) // 2]
        last_gap = steps[-1] - steps[-2]
        if median > 0 and last_gap < median / 2:
            keep.pop()
            return keep, (f"left out {paths[-1].name}: {last_gap} steps after the one before it "
                          f"(the others are about {median} apart), written when training stopped")
    return keep, ""


def average_run(cfg: Config) -> Path:
    """Average checkpoints into ``<run_dir>/checkpoints/averaged.pt``.

    Which files: ``cfg.average.checkpoints`` when given, else the last
    ``cfg.average.last`` regularly spaced step checkpoints of ``cfg.run_dir``
    (:func:`_periodic`: the checkpoint written when training stopped is left out; fewer,
    with a warning, when the run has fewer). The checkpoints must come from one run
    (:func:`check_same_run`). The output holds ``"model"`` (the mean, streamed by
    :func:`average_checkpoints`), ``"config"``, ``"vocab_size"``, ``"vocab"`` and ``"step"``
    of the newest input (highest step), ``"averaged_from"`` (the input file names, oldest
    first) and ``"averaged_steps"``, so translate and evaluate load it like any checkpoint.

    Returns:
        The path written.

    Raises:
        UserError: ``average.last`` below 1; checkpoints of different runs or with
            different keys or shapes (naming them); MissingFileError (a FileNotFoundError):
            no checkpoint to average (names the folder) or a named file missing.
    """
    folder = checkpoint_dir(cfg.run_dir)
    note = ""
    if cfg.average.checkpoints:
        paths = [Path(p) for p in cfg.average.checkpoints]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise MissingFileError(f"average.checkpoints: not found: {missing}")
        metas = [_load_mmap(p) for p in paths]
    else:
        n = int(cfg.average.last)
        if n < 1:
            raise UserError(f"average.last must be at least 1, got {n}")
        available = step_checkpoints(cfg.run_dir)
        if not available:
            raise MissingFileError(f"no checkpoint_<step>.pt in {folder} to average")
        metas = [_load_mmap(p) for p in available]
        stored = metas[-1].get("config") or {}
        save_every = (stored.get("trainer") or {}).get("save_every_steps",
                                                       cfg.trainer.save_every_steps)
        keep, note = _periodic(available, metas, save_every)
        if len(keep) < n:
            log.warning("average.last=%d but %s holds only %d regularly spaced "
                        "checkpoints; averaging those", n, folder, len(keep))
        keep = keep[-n:]
        paths = [available[i] for i in keep]
        metas = [metas[i] for i in keep]
    check_same_run(paths, metas)
    steps = [checkpoint_step(m) for m in metas]
    newest = max(range(len(paths)), key=lambda i: (int(steps[i] or 0), i))
    head = {k: metas[newest].get(k) for k in ("config", "vocab_size", "vocab")}
    head["step"] = steps[newest]
    del metas  # drop the memory maps before streaming
    state = {
        "model": average_checkpoints(paths),
        **{k: v for k, v in head.items() if v is not None or k == "step"},
        "averaged_from": [p.name for p in paths],
        "averaged_steps": steps,
    }
    out = folder / AVERAGED_NAME
    save_checkpoint(out, state)
    if note:
        log.info("%s", note)
    log.info("averaged %d checkpoints (%s; steps %s) into %s", len(paths),
             ", ".join(p.name for p in paths), steps, out)
    return out


def config_of(checkpoint: dict[str, Any]) -> DictConfig:
    """The resolved run config stored in a checkpoint, as a DictConfig."""
    return OmegaConf.create(checkpoint["config"])


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """Build the Transformer described by a checkpoint (or averaged model file) and load it.

    Returns:
        ``(model, cfg)``: the model in eval mode on ``device`` and the run's config.

    Raises:
        FileNotFoundError / RuntimeError: see :func:`load_checkpoint`.
    """
    from transformer_nmt.model.transformer import Transformer

    ckpt = load_checkpoint(path)
    cfg = config_of(ckpt)
    model = Transformer(cfg.model, vocab_size=int(ckpt["vocab_size"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), cfg



def load_initial_weights(model: Any, path: str | Path, vocab: dict | None = None) -> None:
    """``trainer.init_from``: copy a model file's weights into a freshly built model.

    For fine-tuning from an imported (or any) model; optimizer, schedule and counters start
    from scratch. The run's model config must describe the same architecture.

    Args:
        vocab: the run's vocabulary identity (``{"spm_sha256", "vocab_size"}``); compared
            with the one the model file records (a file without one gets a warning).

    Raises:
        UserError: another vocabulary (size, or identity where both are known), or
            parameters missing, extra or of another shape (named).
    """
    ckpt = load_checkpoint(path)
    if int(ckpt["vocab_size"]) != model.vocab_size:
        raise UserError(f"trainer.init_from={path}: vocabulary of {ckpt['vocab_size']} pieces, "
                        f"the run's model has {model.vocab_size}")
    saved = ckpt.get("vocab")
    if vocab is not None and saved is None:
        log.warning("trainer.init_from=%s records no vocabulary identity: cannot check that "
                    "it was trained with this run's SentencePiece model", path)
    elif vocab is not None and {k: saved.get(k) for k in vocab} != dict(vocab):
        raise UserError(
            f"trainer.init_from={path} was trained with another vocabulary than this run's "
            f"(its spm sha256 {str(saved.get('spm_sha256'))[:12]}, the run's "
            f"{str(vocab.get('spm_sha256'))[:12]}); use the data= settings of that model")
    own = model.state_dict()
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in ckpt["model"].items()
           if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(ckpt["model"]))
    extra = sorted(set(ckpt["model"]) - set(own))
    if bad or missing or extra:
        raise UserError(f"trainer.init_from={path} does not fit the run's model config: "
                        f"shapes {bad[:3]}, missing {missing[:3]}, extra {extra[:3]}")
    model.load_state_dict(ckpt["model"])
