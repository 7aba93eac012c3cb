"""The training step without a host bubble: the skip of a non-finite step is decided on the
device, each step's figures are read one step late (after the next step's forward and
backward are queued), and a step that is saved, validated or ends the run is read at once, so
that checkpoints and resumes stay exact (training runs on the synthetic reversal corpus of
tests/conftest.py)."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch

import transformer_nmt.train.loop as train_mod
from transformer_nmt.checkpoint import checkpoint_dir, load_checkpoint
from transformer_nmt.config import TrainerConfig, compose
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train import step as train_step
from transformer_nmt.train.optim import inverse_sqrt_lr
from transformer_nmt.train.state import TrainState, needs_exact_state
from unit.train.test_loop import TRAINER

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu",
              "numpy")
"""Python reads of a tensor's values: each is a host-device synchronisation on a GPU."""


@pytest.fixture(scope="module")
def tiny(tiny_model) -> list[str]:
    return [*tiny_model, *TRAINER]


@pytest.fixture(scope="module")
def data_overrides(synthetic_corpus) -> list[str]:
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides]


class _Events:
    """The order of the loop's work: ``("fb", k)`` when step k's forward_backward starts,
    ``("forward", k)`` for each model forward in it (validation's are not logged),
    ``("update", k)`` when its update is queued, ``("read", j)`` for the read of step j's
    figures, and ``("host", name)`` for every host read of a tensor outside those reads
    (``("host in read", name)`` inside them)."""

    def __init__(self, monkeypatch) -> None:
        self.log: list[tuple[str, object]] = []
        self.steps = self.reads = 0
        self.in_read = self.in_fb = False
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name),
                                                                   name))
        real_fb, real_queue = train_mod.forward_backward, train_mod.queue_update
        real_read, real_forward = train_step.read_figures, Transformer.forward

        def fb(*args, **kwargs):
            self.steps += 1
            self.log.append(("fb", self.steps))
            self.in_fb = True
            try:
                return real_fb(*args, **kwargs)
            finally:
                self.in_fb = False

        def forward(model, *args, **kwargs):
            if self.in_fb:  # a training forward, not validation's
                self.log.append(("forward", self.steps))
            return real_forward(model, *args, **kwargs)

        def queue(*args, **kwargs):
            self.log.append(("update", self.steps))
            return real_queue(*args, **kwargs)

        def read(pending):
            self.reads += 1
            self.log.append(("read", self.reads))
            self.in_read = True
            try:
                return real_read(pending)
            finally:
                self.in_read = False

        monkeypatch.setattr(train_mod, "forward_backward", fb)
        monkeypatch.setattr(Transformer, "forward", forward)
        monkeypatch.setattr(train_mod, "queue_update", queue)
        monkeypatch.setattr(train_step, "read_figures", read)

    def _counting(self, original, name):
        events = self

        def wrapper(tensor, *args, **kwargs):
            if events.steps and not events.in_read:
                events.log.append(("host", name))
            elif events.in_read:
                events.log.append(("host in read", name))
            return original(tensor, *args, **kwargs)
        return wrapper

    def index(self, event: tuple[str, object]) -> int:
        return self.log.index(event)

    def last(self, kind: str, step: int) -> int:
        return max(i for i, e in enumerate(self.log) if e == (kind, step))


def test_each_steps_figures_are_read_once_after_the_next_steps_forward(
        tmp_path, data_overrides, tiny, monkeypatch):
    """Six steps of two micro-batches, nothing saved, validated or logged in between: step
    k's figures are read (its one host read) after step k+1's forwards are issued and before
    step k+1's update is queued; the last step is read at once (max_steps). No other host
    read happens in the steps."""
    events = _Events(monkeypatch)
    summary = train_mod.train(compose([
        *data_overrides, *tiny, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=6",
        "trainer.update_freq=2", "trainer.log_every_steps=1000",
        "trainer.validate_every_steps=null", "trainer.save_every_steps=null"]))
    assert summary["steps"] == 6 and events.steps == 6 and events.reads == 6
    steps_log = events.log[:events.index(("read", 6)) + 2]  # up to the last read's own read
    assert [e for e in steps_log if e[0] == "host"] == [], steps_log
    assert [e for e in steps_log if e[0] == "host in read"] == [("host in read", "tolist")] * 6
    for k in range(1, 6):
        assert events.last("forward", k + 1) < events.index(("read", k)), (k, events.log)
        assert events.index(("read", k)) < events.index(("update", k + 1)), (k, events.log)
    assert events.index(("update", 6)) < events.index(("read", 6))  # the last: read at once


def test_a_step_that_is_saved_is_read_before_the_next_step_starts(
        tmp_path, data_overrides, tiny, monkeypatch):
    """save_every_steps=3: steps 3 and 6 are read before the next step's forward_backward
    (a checkpoint holds that step's state, data position and RNG), the others one step
    late."""
    events = _Events(monkeypatch)
    train_mod.train(compose([
        *data_overrides, *tiny, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=7",
        "trainer.save_every_steps=3", "trainer.validate_every_steps=null"]))
    for k in (3, 6):
        assert events.index(("read", k)) < events.index(("fb", k + 1)), events.log
    for k in (1, 2, 4, 5):
        assert events.index(("read", k)) > events.index(("fb", k + 1)), events.log


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"params": [p.detach().clone() for p in model.parameters()],
            "state": [{k: v.clone() for k, v in optimizer.state[p].items()}
                      for p in model.parameters() if p in optimizer.state]}


def _same(a: dict, b: dict) -> bool:
    return (all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
            and len(a["state"]) == len(b["state"])
            and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                    for x, y in zip(a["state"], b["state"])))


def test_a_non_finite_gradient_on_step_j_skips_exactly_that_step(
        tmp_path, data_overrides, tiny, monkeypatch, caplog):
    """An inf in one gradient of step 4 (the loss finite): the optimizer is stepped without a
    host read, and its kernel leaves the parameters, the Adam moments and the step count
    exactly as they were; every other step changes them. The skip is logged (when its
    figures are read, one step late), and the learning rate of each update is today's: the
    schedule counts successful updates, so step 5 uses the rate step 4 would have used."""
    j = 4
    snapshots: list[tuple[dict, dict, float]] = []
    real_fb, real_queue = train_mod.forward_backward, train_mod.queue_update
    calls = {"fb": 0}

    def fb(model, *args, **kwargs):
        out = real_fb(model, *args, **kwargs)
        calls["fb"] += 1
        if calls["fb"] == j:
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            grad.view(-1)[0] = float("inf")
        return out

    def queue(s, *args, **kwargs):
        before = _snapshot(s.model, s.optimizer)
        pending = real_queue(s, *args, **kwargs)
        snapshots.append((before, _snapshot(s.model, s.optimizer), pending.lr))
        return pending

    monkeypatch.setattr(train_mod, "forward_backward", fb)
    monkeypatch.setattr(train_mod, "queue_update", queue)
    run = tmp_path / "run"
    cfg = compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=8",
                   "trainer.validate_every_steps=null", "trainer.save_every_steps=null"])
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.train"):
        summary = train_mod.train(cfg)
    assert summary["steps"] == 8 and summary["skipped_steps"] == 1 and len(snapshots) == 9
    for i, (before, after, _) in enumerate(snapshots, start=1):
        assert _same(before, after) == (i == j), i
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].startswith(f"step {j} skipped: loss ")
    assert "gradient norm inf (1 in a row, 1 in total)" in skipped[0]
    t = cfg.trainer
    updates = [1, 2, 3, 4, 4, 5, 6, 7, 8]  # the schedule's count of each call's update
    assert [lr for _, _, lr in snapshots] == [
        inverse_sqrt_lr(n, cfg.model.d_model, int(t.warmup_steps), float(t.lr_multiplier))
        for n in updates]
    last = load_checkpoint(checkpoint_dir(run) / "checkpoint_8.pt")
    assert last["scheduler"]["last_epoch"] == 8
    assert all(float(s["step"]) == 8 for s in last["optimizer"]["state"].values())


def test_the_divergence_stop_reads_one_step_late_and_counts_as_before(
        tmp_path, data_overrides, tiny, monkeypatch):
    """max_bad_steps=3 with every loss NaN: the third skip is read after the fourth step's
    forward_backward, which is then not counted (3 micro-batches, as when each step was read
    at once), and the parameters never changed."""
    real_loss = train_step.label_smoothed_nll_loss

    def nan_loss(logits, target, epsilon, ignore_index=0):
        loss, nll = real_loss(logits, target, epsilon, ignore_index)
        return loss * float("nan"), nll

    monkeypatch.setattr(train_step, "label_smoothed_nll_loss", nan_loss)
    events = _Events(monkeypatch)
    with pytest.raises(train_step.TrainingDiverged, match="3 consecutive steps"):
        train_mod.train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                                 "trainer.max_steps=20", "trainer.max_bad_steps=3"]))
    assert events.steps == 4 and events.reads == 3
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["stopped_by"] == "divergence"
    assert (summary["steps"], summary["skipped_steps"], summary["micro_steps"]) == (0, 3, 3)


def _train_until(cfg_overrides: list[str], run_dir, monkeypatch, signal_at: int | None,
                 late: bool) -> dict:
    """train() in ``run_dir``; SIGUSR1 arrives during forward_backward call ``signal_at``;
    ``late``: the stop request is agreed through the figures as with several ranks."""
    with monkeypatch.context() as m:
        if late:
            m.setattr(train_mod, "requests_known_at_once", lambda world_size: False)
        if signal_at is not None:
            real_fb, calls = train_mod.forward_backward, []

            def signalling_fb(*args, **kwargs):
                calls.append(1)
                if len(calls) == signal_at:
                    os.kill(os.getpid(), signal.SIGUSR1)
                return real_fb(*args, **kwargs)

            m.setattr(train_mod, "forward_backward", signalling_fb)
        return train_mod.train(compose([*cfg_overrides, f"run_dir={run_dir}"]))


@pytest.mark.parametrize("late", [False, True])
def test_a_stop_checkpoint_resumes_to_the_uninterrupted_run_bit_for_bit(
        tmp_path, data_overrides, tiny, monkeypatch, late):
    """SIGUSR1 during step 4: one process stops after step 4; with the request agreed one
    step late (as on several ranks) after step 5. Either stop checkpoint holds that step's
    state, data position and RNG, and the resumed run ends at step 10 where the
    uninterrupted one does: parameters, Adam state, schedule, counters, sampler, RNG."""
    common = [*data_overrides, *tiny, "trainer.max_steps=10",
              "trainer.validate_every_steps=null", "trainer.save_every_steps=null"]
    _train_until(common, tmp_path / "reference", monkeypatch, None, late)
    stopped = _train_until(common, tmp_path / "stopped", monkeypatch, 4, late)
    assert stopped["stopped_by"] == "signal SIGUSR1"
    assert stopped["steps"] == (5 if late else 4)
    stop_ckpt = load_checkpoint(checkpoint_dir(tmp_path / "stopped")
                                / f"checkpoint_{stopped['steps']}.pt")
    assert stop_ckpt["train_state"]["micro_step"] == stopped["steps"]
    resumed = _train_until(common, tmp_path / "stopped", monkeypatch, None, late)
    assert resumed["steps"] == 10 and resumed["resumed_from"]
    for key in ("train_seconds", "cpu_seconds"):  # summed over both segments
        assert resumed[key] > stop_ckpt["train_state"][key] > 0, key
    a = load_checkpoint(checkpoint_dir(tmp_path / "reference") / "checkpoint_10.pt")
    b = load_checkpoint(checkpoint_dir(tmp_path / "stopped") / "checkpoint_10.pt")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for k, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][k][name]), (k, name)
    assert a["scheduler"] == b["scheduler"]
    for key in ("step", "micro_step", "tokens_seen", "src_tokens_seen", "src_sq_seen",
                "tgt_sq_seen", "src_tgt_seen", "skipped_steps"):
        assert a["train_state"][key] == b["train_state"][key], key
    consumed = a["sampler"].pop("consumed"), b["sampler"].pop("consumed")
    assert a["sampler"] == b["sampler"] and torch.equal(*consumed)
    assert torch.equal(a["rng"][0]["torch"], b["rng"][0]["torch"])


def test_needs_exact_state_at_every_step_that_may_act():
    cfg = TrainerConfig(max_steps=10, save_every_steps=4, validate_every_steps=3)
    at = [s for s in range(12)
          if needs_exact_state(cfg, TrainState(step=s), epoch_ended=False, requested=False)]
    assert at == [2, 3, 5, 7, 8, 9, 10, 11]  # the next step: 3, 4, 6, 8, 9, 10 and beyond
    state = TrainState(step=0)
    assert needs_exact_state(cfg, state, epoch_ended=True, requested=False)
    assert needs_exact_state(cfg, state, epoch_ended=False, requested=True)
    free = TrainerConfig(max_steps=None, save_every_steps=None, validate_every_steps=None)
    assert not needs_exact_state(free, TrainState(step=99), epoch_ended=False, requested=False)
