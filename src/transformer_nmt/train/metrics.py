"""Training metrics: ``<run_dir>/metrics.jsonl`` and TensorBoard scalars (``<run_dir>/tb``).

Each line of ``metrics.jsonl`` is ``{"split": "train" | "valid", "step", "time" (Unix
seconds), ...values}``. Train lines cover the steps since the previous train line:
``loss``, ``nll_loss`` (nats per target token), ``ppl``, ``lr``, ``grad_norm`` (of the last
successful step), ``tokens_per_s``, ``seconds_per_step``, ``skipped_steps``, ``epoch``
(fractional), ``tokens_seen`` and on GPU ``gpu_mem_gib``. Valid lines hold the results of
:mod:`transformer_nmt.train.validation`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.fileio import finite_json

log = logging.getLogger(__name__)


class MetricsLog:
    """TensorBoard scalars and ``metrics.jsonl`` lines (rank 0 only; no-ops elsewhere)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.writer = None
        self.jsonl = run_dir / "metrics.jsonl"
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def write(self, split: str, step: int, values: dict[str, Any]) -> None:
        """Append one line and the finite numbers as ``<split>/<key>`` scalars."""
        if not self.enabled:
            return
        for key, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        line = {"split": split, "step": step, "time": time.time(), **values}
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(finite_json(line), allow_nan=False) + "\n")  # NaN -> null

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


@dataclass
class Window:
    """Sums over the steps since the last train line (loss sums in nats, over all ranks)."""

    loss: float = 0.0
    nll: float = 0.0
    ntokens: int = 0
    steps: int = 0
    """Steps taken, skipped ones included."""
    grad_norm: float = float("nan")
    """Gradient norm of the last successful step (carried over to the next window)."""
    start: float = field(default_factory=time.perf_counter)

    def record(self, *, lr: float, skipped_steps: int, epoch: float, tokens_seen: int,
               device: torch.device) -> dict[str, Any]:
        """The train line's values (module docstring)."""
        elapsed = time.perf_counter() - self.start
        ntok = max(self.ntokens, 1)
        nll = self.nll / ntok
        record = {
            "loss": self.loss / ntok,
            "nll_loss": nll,
            "ppl": math.exp(min(nll, 100.0)),
            "lr": lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.ntokens / max(elapsed, 1e-9),
            "seconds_per_step": elapsed / self.steps,
            "skipped_steps": skipped_steps,
            "epoch": epoch,
            "tokens_seen": tokens_seen,
        }
        if device.type == "cuda":
            record["gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        return record


def log_train_line(step: int, total_steps: int | None, record: dict[str, Any]) -> None:
    """The log line of a train record (when there is no progress bar)."""
    eta = "?"
    if total_steps:
        eta = _fmt_seconds(record["seconds_per_step"] * (total_steps - step))
    log.info(
        "step %d/%s | loss %.4f | nll %.4f | ppl %.2f | lr %.3e | gnorm %.3f | "
        "%.0f tok/s | %.3f s/step | epoch %.2f | eta %s",
        step, total_steps, record["loss"], record["nll_loss"], record["ppl"], record["lr"],
        record["grad_norm"], record["tokens_per_s"], record["seconds_per_step"],
        record["epoch"], eta,
    )


def _fmt_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
