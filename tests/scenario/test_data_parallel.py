"""Data parallelism with real processes (gloo, CPU): two ranks under torchrun train exactly as one
process that accumulates two micro-batches per step, across an epoch boundary; the bf16 gradient
compression hook on two ranks; two ranks with the whole step (trainer.cuda_graphs) as one process
too."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from unit.train import test_distributed as dist_tests

from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix

data_overrides = dist_tests.data_overrides
TRAINER, _run = dist_tests.TRAINER, dist_tests._run
assert_same_training = dist_tests.assert_same_training
_bf16_hook_worker = dist_tests._bf16_hook_worker


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


def test_bf16_gradient_compression_equals_fp32_all_reduce_within_bf16(tmp_path):
    """DDP refuses the bf16 hook on gloo, so the hook itself runs on two gloo ranks on a real
    gradient: the mean it returns equals the float32 mean to bf16's precision (8-bit mantissa,
    relative 2^-8 per rounding: the two ranks' values and their sum)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_bf16_hook_worker, args=(port, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert got["bf16"].dtype == torch.float32 and got["bf16"].shape == got["fp32"].shape
        assert not torch.equal(got["bf16"], got["fp32"])  # it was compressed
        scale = got["fp32"].abs().max()
        torch.testing.assert_close(got["bf16"], got["fp32"], rtol=2**-7, atol=float(scale) * 2**-8)


def test_two_ranks_with_the_whole_step_equal_one_process_with_update_freq_2(
        tmp_path, data_overrides, tiny_model):
    """trainer.cuda_graphs (the whole step, eager on the CPU) under torchrun: two ranks with
    one packed micro-batch each train as one process with update_freq 2, across an epoch
    boundary (with an odd number of batches rank 1 runs an all-padding micro-batch of weight
    0 in the epoch's last step)."""
    from transformer_nmt.data.packing import PackedSampler

    cfg = compose(data_overrides)
    d = cfg.data
    src = TokenDataset(bin_prefix(d, "train", d.src_lang))
    tgt = TokenDataset(bin_prefix(d, "train", d.tgt_lang))
    pack_length = int(max(src.sizes.max(), tgt.sizes.max())) + 1
    for max_tokens in range(600, 1200, 16):
        n = len(PackedSampler(src.sizes, tgt.sizes, max_tokens, pack_length=pack_length,
                              seed=cfg.trainer.seed))
        if n % 2 == 1 and n >= 5:
            break
    else:
        pytest.fail("no max_tokens in [600, 1200) gives an odd number of packed batches")
    max_steps = math.ceil(n / 2) + 2  # cross the epoch boundary
    common = [*data_overrides, *tiny_model, *TRAINER, f"trainer.max_tokens={max_tokens}",
              f"trainer.max_steps={max_steps}", "trainer.packing=true",
              f"trainer.pack_length={pack_length}", "trainer.cuda_graphs=true"]
    ddp_dir = tmp_path / "ranks"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "-m", "transformer_nmt.cli.train", *common, f"run_dir={ddp_dir}",
          "trainer.update_freq=1"])
    one_dir = tmp_path / "one"
    _run([sys.executable, "-m", "transformer_nmt.cli.train", *common, f"run_dir={one_dir}",
          "trainer.update_freq=2"])
    assert_same_training(ddp_dir, one_dir, max_steps, world_size=2)
