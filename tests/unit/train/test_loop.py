"""The training loop on the synthetic reversal corpus (tests/conftest.py): learning, outputs,
signals, bad steps (runs killed or stopped from outside: tests/scenario/test_training_runs.py)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time

import pytest
import torch
from helpers import train_command, train_env

import transformer_nmt.train.loop as train_mod
from transformer_nmt.checkpoint import (
    BEST_NAME,
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    load_model,
    step_checkpoints,
)
from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix
from transformer_nmt.model.flops import TokenCounts, training_flops
from transformer_nmt.train import data as train_data
from transformer_nmt.train import setup as train_setup
from transformer_nmt.train import step as train_step
from transformer_nmt.train.data import MissingDataError
from transformer_nmt.train.dryrun import dry_run
from transformer_nmt.train.loop import train

TRAINER = [
    "model.dropout=0.1", "trainer.max_tokens=1024",
    "trainer.warmup_steps=10", "trainer.lr_multiplier=1.0", "trainer.save_every_minutes=null",
    "trainer.log_every_steps=5", "trainer.num_workers=0",
    # the paper's schedule: these runs are resumed and extended to other max_steps
    "trainer.lr_scheduler=inverse_sqrt",
]


@pytest.fixture(scope="module")
def tiny(tiny_model) -> list[str]:
    """The tests' tiny model with this module's trainer settings."""
    return [*tiny_model, *TRAINER]


@pytest.fixture(scope="module")
def data_overrides(synthetic_corpus) -> list[str]:
    """The default experiment on the prepared synthetic reversal corpus (2,000 pairs)."""
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides]


def test_real_run_learns_and_writes_its_outputs(tmp_path, data_overrides, tiny, synthetic_corpus):
    run = tmp_path / "run"
    cfg = compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=60",
                   "trainer.validate_every_steps=20", "trainer.save_every_steps=20",
                   "trainer.keep_last=2", "trainer.warmup_steps=20",
                   "trainer.lr_multiplier=0.3"])
    summary = train(cfg)

    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in valid if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [20, 40, 60]
    losses = [r["loss"] for r in valid]
    assert losses[2] < losses[1] < losses[0] and losses[2] < losses[0] - 0.2, (
        f"validation loss did not fall: {losses}"
    )
    train_lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in train_lines if r["split"] == "train"]
    assert len(train_lines) == 12 and all(r["tokens_per_s"] > 0 for r in train_lines)
    assert {"loss", "nll_loss", "ppl", "lr", "grad_norm", "seconds_per_step",
            "skipped_steps"} <= set(train_lines[0])
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tb").iterdir())

    on_disk = json.loads((run / "train_summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["steps"] == 60 and on_disk["world_size"] == 1
    assert on_disk["train_seconds"] > 0 and on_disk["gpu_hours"] == 0.0
    assert on_disk["cpu_seconds"] > 0
    counts = on_disk["token_counts"]
    assert (counts["src"], counts["tgt"]) == (on_disk["src_tokens_seen"], on_disk["tokens_seen"])
    assert counts["src_sq"] >= counts["src"] and counts["tgt_sq"] >= counts["tgt"] > 0
    expected_flops = training_flops(cfg.model, on_disk["vocab_size"], TokenCounts(**counts))
    assert on_disk["flops"] == pytest.approx(expected_flops) and on_disk["flops"] > 0

    # keep_last=2 of the checkpoints at 20, 40, 60; best = lowest validation loss (step 60).
    assert [p.name for p in step_checkpoints(run)] == ["checkpoint_40.pt", "checkpoint_60.pt"]
    last = load_checkpoint(latest_checkpoint(run))  # torch.load(weights_only=True)
    assert last["train_state"]["step"] == 60
    assert last["train_state"]["tokens_seen"] == on_disk["tokens_seen"]
    assert last["config"]["run_dir"] == str(run)
    assert last["vocab_size"] == synthetic_corpus.vocab_size
    # Named parts, each stored once (vocab: the SentencePiece model's identity; data: the
    # training data's).
    assert set(last) == {"model", "optimizer", "scheduler", "scaler", "sampler", "rng",
                         "train_state", "config", "vocab_size", "vocab", "data"}
    assert not {"epoch", "position"} & set(last["train_state"])
    best = load_checkpoint(checkpoint_dir(run) / BEST_NAME)
    assert best["train_state"]["step"] == 60
    model, _ = load_model(latest_checkpoint(run))
    assert all(torch.equal(v, last["model"][k]) for k, v in model.state_dict().items())


def test_cpu_seconds_count_the_processs_cpu_time_not_waiting(tmp_path, data_overrides, tiny,
                                                             monkeypatch):
    """A step that waits 0.3 s without computing adds 0.3 s to ``train_seconds`` and almost
    nothing to ``cpu_seconds`` (the summary's CPU time; ``cpu_hours`` is wall time)."""
    real_fb = train_mod.forward_backward

    def waiting_fb(*args, **kwargs):
        time.sleep(0.3)
        return real_fb(*args, **kwargs)

    monkeypatch.setattr(train_mod, "forward_backward", waiting_fb)
    summary = train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                             "trainer.max_steps=4", "trainer.validate_every_steps=null",
                             "trainer.save_every_steps=null"]))
    assert summary["train_seconds"] > 1.2
    assert 0 < summary["cpu_seconds"] < summary["train_seconds"] - 1.0


def test_epoch_checkpoints_and_validation(tmp_path, data_overrides, tiny):
    """save_every_epochs / validate_every_epochs (fairseq's per-epoch intervals) act at the
    last step of each epoch, and only there."""
    run = tmp_path / "run"
    summary = train(compose([
        *data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=null",
        "trainer.max_epochs=3", "trainer.save_every_steps=null", "trainer.save_every_minutes=null",
        "trainer.validate_every_steps=null", "trainer.save_every_epochs=1",
        "trainer.validate_every_epochs=2", "trainer.keep_last=5"]))
    steps = summary["steps"]
    assert steps % 3 == 0 and steps >= 6, steps
    per_epoch = steps // 3
    assert [p.name for p in step_checkpoints(run)] == [
        f"checkpoint_{per_epoch * e}.pt" for e in (1, 2, 3)]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # epoch 2 by the interval, epoch 3 because training ends there
    assert [r["step"] for r in records if r["split"] == "valid"] == [2 * per_epoch, steps]
    assert load_checkpoint(latest_checkpoint(run))["train_state"]["step"] == steps


def test_non_finite_step_is_skipped_and_counted(tmp_path, data_overrides, tiny, monkeypatch):
    real_loss = train_step.label_smoothed_nll_loss
    calls = {"n": 0}

    def loss_with_one_nan(logits, target, epsilon, ignore_index=0):
        calls["n"] += 1
        loss, nll = real_loss(logits, target, epsilon, ignore_index)
        if calls["n"] == 4:  # the fourth micro-batch (step 4) gets a NaN loss
            loss = loss * float("nan")
        return loss, nll

    monkeypatch.setattr(train_step, "label_smoothed_nll_loss", loss_with_one_nan)
    run = tmp_path / "run"
    summary = train(compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=8",
                             "trainer.validate_every_steps=null"]))
    assert summary["skipped_steps"] == 1
    assert summary["steps"] == 8 and summary["micro_steps"] == 9
    last = load_checkpoint(latest_checkpoint(run))
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    # The schedule follows successful updates only: 8 scheduler steps.
    assert last["scheduler"]["last_epoch"] == 8


def test_max_bad_steps_stops_with_a_clear_message(tmp_path, data_overrides, tiny, monkeypatch):
    real_loss = train_step.label_smoothed_nll_loss

    def always_nan(logits, target, epsilon, ignore_index=0):
        loss, nll = real_loss(logits, target, epsilon, ignore_index)
        return loss * float("nan"), nll

    monkeypatch.setattr(train_step, "label_smoothed_nll_loss", always_nan)
    with pytest.raises(RuntimeError, match=r"3 consecutive steps .*max_bad_steps=3"):
        train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                       "trainer.max_steps=20", "trainer.max_bad_steps=3"]))


def test_dry_run_leaves_the_real_run_alone(tmp_path, data_overrides, tiny):
    run = tmp_path / "run"
    cfg = compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.dry_run=true",
                   "trainer.dry_run_steps=2", "trainer.dry_run_warmup_steps=1"])
    with pytest.raises(ValueError, match="dry_run"):
        train(cfg)  # never a full run in the real run directory
    summary = dry_run(cfg)
    assert summary["steps"] == 3
    assert (run / "dry_run" / "train_summary.json").is_file()
    assert step_checkpoints(run) == [] and not (run / "train_summary.json").exists()
    assert not (run / "dry_run" / "checkpoints").exists()  # trainer.no_save: nothing written
    # the bill, from the steps it took: 2 measured after the warm-up step
    projection = json.loads((run / "dry_run" / "projection.json").read_text())
    assert summary["projection"] == projection and projection["measured_steps"] == 2
    assert projection["tokens_per_s"] > 0 and projection["total_steps"] == cfg.trainer.max_steps
    assert projection["projected_wall_hours"] == pytest.approx(
        projection["total_tokens"] / projection["tokens_per_s"] / 3600)


def test_missing_data_fails_with_one_line_naming_the_file(tmp_path, data_overrides, tiny):
    kept = [o for o in data_overrides if not o.startswith("data.root=")]
    overrides = [*kept, f"data.root={tmp_path / 'empty'}", *tiny,
                 f"run_dir={tmp_path / 'run'}", "trainer.max_steps=1"]
    with pytest.raises(MissingDataError, match=r"spm\.model.*nmt-prepare experiment="):
        train(compose(overrides))
    proc = subprocess.run(train_command(overrides), check=False, env=train_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: prepared data not found: ") and "make data" in last
    assert "Traceback" not in proc.stderr and not (tmp_path / "empty").exists()


def test_validation_bleu_selects_best_and_patience_stops(tmp_path, data_overrides, tiny):
    run = tmp_path / "run"
    # A learning rate so small that greedy output, hence BLEU, cannot improve after the first
    # validation: patience=2 stops the run at the third validation (step 6), not max_steps.
    summary = train(compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=50",
                             "trainer.validate_every_steps=2", "trainer.valid_bleu=true",
                             "trainer.valid_bleu_sentences=8", "trainer.patience=2",
                             "trainer.lr_multiplier=1e-9", "decode.max_len_b=5"]))
    assert summary["stopped_by"] == "patience" and summary["steps"] == 6
    valid = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in valid if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6]
    assert all(0.0 <= r["bleu"] <= 100.0 for r in valid)
    assert summary["best_valid_bleu"] == valid[0]["bleu"]
    assert load_checkpoint(checkpoint_dir(run) / BEST_NAME)["train_state"]["step"] == 2


def test_init_from_starts_a_new_run_from_a_model_file(tmp_path, data_overrides, tiny):
    """trainer.init_from: the new run's first weights are the file's; a run that already has
    checkpoints resumes from them instead; a model of another shape is a one-line user error."""
    from transformer_nmt.errors import UserError
    from transformer_nmt.train import distributed
    from transformer_nmt.train.setup import setup

    source = tmp_path / "source"
    train(compose([*data_overrides, *tiny, f"run_dir={source}", "trainer.max_steps=2",
                   "trainer.save_every_steps=2", "trainer.validate_every_steps=null"]))
    init = latest_checkpoint(source)
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    cfg = compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'new'}",
                   f"trainer.init_from={init}"])
    s = setup(cfg, info)
    saved = load_checkpoint(init)["model"]
    assert all(torch.equal(v, saved[k]) for k, v in s.model.state_dict().items())
    assert s.optimizer.state == {}  # optimizer and schedule start fresh
    plain = setup(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'plain'}"]), info)
    assert not all(torch.equal(v, saved[k]) for k, v in plain.model.state_dict().items())
    wider = compose([*data_overrides, *tiny, "model.d_ff=96", f"run_dir={tmp_path / 'x'}",
                     f"trainer.init_from={init}"])
    with pytest.raises(UserError, match="does not fit the run's model config"):
        setup(wider, info)


def test_sigusr2_checkpoints_then_hands_over_to_submitit(tmp_path, data_overrides, tiny,
                                                        monkeypatch):
    """SIGUSR2 (Hydra's submitit launcher) stops at the step boundary with a checkpoint and a
    summary, then submitit's handler (a stand-in recording what exists when it runs) gets
    the signal to requeue the job."""
    run_dir = tmp_path / "run"
    seen: list[tuple[int, bool, bool]] = []

    def submitit_stand_in(signum, frame):
        seen.append((signum, latest_checkpoint(run_dir) is not None,
                     (run_dir / "train_summary.json").is_file()))

    previous = signal.signal(signal.SIGUSR2, submitit_stand_in)
    real_fb, calls = train_mod.forward_backward, []

    def signalling_fb(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGUSR2)
        return real_fb(*args, **kwargs)

    monkeypatch.setattr(train_mod, "forward_backward", signalling_fb)
    try:
        summary = train(compose([*data_overrides, *tiny, f"run_dir={run_dir}",
                                 "trainer.max_steps=50", "trainer.validate_every_steps=null"]))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert summary["stopped_by"] == "signal SIGUSR2" and summary["steps"] == 3
    assert load_checkpoint(latest_checkpoint(run_dir))["train_state"]["step"] == 3
    assert seen == [(signal.SIGUSR2, True, True)]


# ------------------------------------------------------------------- host-device syncs


def test_at_most_one_host_sync_per_step_outside_logging(tmp_path, data_overrides, tiny,
                                                        monkeypatch):
    """Every Python read of a tensor (item, bool, float, int, tolist, bool-mask indexing) is
    a host-device synchronisation on a GPU; between two steps' forward_backward calls (no
    logging, validation or checkpoint in between) there may be at most one."""
    reads: list[str] = []
    originals = {}

    def counting(name):
        original = getattr(torch.Tensor, name)
        originals[name] = original

        def wrapper(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)
        return wrapper

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    getitem = torch.Tensor.__getitem__

    def counting_getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            reads.append("bool-mask indexing")
        return getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", counting_getitem)
    marks: list[int] = []
    real_fb = train_mod.forward_backward

    def marking_fb(*args, **kwargs):
        marks.append(len(reads))
        return real_fb(*args, **kwargs)

    monkeypatch.setattr(train_mod, "forward_backward", marking_fb)
    summary = train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                             "trainer.max_steps=6", "trainer.update_freq=2",
                             "trainer.log_every_steps=1000", "trainer.validate_every_steps=null"]))
    assert summary["steps"] == 6 and len(marks) == 6
    per_step = [b - a for a, b in itertools.pairwise(marks)]
    assert max(per_step) <= 1, (per_step, reads[marks[0]:marks[-1]])


# ------------------------------------------------------------------- fp16 loss scaling


def _fp16_scaler_with_overflows(monkeypatch, init_scale: float, overflows: int | None):
    """An enabled dynamic loss scaler (on CPU) whose scaled gradients overflow (one is inf)
    on the first ``overflows`` steps (None: always) while the loss stays finite, as fp16
    gives while the scale calibrates."""
    calls = {"n": 0}

    class OverflowingScaler(torch.amp.GradScaler):
        def unscale_(self, optimizer):
            calls["n"] += 1
            if overflows is None or calls["n"] <= overflows:
                next(p for g in optimizer.param_groups for p in g["params"]
                     if p.grad is not None).grad.view(-1)[0] = float("inf")
            return super().unscale_(optimizer)

    monkeypatch.setattr(train_setup, "grad_scaler",
                        lambda enabled: OverflowingScaler("cpu", init_scale=init_scale))


def test_fp16_overflows_while_the_scale_calibrates_are_not_bad_steps(tmp_path, data_overrides, tiny,
                                                                     monkeypatch):
    _fp16_scaler_with_overflows(monkeypatch, 2.0**16, overflows=5)
    run = tmp_path / "run"
    summary = train(compose([*data_overrides, *tiny, f"run_dir={run}", "trainer.max_steps=4",
                             "trainer.max_bad_steps=3", "trainer.validate_every_steps=null"]))
    assert summary["steps"] == 4 and summary["skipped_steps"] == 5
    last = load_checkpoint(latest_checkpoint(run))
    assert last["train_state"]["overflow_steps"] == 5
    assert last["train_state"]["bad_steps_in_row"] == 0
    assert last["scaler"]["scale"] == 2.0**16 / 2**5  # halved by each overflow
    assert last["scheduler"]["last_epoch"] == 4  # the schedule counts real updates only


def test_fp16_stops_when_the_loss_scale_collapses(tmp_path, data_overrides, tiny, monkeypatch):
    _fp16_scaler_with_overflows(monkeypatch, 2.0**-12, overflows=None)
    with pytest.raises(RuntimeError, match=r"loss scale to 6.1\d*e-05 \(< 0.0001; 2 overflow"):
        train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                       "trainer.max_steps=20", "trainer.max_bad_steps=100"]))


# ------------------------------------------------------------------- tokens per step


def test_real_tokens_per_step_are_recorded_and_estimated_at_start(tmp_path, data_overrides, tiny,
                                                                  caplog):
    """One epoch: the recorded mean real tokens per step x steps = every training sentence's
    length + eos, and the start-up estimate (from the sampler) equals the measured mean."""
    cfg = compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=null",
                   "trainer.max_epochs=1", "trainer.validate_every_steps=null",
                   "trainer.max_tokens=8192"])  # a few large steps make the epoch
    with caplog.at_level("INFO", logger="transformer_nmt.train"):
        summary = train(cfg)
    d = cfg.data
    src = TokenDataset(bin_prefix(d, d.train_split, d.src_lang))
    tgt = TokenDataset(bin_prefix(d, d.train_split, d.tgt_lang))
    steps = summary["steps"]
    per_step = summary["real_tokens_per_step"]
    assert per_step["tgt"] * steps == pytest.approx(int(tgt.sizes.sum()) + len(tgt))
    assert per_step["src"] * steps == pytest.approx(int(src.sizes.sum()) + len(src))
    sampler = LengthBucketSampler(src.sizes, tgt.sizes, 8192)
    est_src, est_tgt = train_data.real_tokens_per_step(sampler, 1, 1)
    assert (est_src, est_tgt) == pytest.approx((per_step["src"], per_step["tgt"]))
    assert f"{est_tgt:,.0f} real target tokens" in caplog.text


def test_dry_run_projection_arithmetic():
    """The bill of a dry run: the warm-up steps left out, tokens / seconds of the rest, MFU
    against world size x peak, wall time = the run's tokens / tokens per second,
    device-hours = that x world size."""
    from transformer_nmt.model.flops import peak_flops
    from transformer_nmt.train.dryrun import project

    out = project([30.0, 9.0, 0.5, 0.3, 0.7], [99.0, 99.0, 50_000.0, 40_000.0, 60_000.0],
                  total_steps=100_000, world_size=8, flops_per_token=2.0e9,
                  peak_flops_per_device=989e12, peak_memory_bytes=3 * 2**30, skip=2)
    assert out["measured_steps"] == 3 and out["warmup_steps"] == 2
    assert out["seconds_per_step"] == pytest.approx(0.5)
    assert out["tokens_per_s"] == pytest.approx(100_000.0)
    assert out["tokens_per_s_per_device"] == pytest.approx(12_500.0)
    assert out["tokens_per_step"] == pytest.approx(50_000.0)
    assert out["total_tokens"] == pytest.approx(100_000 * 50_000.0)
    assert out["mfu"] == pytest.approx(100_000 * 2.0e9 / (8 * 989e12))
    assert out["peak_memory_gib"] == 3.0
    assert out["projected_wall_hours"] == pytest.approx(100_000 * 50_000 / 100_000 / 3600)
    assert out["projected_device_hours"] == pytest.approx(8 * 100_000 * 0.5 / 3600)
    assert "projection" in out["note"]
    cpu = project([1.0], [10.0], total_steps=None, world_size=1, flops_per_token=1.0,
                  peak_flops_per_device=peak_flops("cpu (x86_64, 2 threads)", "fp32"),
                  peak_memory_bytes=None)
    assert cpu["measured_steps"] == 1 and cpu["mfu"] is None
    assert cpu["projected_wall_hours"] is None and cpu["peak_memory_gib"] is None
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_steps_wait_for_the_device_once_per_step(tmp_path, data_overrides, tiny,
                                                     monkeypatch):
    """On the GPU, with CUDA's own detector of synchronising calls (one warning each):
    between two steps' forward_backward calls (no logging, validation or checkpoint) the host
    waits for the device at most once."""
    import warnings

    marks: list[int] = []
    real_fb = train_mod.forward_backward
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def marking_fb(*args, **kwargs):
            marks.append(len(caught))
            return real_fb(*args, **kwargs)

        monkeypatch.setattr(train_mod, "forward_backward", marking_fb)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            summary = train(compose([*data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
                                     "trainer.max_steps=6", "trainer.update_freq=2",
                                     "trainer.compile=false", "trainer.log_every_steps=1000",
                                     "trainer.validate_every_steps=null"]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert summary["steps"] == 6 and len(marks) == 6
    per_step = [b - a for a, b in itertools.pairwise(marks)]
    assert max(per_step) <= 1, (per_step, [str(w.message) for w in caught][:10])
