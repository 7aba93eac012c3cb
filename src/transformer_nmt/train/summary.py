"""The run summary: ``<run_dir>/train_summary.json`` (steps, tokens, real tokens per step,
training time and hours, FLOPs, validation results, the stop reason), read by
``nmt-evaluate`` for the training cost in ``results.json``."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt.fileio import write_json

if TYPE_CHECKING:  # the record below is read by nmt-table, which does not load torch
    from transformer_nmt.config import Config
    from transformer_nmt.train import distributed
    from transformer_nmt.train.setup import Setup
    from transformer_nmt.train.state import TrainState

log = logging.getLogger("transformer_nmt.train.loop")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class TrainSummary:
    """A train_summary.json as its readers use it (``nmt-evaluate``'s training cost, the
    tables' recipe checks and Table 3's perplexity); the whole file stays in ``raw``."""

    steps: int | None
    """Optimizer steps trained (None: not recorded)."""
    stopped_by: str | None
    valid_ppl: float | None
    """Validation perplexity at the end of the run."""
    real_tokens_per_step: dict[str, float]
    """Mean real ``src`` and ``tgt`` tokens per step ({} when not recorded)."""
    gpu_hours: float | None
    flops: float | None
    train_seconds: float | None
    world_size: int | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, obj: Any) -> TrainSummary:
        """The record of a train_summary.json's content.

        Raises:
            ValueError: what is not as :func:`write_summary` writes it (the field and value).
        """
        if not isinstance(obj, dict):
            raise ValueError(f"a JSON {type(obj).__name__}, not an object")  # noqa: TRY004
        steps = obj.get("steps")
        if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)):
            raise ValueError(f"steps is {steps!r}, not a whole number")
        valid = obj.get("valid")
        if valid is not None and not isinstance(valid, dict):
            raise ValueError(f"valid is {valid!r}, not an object")
        ppl = (valid or {}).get("ppl")
        if ppl is not None and not _number(ppl):
            raise ValueError(f"valid.ppl is {ppl!r}, not a number")
        per_step = obj.get("real_tokens_per_step") or {}
        if not isinstance(per_step, dict) or not all(
                _number(per_step.get(k)) for k in per_step if k in ("src", "tgt")):
            raise ValueError(f"real_tokens_per_step is {per_step!r}, not src and tgt numbers")
        numbers = {}
        for key in ("gpu_hours", "flops", "train_seconds", "world_size"):
            value = obj.get(key)
            if value is not None and not _number(value):
                raise ValueError(f"{key} is {value!r}, not a number")
            numbers[key] = value
        stopped_by = obj.get("stopped_by")
        return cls(steps=steps, stopped_by=None if stopped_by is None else str(stopped_by),
                   valid_ppl=ppl, real_tokens_per_step=dict(per_step), raw=obj, **numbers)


def _previous_summary(run_dir: Path) -> dict[str, Any]:
    """``<run_dir>/train_summary.json`` as written before, or {} when absent or unreadable."""
    try:
        return json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _real_tokens_per_step(state: TrainState) -> dict[str, float]:
    """Mean real (non-pad, eos included) source and target tokens per optimizer step of this
    run, over all ranks, skipped steps included."""
    steps = max(state.step + state.skipped_steps, 1)
    return {"src": state.src_tokens_seen / steps, "tgt": state.tokens_seen / steps}


def write_summary(cfg: Config, s: Setup, state: TrainState, info: distributed.DistInfo,
                  stopped_by: str | None, last_valid: dict[str, float],
                  resumed_from: Path | None, already_finished: bool = False,
                  last_finite_checkpoint: Path | None = None) -> dict[str, Any]:
    """The run summary; rank 0 writes it to ``<run_dir>/train_summary.json``.

    Every rank calls it (it ends in a barrier). Hours are wall-clock training seconds x world
    size, as GPU- or CPU-hours by the device (device-hours: a process with 2 threads for an
    hour is 1); ``cpu_seconds`` is rank 0's CPU time in the loop, every thread, user + system;
    ``flops`` follows :mod:`transformer_nmt.model.flops`.

    ``already_finished``: the run was resumed after it had finished and did nothing
    (``"already_finished": true``); the previous summary's validation results and time are
    kept.

    ``stopped_by="divergence"``: the summary also names ``last_finite_checkpoint``, the newest
    checkpoint whose parameters are all finite (null when there is none).
    """
    from transformer_nmt import checkpoint as ckpt_lib
    from transformer_nmt.model.flops import FORMULA as FLOPS_FORMULA
    from transformer_nmt.model.flops import training_flops
    from transformer_nmt.runtime import device_name
    from transformer_nmt.train import distributed

    run_dir = Path(cfg.run_dir)
    on_gpu = s.device.type == "cuda"
    hours = state.train_seconds / 3600 * info.world_size
    counts = state.token_counts()
    flops = training_flops(cfg.model, s.vocab_size, counts)
    summary = {
        "name": cfg.name,
        "stopped_by": stopped_by,
        "steps": state.step,
        "micro_steps": state.micro_step,
        "epochs": state.epoch_progress(s.sampler.num_batches, info.world_size),
        "tokens_seen": state.tokens_seen,
        "src_tokens_seen": state.src_tokens_seen,
        "token_counts": dataclasses.asdict(counts),
        "skipped_steps": state.skipped_steps,
        "train_seconds": state.train_seconds,
        "cpu_seconds": state.cpu_seconds,
        "world_size": info.world_size,
        "device": device_name(s.device),
        "precision": s.precision,
        "gpu_hours": hours if on_gpu else 0.0,
        "cpu_hours": 0.0 if on_gpu else hours,
        "flops": flops,
        "flops_formula": FLOPS_FORMULA,
        "parameters": s.model.num_parameters(),
        "vocab_size": s.vocab_size,
        "max_tokens": cfg.trainer.max_tokens,
        "real_tokens_per_step": _real_tokens_per_step(state),
        "update_freq": cfg.trainer.update_freq,
        "valid": dict(last_valid),
        "best_valid_loss": state.best_valid_loss,
        "best_valid_bleu": state.best_valid_bleu,
        "last_checkpoint": str(ckpt_lib.latest_checkpoint(run_dir)) if info.is_main else None,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "already_finished": already_finished,
    }
    if stopped_by == "divergence":
        summary["last_finite_checkpoint"] = (str(last_finite_checkpoint)
                                             if last_finite_checkpoint else None)
    previous = _previous_summary(run_dir) if already_finished and info.is_main else {}
    if previous.get("steps") == state.step:  # the finished run's own figures, unchanged
        summary.update({k: previous[k] for k in ("valid", "train_seconds", "cpu_seconds",
                                                   "gpu_hours", "cpu_hours") if k in previous})
    if info.is_main:
        write_json(run_dir / "train_summary.json", summary)  # strict: a NaN loss is null
        per_step = summary["real_tokens_per_step"]
        log.info("finished (%s): %d steps, %s target tokens (%s source and %s target per "
                 "step), %.1f %s-hours (%.2f hours of CPU time), %.3g FLOPs", stopped_by,
                 state.step, f"{state.tokens_seen:,}", f"{per_step['src']:,.0f}",
                 f"{per_step['tgt']:,.0f}", hours, "GPU" if on_gpu else "CPU",
                 state.cpu_seconds / 3600, flops)
    distributed.barrier()
    return summary
