"""``<run_dir>/train_summary.json``: the record a training run leaves (steps, tokens, real
tokens per step, training time and hours, FLOPs, validation results, the stop reason).

One writer (:func:`write_train_summary`, called by the training loop's
:mod:`transformer_nmt.train.summary`) and one reader (:func:`read_train_summary`: ``nmt-evaluate``
for the training cost in ``results.json``, a resumed run for its previous figures).
:class:`TrainSummary` is the record its readers use. Loads no torch: ``nmt-table`` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_nmt.errors import JsonFileError, UserError
from transformer_nmt.fileio import read_json, write_json

SUMMARY_NAME = "train_summary.json"
"""The file name of the summary in a run folder."""


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
            ValueError: what is not as :func:`write_train_summary` writes it (the field and value).
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


def summary_path(run_dir: str | Path) -> Path:
    """``<run_dir>/train_summary.json``."""
    return Path(run_dir) / SUMMARY_NAME


def read_train_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """``<run_dir>/train_summary.json`` as written by :func:`write_train_summary`, or None when
    the run has none.

    Raises:
        UserError: the file is not a regular file, not UTF-8, not JSON, nested too deeply,
            holds a number too large for a float (:func:`transformer_nmt.fileio.read_json`),
            or is not a training summary (names the file, and the line or field at fault).
    """
    path = summary_path(run_dir)
    if not path.is_file():
        return None
    try:
        summary = read_json(path)
    except JsonFileError as e:
        raise JsonFileError(path, f"{e.problem}; train again or delete it") from None
    try:
        TrainSummary.parse(summary)
    except ValueError as e:
        raise UserError(f"{path}: not a training summary ({e}); train again or delete it") from None
    return summary


def write_train_summary(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``summary`` to ``<run_dir>/train_summary.json`` (atomic, strict JSON: a NaN loss is
    null) and return the path."""
    path = summary_path(run_dir)
    write_json(path, summary)
    return path
