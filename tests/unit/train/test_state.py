"""The loop's decisions after a step (train/state.py): when to validate and when to save; the
epoch figure, also after a resume on another world size."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_nmt.config import TrainerConfig
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.train.state import TrainState, should_save, should_validate


def _trainer(**kw) -> TrainerConfig:
    base = {"validate_every_steps": None, "validate_every_epochs": None,
            "save_every_steps": None, "save_every_epochs": None}
    return TrainerConfig(**{**base, **kw})


def test_validate_on_the_interval_at_a_limit_and_never_twice_or_after_a_skipped_step():
    t = _trainer(validate_every_steps=5)
    at = {"epoch_ended": False, "stopped_by": None, "last_valid_step": -1}
    assert should_validate(t, TrainState(step=10), **at)
    assert not should_validate(t, TrainState(step=11), **at)
    assert should_validate(t, TrainState(step=11), **{**at, "stopped_by": "max_steps"})
    assert not should_validate(t, TrainState(step=11), **{**at, "stopped_by": "signal SIGTERM"})
    assert not should_validate(t, TrainState(step=10), **{**at, "last_valid_step": 10})
    assert not should_validate(t, TrainState(step=10, bad_steps_in_row=1), **at)
    by_epoch = _trainer(validate_every_epochs=2)
    assert should_validate(by_epoch, TrainState(step=7, epoch=2), **{**at, "epoch_ended": True})
    assert not should_validate(by_epoch, TrainState(step=7, epoch=3), **{**at, "epoch_ended": True})


def test_save_on_the_interval_at_any_stop_and_for_time_but_never_the_same_step_twice():
    t = _trainer(save_every_steps=10)
    at = {"epoch_ended": False, "stopped_by": None, "last_saved_step": -1, "save_for_time": False}
    assert should_save(t, TrainState(step=20), **at)
    assert not should_save(t, TrainState(step=21), **at)
    assert should_save(t, TrainState(step=21), **{**at, "stopped_by": "signal SIGTERM"})
    assert should_save(t, TrainState(step=21), **{**at, "save_for_time": True})
    assert not should_save(t, TrainState(step=20), **{**at, "last_saved_step": 20})
    assert not should_save(t, TrainState(step=20, bad_steps_in_row=2), **at)
    by_epoch = _trainer(save_every_epochs=1)
    assert should_save(by_epoch, TrainState(step=7, epoch=1), **{**at, "epoch_ended": True})


def test_epoch_progress_counts_the_sentences_given_before_a_resume_on_other_ranks():
    rng = np.random.default_rng(3)
    src, tgt = rng.integers(1, 40, 600), rng.integers(1, 40, 600)
    two = [LengthBucketSampler(src, tgt, 300, seed=2, rank=r, world_size=2) for r in (0, 1)]
    half = len(two[0]) // 2
    state = TrainState(epoch=0, position=half)
    assert state.epoch_progress(two[0]) == pytest.approx(2 * half / two[0].num_batches)
    consumed = two[0].consumed(0, half)
    # resumed on one rank with another budget: the rest of the epoch is batched anew
    one = LengthBucketSampler(src, tgt, 450, seed=2)
    one.resume_epoch(0, consumed)
    given = len(consumed) / one.num_sentences
    assert 0.4 < given < 0.6
    state = TrainState(epoch=0, position=0)
    assert state.epoch_progress(one) == pytest.approx(given)
    state.position = len(one) // 2
    assert state.epoch_progress(one) == pytest.approx(
        given + (1 - given) * state.position / len(one))
    state.position = len(one)
    assert state.epoch_progress(one) == pytest.approx(1.0)
    one.set_epoch(1)  # the next epoch: the whole composition again
    assert TrainState(epoch=1, position=0).epoch_progress(one) == 1.0
