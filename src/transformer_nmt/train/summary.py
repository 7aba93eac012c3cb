"""The run summary's figures, computed at the end of training: steps, tokens, real tokens
per step, training time and hours, FLOPs, validation results, the stop reason. The file
(``train_summary.json``) is read and written by :mod:`transformer_nmt.run.summary`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt import checkpoint as ckpt_lib
from transformer_nmt.errors import UserError
from transformer_nmt.model.flops import FORMULA as FLOPS_FORMULA
from transformer_nmt.model.flops import training_flops
from transformer_nmt.run.summary import read_train_summary, write_train_summary
from transformer_nmt.runtime import device_name
from transformer_nmt.train import distributed

if TYPE_CHECKING:
    from transformer_nmt.config import Config
    from transformer_nmt.train.setup import Setup
    from transformer_nmt.train.state import TrainState

log = logging.getLogger(__name__)


def _previous_summary(run_dir: Path) -> dict[str, Any]:
    """The run's train_summary.json as written before, or {} when absent or unreadable."""
    try:
        return read_train_summary(run_dir) or {}
    except UserError:
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
        "epochs": state.epoch_progress(s.sampler),
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
        write_train_summary(run_dir, summary)
        per_step = summary["real_tokens_per_step"]
        log.info("finished (%s): %d steps, %s target tokens (%s source and %s target per "
                 "step), %.1f %s-hours (%.2f hours of CPU time), %.3g FLOPs", stopped_by,
                 state.step, f"{state.tokens_seen:,}", f"{per_step['src']:,.0f}",
                 f"{per_step['tgt']:,.0f}", hours, "GPU" if on_gpu else "CPU",
                 state.cpu_seconds / 3600, flops)
    distributed.barrier()
    return summary
