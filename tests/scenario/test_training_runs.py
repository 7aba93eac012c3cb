"""Training runs as separate processes on the synthetic reversal corpus (tests/conftest.py): a
run killed with SIGKILL resumes to the uninterrupted run's exact state, SIGTERM checkpoints and
exits 0, two ranks read the device once per step, and the golden loss curve."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import train_command, train_env, wait_for
from unit.train.test_loop import TRAINER

from transformer_nmt.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix


@pytest.fixture(scope="module")
def tiny(tiny_model) -> list[str]:
    """The tests' tiny model with the training-loop tests' trainer settings."""
    return [*tiny_model, *TRAINER]


@pytest.fixture(scope="module")
def data_overrides(synthetic_corpus) -> list[str]:
    """The default experiment on the prepared synthetic reversal corpus (2,000 pairs)."""
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides]


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, data_overrides, tiny):
    common = [*data_overrides, *tiny, "trainer.max_steps=25", "trainer.save_every_steps=5",
              "trainer.validate_every_steps=10"]
    ref_dir = tmp_path / "reference"
    # The uninterrupted reference runs alongside the run that gets killed (one thread each).
    reference = subprocess.Popen(train_command([*common, f"run_dir={ref_dir}"]), env=train_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(train_command([*common, f"run_dir={run_dir}"]), env=train_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(checkpoint_dir(run_dir) / "checkpoint_5.pt", proc)
        time.sleep(random.uniform(0.0, 0.5))
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _, err = reference.communicate(timeout=240)
        assert reference.returncode == 0, err[-3000:]
    finally:
        for p in (proc, reference):
            if p.poll() is None:
                p.kill()
                p.wait()
    killed_at = load_checkpoint(latest_checkpoint(run_dir))["train_state"]["step"]
    assert 5 <= killed_at < 25

    subprocess.run(train_command([*common, f"run_dir={run_dir}"]), env=train_env(), check=True,
                   capture_output=True, timeout=240)
    a = load_checkpoint(latest_checkpoint(ref_dir))
    b = load_checkpoint(latest_checkpoint(run_dir))
    assert a["train_state"]["step"] == b["train_state"]["step"] == 25
    assert json.loads((run_dir / "train_summary.json").read_text())["resumed_from"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), f"{key} differs after resume from {killed_at}"
    for k, state in a["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg_sq"], b["optimizer"]["state"][k]["exp_avg_sq"])
    for key in ("tokens_seen", "micro_step", "src_sq_seen", "tgt_sq_seen", "src_tgt_seen"):
        assert a["train_state"][key] == b["train_state"][key], key
    consumed = a["sampler"].pop("consumed"), b["sampler"].pop("consumed")
    assert a["sampler"] == b["sampler"] and torch.equal(*consumed)


def test_sigterm_checkpoints_and_exits_cleanly(tmp_path, data_overrides, tiny):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        train_command([*data_overrides, *tiny, f"run_dir={run_dir}", "trainer.max_steps=100000",
              "trainer.save_every_steps=5", "trainer.validate_every_steps=null"]),
        env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    wait_for(checkpoint_dir(run_dir) / "checkpoint_5.pt", proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["stopped_by"] == "signal SIGTERM"
    saved = load_checkpoint(latest_checkpoint(run_dir))
    assert saved["train_state"]["step"] == summary["steps"] >= 5
    # The data position (stored once, in the sampler part) is the micro-batches consumed.
    cfg = compose(data_overrides)
    d = cfg.data
    n = LengthBucketSampler(TokenDataset(bin_prefix(d, "train", d.src_lang)).sizes,
                            TokenDataset(bin_prefix(d, "train", d.tgt_lang)).sizes, 1024,
                            seed=cfg.trainer.seed).num_batches
    position = saved["sampler"]
    assert position["epoch"] * n + position["position"] == saved["train_state"]["micro_step"]


COUNTING_WORKER = """
import itertools, json, os, sys
import torch
import transformer_nmt.train.loop as loop
from transformer_nmt.config import compose

reads, marks = [], []
for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
    def wrap(original, name=name):
        def wrapper(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)
        return wrapper
    setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
real_fb = loop.forward_backward
def marking_fb(*args, **kwargs):
    marks.append(len(reads))
    return real_fb(*args, **kwargs)
loop.forward_backward = marking_fb
summary = loop.train(compose(sys.argv[2:]))
per_step = [b - a for a, b in itertools.pairwise(marks)]
with open(os.path.join(sys.argv[1], f"reads_{os.environ['RANK']}.json"), "w") as f:
    json.dump({"per_step": per_step, "steps": summary["steps"]}, f)
"""


def test_at_most_one_host_sync_per_step_on_two_ranks(tmp_path, data_overrides, tiny):
    """World size 2 (torchrun, gloo): the stop flags travel in the step's all-reduce of the
    losses and are read with its figures, so each rank still reads the device once per step
    (it read twice when the flags had an all-reduce and a tolist() of their own)."""
    worker = tmp_path / "count_reads.py"
    worker.write_text(COUNTING_WORKER)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(worker), str(tmp_path), *data_overrides, *tiny, f"run_dir={tmp_path / 'run'}",
         "trainer.max_steps=6", "trainer.update_freq=2", "trainer.log_every_steps=1000",
         "trainer.validate_every_steps=null", "trainer.save_every_minutes=null"],
        env=train_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"reads_{rank}.json").read_text())
        assert got["steps"] == 6 and len(got["per_step"]) == 5
        assert max(got["per_step"]) <= 1, (rank, got)


GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_copy_task.json"


GOLDEN_RTOL = 1e-4
"""Same torch build: the run is deterministic (fixed seed, one thread, fp32 on the CPU), so
the curve repeats bit for bit; 1e-4 leaves room only for a different CPU kernel (AVX2 against
AVX-512 sums in another order: last-bit fp32 differences, epsilon 1.2e-7, that 50 Adam steps
can amplify).
Any change to the model, loss, optimizer, schedule, batching or seeding moves the curve by far
more."""


GOLDEN_RTOL_OTHER_BUILD = 2e-2
"""Another torch version: kernels may change their summation order; 2 % still catches a
changed formula (label smoothing, scaling, schedule) in the first 50 steps."""


GOLDEN_OVERRIDES = [
    "model.dropout=0.1", "trainer.seed=1", "trainer.max_steps=50", "trainer.max_tokens=512",
    "trainer.warmup_steps=10", "trainer.lr_multiplier=1.0", "trainer.precision=fp32",
    "trainer.log_every_steps=1", "trainer.validate_every_steps=null",
    "trainer.save_every_steps=50", "trainer.save_every_minutes=null", "trainer.num_workers=0",
]


def test_golden_loss_curve_of_the_reversal_task(tmp_path, synthetic_corpus, tiny_model,
                                                 update_golden):
    """The first 50 training losses of the tiny model on the synthetic corpus (fixed seed, one
    thread, fp32, CPU) against tests/data/golden_copy_task.json. A deliberate change to the
    numerics regenerates the file with ``pytest tests/scenario/test_training_runs.py
    --update-golden``."""
    run = tmp_path / "run"
    overrides = [*synthetic_corpus.overrides, *tiny_model, *GOLDEN_OVERRIDES, f"run_dir={run}"]
    env = {**train_env(), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(train_command(overrides), env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 51))
    if update_golden:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({
            "about": "training loss per step (label-smoothed, per target token) of the tiny "
                     "model on the synthetic reversal corpus of tests/conftest.py; written by "
                     "pytest tests/scenario/test_training_runs.py --update-golden",
            "torch": torch.__version__, "overrides": GOLDEN_OVERRIDES,
            "rtol_same_torch": GOLDEN_RTOL, "rtol_other_torch": GOLDEN_RTOL_OTHER_BUILD,
            "losses": losses,
        }, indent=1) + "\n")
        pytest.skip(f"rewrote {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    assert golden["overrides"] == GOLDEN_OVERRIDES, "settings changed: regenerate the golden file"
    rtol = GOLDEN_RTOL if golden["torch"] == torch.__version__ else GOLDEN_RTOL_OTHER_BUILD
    assert losses[-1] < losses[0] - 1.0  # it learns
    for step, (got, want) in enumerate(zip(losses, golden["losses"], strict=True), start=1):
        assert got == pytest.approx(want, rel=rtol), (
            f"step {step}: loss {got!r}, golden {want!r} (rtol {rtol}, torch {torch.__version__}"
            f", golden from {golden['torch']})"
        )
