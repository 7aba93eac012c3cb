"""Pruning and averaging when a run is resumed with another ``trainer.save_every_steps``: the
periodic checkpoints of the earlier spacing are neither deleted silently nor left out of the
average; a stop checkpoint off its own interval is removed, and the log names it."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import make_cfg

from transformer_nmt import checkpoint as ck
from transformer_nmt.checkpoint import average_run, load_checkpoint, save_checkpoint


def _save(run_dir, step: int, every: int, keep_last: int) -> None:
    """What the loop does at a save: write the checkpoint under ``every``, then prune."""
    save_checkpoint(ck.checkpoint_dir(run_dir) / f"checkpoint_{step}.pt",
                    {"model": {"w": torch.tensor([float(step)])}, "step": step, "vocab_size": 8,
                     "config": {"name": "tiny", "trainer": {"save_every_steps": every}}})
    ck.prune_checkpoints(run_dir, keep_last, every)


def _steps(run_dir) -> list[int]:
    return [ck.checkpoint_step(load_checkpoint(p)) for p in ck.step_checkpoints(run_dir)]


def test_resuming_with_another_spacing_keeps_the_earlier_periodic_checkpoints(tmp_path, caplog):
    for step in (10, 20, 30):
        _save(tmp_path, step, every=10, keep_last=5)
    _save(tmp_path, 35, every=35, keep_last=5)  # resumed with save_every_steps=35
    assert _steps(tmp_path) == [10, 20, 30, 35]

    cfg = make_cfg(tmp_path, f"run_dir={tmp_path}", "average.last=5",
                   "trainer.save_every_steps=35")
    with caplog.at_level(logging.INFO, logger="transformer_nmt.checkpoint"):
        avg = load_checkpoint(average_run(cfg))
    assert avg["averaged_steps"] == [10, 20, 30, 35]
    assert avg["model"]["w"].item() == pytest.approx((10 + 20 + 30 + 35) / 4)
    assert "checkpoint_10.pt: 10" in caplog.text and "checkpoint_35.pt: 35" in caplog.text


def test_the_window_moves_on_and_every_removal_is_logged(tmp_path, caplog):
    for step in (10, 20, 30):
        _save(tmp_path, step, every=10, keep_last=3)
    _save(tmp_path, 34, every=10, keep_last=3)  # the stop checkpoint of the first segment
    with caplog.at_level(logging.INFO, logger="transformer_nmt.checkpoint"):
        _save(tmp_path, 45, every=15, keep_last=3)
        assert _steps(tmp_path) == [20, 30, 45]
        assert "removed checkpoint_34.pt: written when training stopped, off its interval" \
               in caplog.text
        assert "removed checkpoint_10.pt: older than the last 3 periodic" in caplog.text
        _save(tmp_path, 52, every=15, keep_last=3)  # a stop off the new interval: kept as newest
        assert _steps(tmp_path) == [20, 30, 45, 52]

    cfg = make_cfg(tmp_path, f"run_dir={tmp_path}", "average.last=3",
                   "trainer.save_every_steps=15")
    assert load_checkpoint(average_run(cfg))["averaged_steps"] == [20, 30, 45]
