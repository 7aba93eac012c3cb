"""``trainer.dry_run=true``: an experiment's real model, optimizer and schedule take a few steps
on a small slice of data, in ``<run_dir>/dry_run``, never touching the real run.

Prepares the slice itself when the experiment's data is missing (the one place where
training and preparation meet), then calls :func:`transformer_nmt.train.loop.train`, and
ends with the bill: the measured tokens/s, MFU and peak memory of those steps, and the wall
time and GPU-hours of the whole run projected from them (:func:`project`), printed and
written to ``<run_dir>/dry_run/projection.json``.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from transformer_nmt.config import Config
from transformer_nmt.fileio import atomic_write
from transformer_nmt.model.flops import peak_flops
from transformer_nmt.train import distributed
from transformer_nmt.train.data import data_ready
from transformer_nmt.train.loop import train

log = logging.getLogger(__name__)

DRY_RUN_TRAIN_PAIRS = 2000
"""Training pairs of the slice a dry run prepares when the experiment's data is missing."""
DRY_RUN_VOCAB = 1000
"""SentencePiece vocabulary of that slice (the model still uses the experiment's size)."""


def dry_run_config(cfg: Config) -> Config:
    """The config of a dry run: a few steps in ``<run_dir>/dry_run``, writing no checkpoint.

    When the experiment's binarized data is missing, a slice is prepared instead under its
    own name (``<data.name>_dry_run``): the first ``DRY_RUN_TRAIN_PAIRS`` training pairs of
    the real corpus with a ``DRY_RUN_VOCAB`` SentencePiece vocabulary. The model is still
    built with the experiment's ``data.vocab_size`` (:func:`dry_run` passes it) so that
    parameter count, memory and speed are those of the real run.
    """
    cfg = copy.deepcopy(cfg)
    t = cfg.trainer
    t.dry_run = False
    t.max_steps = t.dry_run_steps
    t.max_epochs = None
    t.max_time_minutes = None
    t.save_every_steps = None
    t.save_every_minutes = None
    t.validate_every_steps = None
    t.log_every_steps = 1
    t.keep_last = 1
    t.no_save = True  # a big model's checkpoint is 2.5 GB; the dry run is about the steps
    t.patience = None
    t.tokens_per_step = None  # a few steps of one micro-batch each: the step's size is not checked
    t.valid_bleu_sentences = min(t.valid_bleu_sentences, 16)
    cfg.run_dir = str(Path(cfg.run_dir) / "dry_run")
    if not data_ready(cfg):
        cfg.data.name = f"{cfg.data.name}_dry_run"
        limit = cfg.data.max_train_pairs
        cfg.data.max_train_pairs = min(limit, DRY_RUN_TRAIN_PAIRS) if limit else DRY_RUN_TRAIN_PAIRS
        cfg.data.vocab_size = min(cfg.data.vocab_size, DRY_RUN_VOCAB)
    return cfg


def dry_run(cfg: Config, poll_seconds: float = 5.0) -> dict[str, Any]:
    """Run the dry run of ``cfg`` (every rank calls it); returns the training summary, on
    rank 0 with the measured speed and projected cost under ``"projection"``
    (:func:`write_projection`; projected over ``trainer.max_steps``).

    Rank 0 empties ``<run_dir>/dry_run`` and prepares the slice when needed; the other ranks
    poll the file system for the prepared data instead of waiting in a collective, so a
    slow preparation cannot run into the process group's timeout.

    Raises:
        transformer_nmt.data.corpora.DataError and others from ``prepare`` (rank 0).
    """
    full_vocab = cfg.data.vocab_size
    total_steps = cfg.trainer.max_steps
    cfg = dry_run_config(cfg)
    info = distributed.init_distributed()
    if info.is_main:
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
        if not data_ready(cfg):
            from transformer_nmt.data import prepare

            log.info("dry run: preparing %s under %s", cfg.data.name, cfg.data.root)
            prepare.prepare(cfg)
    else:
        while not data_ready(cfg):
            time.sleep(poll_seconds)
    distributed.barrier()
    summary = train(cfg, model_vocab_size=full_vocab, valid_max_batches=4)
    if info.is_main:
        summary["projection"] = write_projection(cfg, summary, total_steps)
    return summary


def project(seconds_per_step: list[float], tokens_per_step: list[float], *, total_steps: int | None,
            world_size: int, flops_per_token: float, peak_flops_per_device: float | None,
            peak_memory_bytes: int | None, skip: int = 1) -> dict[str, Any]:
    """The dry run's bill: measured speed and the projected cost of the whole run.

    The first ``skip`` steps (compilation, allocator and loader warm-up) are left out when
    more steps are left; the figures are medians over the rest.

    Args:
        seconds_per_step: wall seconds of each dry-run step (s).
        tokens_per_step: target tokens (non-pad, eos included) of each step, all ranks.
        total_steps: optimizer steps of the real run (None: no time projection).
        world_size: devices of the run.
        flops_per_token: model training FLOPs per target token (:mod:`transformer_nmt.model.flops`).
        peak_flops_per_device: the device's peak FLOP/s at the run's precision (None: no MFU).
        peak_memory_bytes: the device allocator's peak (None off CUDA).

    Returns:
        ``tokens_per_s`` (all ranks), ``tokens_per_s_per_device``, ``seconds_per_step``,
        ``mfu`` (fraction of ``world_size`` x peak; None without a peak),
        ``peak_memory_gib``, ``projected_wall_hours`` = total_steps x seconds_per_step / 3600,
        ``projected_device_hours`` = that x world_size, ``measured_steps``, ``note``.
    """
    measured = list(zip(seconds_per_step, tokens_per_step))
    if len(measured) > skip:
        measured = measured[skip:]
    step_s = statistics.median(sec for sec, _ in measured)
    tok_s = statistics.median(tok / max(sec, 1e-12) for sec, tok in measured)
    wall_h = total_steps * step_s / 3600 if total_steps is not None else None
    mfu = (tok_s * flops_per_token / (peak_flops_per_device * world_size)
           if peak_flops_per_device else None)
    return {
        "measured_steps": len(measured),
        "seconds_per_step": step_s,
        "tokens_per_s": tok_s,
        "tokens_per_s_per_device": tok_s / world_size,
        "mfu": mfu,
        "peak_memory_gib": peak_memory_bytes / 2**30 if peak_memory_bytes is not None else None,
        "total_steps": total_steps,
        "world_size": world_size,
        "projected_wall_hours": wall_h,
        "projected_device_hours": wall_h * world_size if wall_h is not None else None,
        "note": "a projection: total_steps x the median measured step time of the dry run "
                "on this hardware and world size (validation and checkpoints not included)",
    }


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``n/a`` for None."""
    return "n/a" if value is None else format(value, spec)


def write_projection(cfg: Config, summary: dict[str, Any], total_steps: int | None) -> dict[str, Any]:
    """:func:`project` from the dry run's ``metrics.jsonl`` and summary; logged and written
    to ``<run_dir>/projection.json`` (``cfg`` is the dry run's config). Rank 0 only."""
    import torch

    run_dir = Path(cfg.run_dir)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip()]
    steps = [r for r in steps if r.get("split") == "train"]
    peak_mem = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
                and "cpu" not in str(summary.get("device", "")) else None)
    out = project(
        [r["seconds_per_step"] for r in steps],
        [r["tokens_per_s"] * r["seconds_per_step"] for r in steps],
        total_steps=total_steps, world_size=int(summary["world_size"]),
        flops_per_token=float(summary["flops"]) / max(int(summary["tokens_seen"]), 1),
        peak_flops_per_device=peak_flops(str(summary["device"]), str(summary["precision"])),
        peak_memory_bytes=peak_mem)
    out["device"], out["precision"] = summary["device"], summary["precision"]
    with atomic_write(run_dir / "projection.json") as f:
        json.dump(out, f, indent=2)
    log.info("dry run on %d x %s (%s), %d steps measured: %s target tokens/s (%s per device), "
             "MFU %s, peak memory %s GiB", out["world_size"], out["device"], out["precision"],
             out["measured_steps"], fmt(out["tokens_per_s"], ",.0f"),
             fmt(out["tokens_per_s_per_device"], ",.0f"), fmt(out["mfu"], ".1%"),
             fmt(out["peak_memory_gib"], ".1f"))
    log.info("projection for %s steps: %s h wall time, %s device-hours (%s x the measured "
             "%.3f s per step; validation and checkpoints not included)",
             fmt(total_steps, ","), fmt(out["projected_wall_hours"], ",.1f"),
             fmt(out["projected_device_hours"], ",.1f"), fmt(total_steps, ","),
             out["seconds_per_step"])
    return out
