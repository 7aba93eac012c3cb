"""Data parallelism as torchrun runs it (gloo, CPU): two ranks train exactly as one process that
accumulates two micro-batches per step, across an epoch boundary."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from unit.train import test_distributed as dist_tests

from transformer_nmt.cli import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix

data_overrides = dist_tests.data_overrides
TRAINER, _run = dist_tests.TRAINER, dist_tests._run
assert_same_training = dist_tests.assert_same_training


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
