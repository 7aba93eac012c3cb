"""``trainer.dry_run=true``: an experiment's real model, optimizer and schedule take a few steps
on a small slice of data, in ``<run_dir>/dry_run``, never touching the real run.

Prepares the slice itself when the experiment's data is missing (the one place where
training and preparation meet), then calls :func:`transformer_nmt.train.loop.train` with the
real run's batch plan (``max_tokens`` and ``update_freq`` derived as the real run derives
them, ``update_freq`` micro-batches per step), and ends with the bill: the measured tokens/s,
MFU and peak memory of the timed steps after the warm-up, and the wall time and GPU-hours of
the whole run projected from them (:func:`project`: the run's target tokens / the measured
tokens per second), printed and written to ``<run_dir>/dry_run/projection.json``.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from transformer_nmt.config import Config
from transformer_nmt.data import prepare
from transformer_nmt.fileio import write_json
from transformer_nmt.model.flops import peak_flops, peak_flops_source
from transformer_nmt.train import distributed
from transformer_nmt.train.data import data_ready
from transformer_nmt.train.loop import train

log = logging.getLogger(__name__)

DRY_RUN_TRAIN_PAIRS = 2000
"""Training pairs of the slice a dry run prepares when the experiment's data is missing."""
DRY_RUN_VOCAB = 1000
"""SentencePiece vocabulary of that slice (the model still uses the experiment's size)."""


DRY_RUN_SLICE_TOLERANCE = 0.5
"""``trainer.tokens_per_step_tolerance`` of a dry run on a prepared slice."""


def dry_run_config(cfg: Config) -> Config:
    """The config of a dry run: ``trainer.dry_run_warmup_steps + trainer.dry_run_steps``
    steps of the real batch plan (``trainer.tokens_per_step`` kept, so ``update_freq`` and,
    on a GPU with ``auto_max_tokens``, ``max_tokens`` are derived as in the real run) in
    ``<run_dir>/dry_run``, writing no checkpoint.

    When the experiment's binarized data is missing, a slice is prepared instead under its
    own name (``<data.name>_dry_run``): the first ``DRY_RUN_TRAIN_PAIRS`` training pairs of
    the real corpus with a ``DRY_RUN_VOCAB`` SentencePiece vocabulary. The model is still
    built with the experiment's ``data.vocab_size`` (:func:`dry_run` passes it) so that
    parameter count, memory and speed are those of the real run.
    """
    cfg = copy.deepcopy(cfg)
    t = cfg.trainer
    t.dry_run = False
    t.max_steps = t.dry_run_warmup_steps + t.dry_run_steps
    t.max_epochs = None
    t.max_time_minutes = None
    t.save_every_steps = None
    t.save_every_minutes = None
    t.validate_every_steps = None
    t.log_every_steps = 1
    t.keep_last = 1
    t.no_save = True  # a big model's checkpoint is 2.5 GB; the dry run is about the steps
    t.patience = None
    t.valid_bleu_sentences = min(t.valid_bleu_sentences, 16)
    cfg.run_dir = str(Path(cfg.run_dir) / "dry_run")
    if not data_ready(cfg):
        cfg.data.name = f"{cfg.data.name}_dry_run"
        limit = cfg.data.max_train_pairs
        cfg.data.max_train_pairs = min(limit, DRY_RUN_TRAIN_PAIRS) if limit else DRY_RUN_TRAIN_PAIRS
        cfg.data.vocab_size = min(cfg.data.vocab_size, DRY_RUN_VOCAB)
        # the slice's first pairs need not match the corpus's lengths: derive update_freq
        # for tokens_per_step as the real run does, without refusing a near miss
        t.tokens_per_step_tolerance = max(t.tokens_per_step_tolerance, DRY_RUN_SLICE_TOLERANCE)
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
            log.info("dry run: preparing %s under %s", cfg.data.name, cfg.data.root)
            prepare.prepare(cfg)
    else:
        while not data_ready(cfg):
            time.sleep(poll_seconds)
    distributed.barrier()
    summary = train(cfg, model_vocab_size=full_vocab, valid_max_batches=4)
    if info.is_main:
        summary["projection"] = write_projection(cfg, summary, total_steps,
                                                 skip=int(cfg.trainer.dry_run_warmup_steps))
    return summary


def project(seconds_per_step: list[float], tokens_per_step: list[float], *, total_steps: int | None,
            world_size: int, flops_per_token: float, peak_flops_per_device: float | None,
            peak_memory_bytes: int | None, skip: int = 2) -> dict[str, Any]:
    """The dry run's bill: measured speed and the projected cost of the whole run.

    The first ``skip`` steps (compilation, allocator and loader warm-up) are left out when
    more steps are left. Speed is measured over the rest as a whole: ``tokens_per_s`` = their
    target tokens / their wall seconds. The real run's target tokens are ``total_steps`` x
    the mean target tokens of a step (every micro-batch of every rank counted), and its wall
    time is those tokens / ``tokens_per_s``.

    Args:
        seconds_per_step: wall seconds of each dry-run step (s).
        tokens_per_step: target tokens (non-pad, eos included) of each step, all ranks and
            micro-batches.
        total_steps: optimizer steps of the real run (None: no time projection).
        world_size: devices of the run.
        flops_per_token: model training FLOPs per target token (:mod:`transformer_nmt.model.flops`).
        peak_flops_per_device: the device's peak FLOP/s at the run's precision (None: no MFU).
        peak_memory_bytes: the device allocator's peak (None off CUDA).

    Returns:
        ``tokens_per_s`` (all ranks), ``tokens_per_s_per_device``, ``seconds_per_step`` and
        ``tokens_per_step`` (means over the timed steps), ``mfu`` (fraction of
        ``world_size`` x peak; None without a peak), ``peak_memory_gib``, ``total_tokens`` =
        total_steps x tokens_per_step, ``projected_wall_hours`` = total_tokens / tokens_per_s
        / 3600, ``projected_device_hours`` = that x world_size, ``measured_steps``,
        ``warmup_steps``, ``note``.
    """
    measured = list(zip(seconds_per_step, tokens_per_step))
    warmup = skip if len(measured) > skip else 0
    measured = measured[warmup:]
    seconds = sum(sec for sec, _ in measured)
    tokens = sum(tok for _, tok in measured)
    tok_s = tokens / max(seconds, 1e-12)
    per_step = tokens / len(measured)
    total_tokens = total_steps * per_step if total_steps is not None else None
    wall_h = total_tokens / tok_s / 3600 if total_tokens is not None and tok_s > 0 else None
    mfu = (tok_s * flops_per_token / (peak_flops_per_device * world_size)
           if peak_flops_per_device else None)
    return {
        "measured_steps": len(measured),
        "warmup_steps": warmup,
        "seconds_per_step": seconds / len(measured),
        "tokens_per_step": per_step,
        "tokens_per_s": tok_s,
        "tokens_per_s_per_device": tok_s / world_size,
        "mfu": mfu,
        "peak_memory_gib": peak_memory_bytes / 2**30 if peak_memory_bytes is not None else None,
        "total_steps": total_steps,
        "total_tokens": total_tokens,
        "world_size": world_size,
        "projected_wall_hours": wall_h,
        "projected_device_hours": wall_h * world_size if wall_h is not None else None,
        "note": "a projection: total_steps x the mean target tokens per step / the target "
                "tokens per second measured over the dry run's timed steps, on this hardware "
                "and world size (validation and checkpoints not included)",
    }


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``n/a`` for None."""
    return "n/a" if value is None else format(value, spec)


def write_projection(cfg: Config, summary: dict[str, Any], total_steps: int | None,
                     skip: int = 2) -> dict[str, Any]:
    """:func:`project` from the dry run's ``metrics.jsonl`` and summary (the first ``skip``
    steps left out), with the batch plan it measured (``max_tokens``, ``update_freq``);
    logged and written to ``<run_dir>/projection.json`` (``cfg`` is the dry run's config).
    Rank 0 only."""
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
        peak_memory_bytes=peak_mem, skip=skip)
    out["device"], out["precision"] = summary["device"], summary["precision"]
    out["peak_flops_source"] = peak_flops_source(str(summary["device"]), str(summary["precision"]))
    out["max_tokens"] = int(cfg.trainer.max_tokens)  # as the run derived them
    out["update_freq"] = int(cfg.trainer.update_freq)
    write_json(run_dir / "projection.json", out)
    log.info("dry run on %d x %s (%s), %d steps of %d x %d tokens measured after %d warm-up "
             "steps: %s target tokens/s (%s per device), MFU %s, peak memory %s GiB",
             out["world_size"], out["device"], out["precision"], out["measured_steps"],
             out["update_freq"], out["max_tokens"], out["warmup_steps"],
             fmt(out["tokens_per_s"], ",.0f"),
             fmt(out["tokens_per_s_per_device"], ",.0f"), fmt(out["mfu"], ".1%"),
             fmt(out["peak_memory_gib"], ".1f"))
    log.info("MFU denominator: %s", out["peak_flops_source"])
    log.info("projection for %s steps: %s h wall time, %s device-hours (%s target tokens at "
             "the measured %s tokens/s; validation and checkpoints not included)",
             fmt(total_steps, ","), fmt(out["projected_wall_hours"], ",.1f"),
             fmt(out["projected_device_hours"], ",.1f"), fmt(out["total_tokens"], ",.0f"),
             fmt(out["tokens_per_s"], ",.0f"))
    return out
