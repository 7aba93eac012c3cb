"""Parameter averaging of a run's checkpoints (section 6.1: the last 5 checkpoints for base, 20 for
big), with the checks that every input comes from one run and is a regularly spaced checkpoint."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.checkpoint.core import (
    AVERAGED_NAME,
    checkpoint_dir,
    config_differences,
    model_from,
    non_finite_parameters,
    recorded_save_every_steps,
    remove_killed_saves,
    save_checkpoint,
    step_checkpoints,
)
from transformer_nmt.checkpoint.read import checkpoint_step, read_checkpoint
from transformer_nmt.config import Config
from transformer_nmt.data.bpe import same_vocabulary
from transformer_nmt.errors import MissingFileError, UserError

log = logging.getLogger(__name__)


def check_same_run(paths: Sequence[Path], metas: Sequence[dict[str, Any]]) -> None:
    """Fail unless the checkpoints come from one run: equal configs apart from the allow-list
    :data:`RESUME_HARMLESS_KEYS` and the keys a resumed run named in
    ``trainer.resume_changed`` (:func:`config_differences`, the rule
    resuming applies), and the same vocabulary
    (:func:`transformer_nmt.data.bpe.same_vocabulary`), where recorded.

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
        if (vref is not None and meta.get("vocab") is not None
                and not same_vocabulary(meta["vocab"], metas[vref]["vocab"])):
            raise UserError(
                f"{paths[i]} and {paths[vref]} were trained with different vocabularies "
                f"({meta['vocab']} != {metas[vref]['vocab']}): average checkpoints of one run only"
            )


def check_no_average(paths: Sequence[Path], metas: Sequence[dict[str, Any]]) -> None:
    """Refuse to average a model file that is itself an average (it records
    ``averaged_from``) together with other files: the mean would weigh its checkpoints
    unequally.

    Raises:
        UserError: naming the average, the checkpoints it holds and what to list instead.
    """
    if len(paths) < 2:
        return
    for path, meta in zip(paths, metas):
        inner = meta.get("averaged_from")
        if inner is not None:
            raise UserError(
                f"average.checkpoints: {path} is itself an average of {len(inner)} checkpoints "
                f"({', '.join(map(str, inner))}); averaging it with other files weighs those "
                "unequally: list the step checkpoints themselves")


def average_model(paths: Sequence[str | Path], device: str | torch.device = "cpu"):
    """The model whose parameters are the average of ``paths`` (:func:`average_checkpoints`),
    built from the newest file's config, in eval mode on ``device``.

    Returns:
        ``(model, cfg)`` as :func:`transformer_nmt.checkpoint.core.load_model`.

    Raises:
        as :func:`average_checkpoints`.
    """
    state = average_checkpoints(paths)
    return model_from(read_checkpoint(paths[-1], mmap=True), device, state)


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
        model = read_checkpoint(path, mmap=True)["model"]
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
            v = None  # the loop variable would keep this file's memory map alive
            del model
            continue
        missing = sorted(set(total) - set(model))
        extra = sorted(set(model) - set(total))
        if missing or extra:
            raise UserError(
                f"cannot average {path} with {first}: keys missing from {path.name}: "
                f"{missing[:5]}, "
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
        v = None  # the loop variable would keep this file's memory map alive
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
    of the spacing it was written under (its stored ``trainer.save_every_steps``, else
    ``save_every_steps``): the one written when training stops at another step is not, and
    a run resumed with another spacing keeps the regular checkpoints of the earlier one.
    With time-based saves (``save_every_minutes``), the newest checkpoint is left out when
    it is less than half the median step interval after the one before it (written when
    training stopped).
    """
    steps = [int(checkpoint_step(m) or 0) for m in metas]
    if save_every_steps:
        spacings = [recorded_save_every_steps(m) or int(save_every_steps) for m in metas]
        keep = [i for i, s in enumerate(steps) if s % spacings[i] == 0]
        left = [i for i in range(len(paths)) if i not in keep]
        every = "/".join(dict.fromkeys(str(spacings[i]) for i in left))
        return keep, (f"left out {', '.join(paths[i].name for i in left)}: step not a multiple "
                      f"of trainer.save_every_steps={every}") if left else ""
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
    (:func:`_periodic`: the stop checkpoint is left out unless it is the only one; fewer,
    with a warning, when the run has fewer). The checkpoints must come from one run
    (:func:`check_same_run`). The output holds ``"model"`` (the mean, streamed by
    :func:`average_checkpoints`), ``"config"``, ``"vocab_size"``, ``"vocab"`` and ``"step"``
    of the newest input (highest step), ``"averaged_from"`` (the input file names, oldest
    first) and ``"averaged_steps"``, so translate and evaluate load it like any checkpoint.

    Returns:
        The path written.

    Temporary files of a killed save or average in the folder are removed first
    (:func:`remove_killed_saves`).

    Raises:
        UserError: ``average.last`` below 1; checkpoints of different runs or with
            different keys or shapes (naming them); an average listed with other files
            (:func:`check_no_average`); MissingFileError (a FileNotFoundError):
            no checkpoint to average (names the folder) or a named file missing.
    """
    folder = checkpoint_dir(cfg.run_dir)
    remove_killed_saves(folder)  # before reading: their space may be needed for the output
    note = ""
    if cfg.average.checkpoints:
        paths = [Path(p) for p in cfg.average.checkpoints]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise MissingFileError(f"average.checkpoints: not found: {missing}")
        metas = [read_checkpoint(p, mmap=True) for p in paths]
    else:
        n = cfg.average.last
        if n < 1:
            raise UserError(f"average.last must be at least 1, got {n}")
        available = step_checkpoints(cfg.run_dir)
        if not available:
            raise MissingFileError(f"no checkpoint_<step>.pt in {folder} to average")
        metas = [read_checkpoint(p, mmap=True) for p in available]
        stored = (metas[-1].get("config") or {}).get("trainer") or {}
        keep, note = _periodic(available, metas,
                               stored.get("save_every_steps", cfg.trainer.save_every_steps))
        if not keep:  # stopped before the first regular save: the stop checkpoint is the run
            keep, note = [len(available) - 1], ""
            log.warning("%s holds no regularly spaced checkpoint (the run stopped before its "
                        "first regular save): averaging %s alone", folder, available[-1].name)
        elif len(keep) < n:
            log.warning("average.last=%d but %s holds only %d regularly spaced "
                        "checkpoints; averaging those", n, folder, len(keep))
        paths, metas = [available[i] for i in keep[-n:]], [metas[i] for i in keep[-n:]]
        if len({recorded_save_every_steps(m) for m in metas}) > 1:
            log.info("averaging checkpoints saved at different trainer.save_every_steps (%s)",
                     ", ".join(f"{p.name}: {recorded_save_every_steps(m)}"
                               for p, m in zip(paths, metas)))
    check_same_run(paths, metas)
    check_no_average(paths, metas)
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
