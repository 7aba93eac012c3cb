"""Save, load, find and prune checkpoints; the run config a checkpoint holds (the layout of
a checkpoint file: :mod:`transformer_nmt.checkpoint`)."""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from transformer_nmt.checkpoint.read import (
    read_checkpoint,
    unreadable_checkpoint,
)
from transformer_nmt.config import Config, ModelConfig, to_plain
from transformer_nmt.data.bpe import describe_vocabulary, file_only_note, same_vocabulary
from transformer_nmt.errors import UnreadableCheckpointError, UserError
from transformer_nmt.fileio import atomic_path, remove_dead_temps
from transformer_nmt.model.transformer import Transformer

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^checkpoint_(\d+)\.pt$")
AVERAGED_NAME = "averaged.pt"
BEST_NAME = "checkpoint_best.pt"
TRAINING_PARTS = ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "train_state")
"""The named parts of a training checkpoint (besides the ``config`` and ``vocab_size``)."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints``."""
    return Path(run_dir) / "checkpoints"


TEMP_PATTERN = ".*.pt.*.tmp"
"""The temporary files of checkpoint and model writes (``.checkpoint_<step>.pt.<random>.tmp``,
``.averaged.pt.<random>.tmp``: :func:`transformer_nmt.fileio.atomic_path`)."""


def remove_killed_saves(folder: Path) -> list[Path]:
    """Delete the temporary files (:data:`TEMP_PATTERN`) that a killed checkpoint save or
    ``nmt-average`` left in ``folder``, and log them; a file that a live writer holds locked is
    kept (:func:`transformer_nmt.fileio.remove_dead_temps`). Returns the deleted paths."""
    sizes = {}
    for p in folder.glob(TEMP_PATTERN) if folder.is_dir() else ():
        with contextlib.suppress(OSError):
            sizes[p] = p.stat().st_size
    removed = remove_dead_temps(folder, TEMP_PATTERN)
    if removed:
        log.info("removed %d temporary files (%.1f MB) of a killed save from %s: %s",
                 len(removed), sum(sizes.get(p, 0) for p in removed) / 1e6, folder,
                 ", ".join(p.name for p in removed))
    return removed


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file + rename). Returns ``path``.

    First removes the temporary files that a killed save or ``nmt-average`` left in the folder
    (:func:`remove_killed_saves`).

    Raises:
        WriteError: a full device, a quota, the file-size limit or a read-only file system
            (:func:`transformer_nmt.fileio.write_error`); ``path`` is left as it was.
    """
    path = Path(path)
    remove_killed_saves(path.parent)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def unreadable(path: str | Path, error: BaseException) -> UnreadableCheckpointError:
    """The one-line :class:`UnreadableCheckpointError` for ``path`` after ``error``
    (:func:`transformer_nmt.checkpoint.read.unreadable_checkpoint`)."""
    return unreadable_checkpoint(path, error)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``
    (:func:`transformer_nmt.checkpoint.read.read_checkpoint`, the one reader of checkpoint files).

    Raises:
        MissingFileError (a FileNotFoundError): naming the path when it does not exist.
        UnreadableCheckpointError (a UserError and a RuntimeError): naming the path and its
            size when the file is not a readable checkpoint (empty, truncated, other format,
            Python objects that weights_only refuses).
    """
    return read_checkpoint(path, map_location=map_location)


def training_checkpoint(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    sampler: dict[str, int],
    rng: list[dict[str, Any]],
    train_state: dict[str, Any],
    config: Config | dict[str, Any],
    vocab_size: int,
    vocab: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The training checkpoint dict (layout in the module docstring) of these parts.

    Args:
        model: the plain Transformer (not the DDP / compiled wrapper).
        sampler: ``{"epoch", "position", "seed"}`` as counted by the training loop, with
            ``"sentences"`` and ``"consumed"`` when given.
        rng: every rank's :func:`transformer_nmt.runtime.rng_state`, indexed by rank.
        config: the run config (typed or its plain dict).
        vocab: the vocabulary's identity (:func:`transformer_nmt.data.bpe.vocab_identity`).
        data: the training data's identity (``data.prepare.training_data_identity``).
    """
    if not isinstance(config, dict):
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
        **({"data": data} if data is not None else {}),
    }


def check_training_checkpoint(ckpt: dict[str, Any], path: str | Path) -> None:
    """Raise ValueError naming ``path`` and the missing parts when ``ckpt`` cannot resume a run."""
    missing = [k for k in (*TRAINING_PARTS, "config", "vocab_size") if k not in ckpt]
    if missing:
        raise ValueError(
            f"{path} is not a training checkpoint of this version: parts {missing} are missing "
            f"(expected {list(TRAINING_PARTS)}); move it out of the run directory "
            "or start a new run"
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


def _model_summary(model_cfg: ModelConfig | dict[str, Any]) -> str:
    """``d_model=512, 6+6 layers`` of a model config (typed or a checkpoint's plain dict)."""
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
    """Names of the floating-point tensors of a state dict that hold NaN or inf values (other
    entries, such as a quantized layer's packed weights, are passed over)."""
    return [k for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not bool(torch.isfinite(v).all())]


def latest_finite_checkpoint(run_dir: str | Path) -> Path | None:
    """The highest-step checkpoint whose parameters are all finite (read through a memory
    map), or None when there is none (unreadable files are passed over)."""
    for path in reversed(step_checkpoints(run_dir)):
        try:
            model = read_checkpoint(path, mmap=True)["model"]
        except Exception as e:  # noqa: BLE001 - an unreadable file is not a finite one
            log.warning("cannot read %s (%s); passing over it", path, e)
            continue
        if not non_finite_parameters(model):
            return path
    return None


def _step_of(path: Path) -> int:
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else -1


def recorded_save_every_steps(ckpt: dict[str, Any]) -> int | None:
    """The ``trainer.save_every_steps`` a checkpoint was written under (its stored config), or
    None (time- or epoch-based saves, or no config)."""
    trainer = (ckpt.get("config") or {}).get("trainer") or {}
    return int(trainer["save_every_steps"]) if trainer.get("save_every_steps") else None


_SPACINGS: dict[tuple[str, int, int], int | None] = {}  # (path, size, mtime_ns) -> spacing


def _spacing_of(path: Path) -> int | None:
    """:func:`recorded_save_every_steps` of a file (read once per content); None if unreadable."""
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _SPACINGS:
            _SPACINGS[key] = recorded_save_every_steps(read_checkpoint(path, mmap=True))
        return _SPACINGS[key]
    except Exception:  # noqa: BLE001 - an unreadable file has no recorded spacing
        return None


def prune_checkpoints(run_dir: str | Path, keep_last: int,
                      save_every_steps: int | None = None) -> list[Path]:
    """Delete old step checkpoints so that the last ``keep_last`` periodic ones remain (what
    :func:`average_run` averages); returns the deleted paths, each named in the log.

    With ``save_every_steps``, a checkpoint is periodic when its step is a multiple of it or
    of the ``trainer.save_every_steps`` it was written under (a run resumed with another
    spacing keeps those of the earlier one); the newest is always kept too (written when
    training stopped, off the interval, a resumed run starts from it) without taking a
    periodic one's slot, and older off-interval ones are deleted. Without it (time- or
    epoch-based saves) a stop checkpoint cannot be told apart, so ``keep_last + 1`` are kept.
    """
    paths = step_checkpoints(run_dir)
    periodic = paths
    if save_every_steps:
        every = int(save_every_steps)
        # the newest was just written under ``every``; older ones may predate a change of it
        spacing = {p: every if _step_of(p) % every == 0 or p == paths[-1] else _spacing_of(p)
                   for p in paths}
        periodic = [p for p in paths if spacing[p] and _step_of(p) % spacing[p] == 0]
        kept = set(periodic[max(0, len(periodic) - keep_last):]) | set(paths[-1:])
    else:
        kept = set(paths[max(0, len(paths) - keep_last - 1):])
    doomed = [p for p in paths if p not in kept]
    for p in doomed:
        p.unlink(missing_ok=True)
        log.info("removed %s: %s", p.name,
                 f"older than the last {keep_last} periodic checkpoints (trainer.keep_last)"
                 if p in periodic else "written when training stopped, off its interval")
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
    "trainer.precision", "trainer.tf32", "trainer.compile", "trainer.cuda_graphs",
    # batch targets: the max_tokens and update_freq they derive are compared themselves,
    # unless both runs have the same target (config_differences)
    "trainer.tokens_per_step", "trainer.tokens_per_step_tolerance", "trainer.auto_max_tokens",
    # data loading and gradient communication (not what is computed)
    "trainer.prefetch_factor", "trainer.grad_compression", "trainer.bucket_cap_mb",
    "trainer.sdpa_backends",
    # the dry run's own sizes (it never trains the run it bills)
    "trainer.dry_run_steps", "trainer.dry_run_warmup_steps",
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
    ``trainer.max_steps`` is compared when either side's ``trainer.lr_scheduler`` decays to
    0 there (``cosine``, ``linear``).

    Only ``name``, ``model``, ``data`` and ``trainer`` are compared (decoding, averaging and
    table settings are not the run's). A key the saved config lacks (a checkpoint written
    before the field existed) is not compared. With the same batch target
    (``trainer.tokens_per_step``) on both sides, the :data:`REPLANNED_KEYS` derived from it
    for the GPUs of each segment are not compared either.

    Args:
        saved, new: plain configs (:func:`transformer_nmt.config.to_plain`), e.g. a checkpoint's
            ``"config"``.
    """
    if not isinstance(saved, dict) or not isinstance(new, dict):
        return []
    skip = set(RESUME_HARMLESS_KEYS)
    if any((c.get("trainer") or {}).get("lr_scheduler", "inverse_sqrt") != "inverse_sqrt"
           for c in (saved, new)):
        skip.discard("trainer.max_steps")  # a decaying schedule ends at max_steps
    skip |= set(allowed)
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


def config_of(checkpoint: dict[str, Any]) -> Config:
    """The resolved run config stored in a checkpoint, as the typed :class:`Config`.

    The stored plain dict is merged onto the schema: choices become their Enums, a group or
    field the checkpoint lacks takes its default, and a key the schema no longer declares
    (a checkpoint written by an earlier version) is left out.

    Raises:
        omegaconf errors: a stored value of the wrong type, a mandatory value missing.
    """
    stored = _known_keys(checkpoint["config"], Config)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), stored))


def _known_keys(node: dict[str, Any], schema: type) -> dict[str, Any]:
    """``node`` without the keys that no field of the dataclass ``schema`` (or of the
    dataclasses of its fields, recursively) declares; free-form fields are kept whole."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(schema)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(schema):
        if f.name not in node:
            continue
        value, kind = node[f.name], hints[f.name]
        out[f.name] = (_known_keys(value, kind) if dataclasses.is_dataclass(kind)
                       and isinstance(value, dict) else value)
    return out


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """Build the Transformer described by a checkpoint (or averaged model file) and load it.

    Returns:
        ``(model, cfg)``: the model in eval mode on ``device`` and the run's config.

    Raises:
        FileNotFoundError / RuntimeError: see :func:`load_checkpoint`.
    """
    return model_from(load_checkpoint(path), device)


def model_from(ckpt: dict[str, Any], device: str | torch.device = "cpu",
               state: dict[str, torch.Tensor] | None = None):
    """Build the Transformer that a loaded checkpoint's ``config`` and ``vocab_size`` describe
    and load ``state`` into it (default: the checkpoint's own ``"model"``).

    Returns:
        ``(model, cfg)``: the model in eval mode on ``device`` and the run's config.
    """
    cfg = config_of(ckpt)
    model = Transformer(cfg.model, vocab_size=int(ckpt["vocab_size"]))
    model.load_state_dict(ckpt["model"] if state is None else state)
    return model.to(device).eval(), cfg


def load_initial_weights(model: Any, path: str | Path, vocab: dict | None = None) -> None:
    """``trainer.init_from``: copy a model file's weights into a freshly built model.

    For fine-tuning from an imported (or any) model; optimizer, schedule and counters start
    from scratch. The run's model config must describe the same architecture.

    Args:
        vocab: the run's vocabulary identity (:func:`transformer_nmt.data.bpe.vocab_identity`);
            compared with the one the model file records
            (:func:`transformer_nmt.data.bpe.same_vocabulary`; a file without one gets a
            warning).

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
    elif vocab is not None and not same_vocabulary(saved, vocab):
        raise UserError(
            f"trainer.init_from={path} was trained with another vocabulary than this run's "
            f"(its {describe_vocabulary(saved, vocab)}, the run's "
            f"{describe_vocabulary(vocab, saved)})"
            + (file_only_note(saved, vocab) or "; use the data= settings of that model"))
    own = model.state_dict()
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in ckpt["model"].items()
           if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(ckpt["model"]))
    extra = sorted(set(ckpt["model"]) - set(own))
    if bad or missing or extra:
        raise UserError(f"trainer.init_from={path} does not fit the run's model config: "
                        f"shapes {bad[:3]}, missing {missing[:3]}, extra {extra[:3]}")
    model.load_state_dict(ckpt["model"])
