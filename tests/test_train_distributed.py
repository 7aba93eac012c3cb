"""Data parallelism on CPU (gloo): two ranks equal one process accumulating two micro-batches."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_nmt.checkpoint import latest_checkpoint, load_checkpoint
from transformer_nmt.cli import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix
from transformer_nmt.train import distributed

TRAINER = [
    "model.dropout=0.0",
    "trainer.warmup_steps=8", "trainer.lr_multiplier=1.0", "trainer.save_every_minutes=null",
    "trainer.validate_every_steps=null", "trainer.log_every_steps=5", "trainer.num_workers=0",
]


@pytest.fixture(scope="module")
def data_overrides(synthetic_corpus) -> list[str]:
    """The default experiment on the prepared synthetic reversal corpus."""
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides]


def _run(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(args, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{args[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_single_process_helpers_are_no_ops(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    info = distributed.init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.is_main, info.distributed) == (0, 1, True, False)
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.all_gather_object(3) == [3]
    distributed.barrier()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2"):
        distributed.init_distributed(device="cpu")


def test_two_ranks_equal_one_process_with_update_freq_2(tmp_path, data_overrides, tiny_model):
    cfg = compose(data_overrides)
    d = cfg.data
    src = TokenDataset(bin_prefix(d, "train", d.src_lang))
    tgt = TokenDataset(bin_prefix(d, "train", d.tgt_lang))
    # An odd number of batches: in the last round of the epoch rank 1 has no batch ([]),
    # runs a zero-weight dummy, and the single process takes a one-micro-batch step.
    for max_tokens in range(600, 1200, 16):
        n = LengthBucketSampler(src.sizes, tgt.sizes, max_tokens, seed=1).num_batches
        if n % 2 == 1 and n >= 9:
            break
    else:
        pytest.fail("no max_tokens in [600, 1200) gives an odd number of batches")
    steps_per_epoch = math.ceil(n / 2)
    max_steps = steps_per_epoch + 2  # cross the epoch boundary
    common = [*data_overrides, *tiny_model, *TRAINER, f"trainer.max_tokens={max_tokens}",
              f"trainer.max_steps={max_steps}"]

    ddp_dir = tmp_path / "ddp"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "-m", "transformer_nmt.cli.train", *common, f"run_dir={ddp_dir}",
          "trainer.update_freq=1"])
    one_dir = tmp_path / "one"
    _run([sys.executable, "-m", "transformer_nmt.cli.train", *common, f"run_dir={one_dir}",
          "trainer.update_freq=2"])

    assert_same_training(ddp_dir, one_dir, max_steps, world_size=2)
    assert Path(ddp_dir, "metrics.jsonl").is_file()


def _without_key_bias(key: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` with the key projection's bias zeroed (``in_proj.bias[d:2d]``,
    ``kv_proj.bias[:d]``). Softmax is invariant to it, so its exact gradient is zero: what
    it gets is round-off, which Adam scales up to learning-rate-sized steps of any sign, and
    a run summing its gradients in another order drifts there (by about 0.05 after 11 steps
    of the 4-rank test) while every other parameter agrees to 1e-5."""
    if key.endswith(("in_proj.bias", "kv_proj.bias")):
        d = value.shape[0] // (3 if key.endswith("in_proj.bias") else 2)
        start = d if key.endswith("in_proj.bias") else 0
        value = value.clone()
        value[start:start + d] = 0
    return value


def assert_same_training(ddp_dir: Path, one_dir: Path, max_steps: int, world_size: int) -> None:
    """The run in ``ddp_dir`` (``world_size`` ranks) trained the same model as the one process
    in ``one_dir``: the same steps, tokens and epochs, parameters and Adam moments equal to
    float32 round-off, every rank's RNG state kept."""
    ddp = json.loads((ddp_dir / "train_summary.json").read_text())
    one = json.loads((one_dir / "train_summary.json").read_text())
    assert ddp["world_size"] == world_size and one["world_size"] == 1
    assert ddp["steps"] == one["steps"] == max_steps
    assert ddp["tokens_seen"] == one["tokens_seen"] > 0
    assert ddp["epochs"] == pytest.approx(one["epochs"]) and ddp["epochs"] > 1

    a = load_checkpoint(latest_checkpoint(ddp_dir))
    b = load_checkpoint(latest_checkpoint(one_dir))
    assert a["train_state"]["step"] == b["train_state"]["step"] == max_steps
    assert len(a["rng"]) == world_size and len(b["rng"]) == 1  # every rank's RNG state is kept
    for key, value in a["model"].items():
        value, other = _without_key_bias(key, value), _without_key_bias(key, b["model"][key])
        assert torch.allclose(value, other, rtol=1e-4, atol=1e-5), (
            f"{key}: max difference {(value - other).abs().max().item():.3g}"
        )
    exp_a = a["optimizer"]["state"]
    exp_b = b["optimizer"]["state"]
    for k in exp_a:
        assert torch.allclose(exp_a[k]["exp_avg"], exp_b[k]["exp_avg"], rtol=1e-4, atol=1e-7)
