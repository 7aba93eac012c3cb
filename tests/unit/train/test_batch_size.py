"""The batch as a target (train/batch_size.py): update_freq derived from the sampler and the
world size, the refusal outside ±10 %, and max_tokens from a GPU's memory (mocked)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.errors import UserError
from transformer_nmt.fileio import bin_prefix
from transformer_nmt.train import batch_size
from transformer_nmt.train.batch_size import device_max_tokens, plan_batch

MAX_TOKENS = 96
TARGET = 2400
"""Real tokens per step of the test: about 30 micro-batches of MAX_TOKENS for one rank."""


def _trainer(**kw):
    base = {"max_tokens": MAX_TOKENS, "update_freq": 1, "tokens_per_step": TARGET,
            "tokens_per_step_tolerance": 0.1}
    return SimpleNamespace(**{**base, **kw})


def _sizes(overrides) -> tuple[np.ndarray, np.ndarray]:
    d = compose(list(overrides)).data
    return (TokenDataset(bin_prefix(d, "train", d.src_lang)).sizes,
            TokenDataset(bin_prefix(d, "train", d.tgt_lang)).sizes)


def _measure(rank: int, world: int, src: np.ndarray, tgt: np.ndarray, group=None) -> list[float]:
    """Real (source, target) tokens per optimizer step, averaged over the full steps of one
    epoch, as the training loop draws them: ``update_freq`` batches per rank, summed over
    ``world`` ranks (gloo) -- plus the update_freq chosen."""
    def make(mt):
        return LengthBucketSampler(src, tgt, mt, seed=1, rank=rank, world_size=world)

    plan = plan_batch(_trainer(), SimpleNamespace(name="tiny", d_model=32), make, world)
    batches = list(iter(plan.sampler))
    per_step = []
    for i in range(len(batches) // plan.update_freq):
        chunk = [ix for b in batches[i * plan.update_freq:(i + 1) * plan.update_freq] for ix in b]
        t = torch.tensor([float(src[chunk].sum() + len(chunk)),
                          float(tgt[chunk].sum() + len(chunk))])
        if group is not None:
            dist.all_reduce(t, group=group)
        per_step.append(t)
    mean = torch.stack(per_step).mean(0).tolist()
    return [*mean, plan.update_freq]


def _worker(rank: int, init: str, src: np.ndarray, tgt: np.ndarray, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=4)
    found = {4: _measure(rank, 4, src, tgt, dist.group.WORLD)}
    pair = dist.new_group([0, 1])
    if rank < 2:
        found[2] = _measure(rank, 2, src, tgt, pair)
    if rank == 0:
        found[1] = _measure(0, 1, src, tgt)
        Path(out).write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


def test_world_sizes_1_2_4_hold_the_target_per_step(synthetic_corpus, tmp_path):
    """gloo on CPU: the update_freq derived for 1, 2 and 4 ranks gives real tokens per
    optimizer step (counted from the batches drawn) within 10 % of the target and of each
    other."""
    src, tgt = _sizes(synthetic_corpus.overrides)
    out = tmp_path / "found.json"
    fd, name = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    os.unlink(name)
    # fork: the children inherit the imported modules (spawn would import torch four times).
    mp.start_processes(_worker, args=(f"file://{name}", src, tgt, str(out)), nprocs=4,
                       join=True, start_method="fork")
    found = {int(k): v for k, v in json.loads(out.read_text()).items()}
    assert sorted(found) == [1, 2, 4]
    freqs = [found[w][2] for w in (1, 2, 4)]
    # fewer micro-batches per rank with more ranks
    assert freqs[0] > freqs[1] > freqs[2] >= 1, freqs
    for side in (0, 1):
        values = [found[w][side] for w in (1, 2, 4)]
        assert all(abs(v / TARGET - 1) <= 0.1 for v in values), values
        assert max(values) / min(values) <= 1.1, values


def test_refused_outside_tolerance_unless_the_target_is_null(synthetic_corpus):
    src, tgt = _sizes(synthetic_corpus.overrides)

    def make(mt):
        return LengthBucketSampler(src, tgt, mt, seed=1)

    model = SimpleNamespace(name="tiny", d_model=32)
    # 64 ranks of one micro-batch each already hold far more than a 2,400-token step.
    with pytest.raises(UserError, match=r"tokens_per_step=2400: 64 rank\(s\) x update_freq 1 .*"
                       r"tokens_per_step=null"):
        plan_batch(_trainer(), model, make, world_size=64)
    plan = plan_batch(_trainer(tokens_per_step=None, update_freq=3), model, make, world_size=64)
    assert (plan.update_freq, plan.max_tokens) == (3, MAX_TOKENS)


def test_derive_update_freq_picks_the_closer_rounding():
    assert batch_size.derive_update_freq((3076.0, 3136.0), 25_000, 1) == 8
    assert batch_size.derive_update_freq((3076.0, 3136.0), 25_000, 8) == 1
    assert batch_size.derive_update_freq((3076.0, 3136.0), 25_000, 16) == 1  # refused later
    assert batch_size.derive_update_freq((1000.0, 1000.0), 2_600, 1) == 3  # 2.6 -> 3, not 2


GIB = 2**30


@pytest.mark.parametrize(("memory_gib", "expect_update_freq"), [(80, 1), (10, 2)])
def test_auto_max_tokens_from_mocked_gpu_memory(monkeypatch, synthetic_corpus, memory_gib,
                                                expect_update_freq):
    """trainer.auto_max_tokens: the budget comes from the (mocked) GPU's memory, and a step
    takes as few micro-batches as fit, the step itself staying the target."""
    base = SimpleNamespace(name="base", d_model=512)
    props = SimpleNamespace(name="Mocked GPU", total_memory=memory_gib * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    cap, line = batch_size.cuda_max_tokens(base, torch.device("cuda", 0))
    assert cap == device_max_tokens(base, memory_gib * GIB) and "Mocked GPU" in line
    assert "measured on an H200" in line
    # Scale the corpus so that one 25,000-token step needs about one 80 GiB micro-batch.
    src, tgt = _sizes(synthetic_corpus.overrides)

    def make(mt):
        return LengthBucketSampler(np.tile(src, 50), np.tile(tgt, 50), mt, seed=1)

    plan = plan_batch(_trainer(tokens_per_step=25_000, max_tokens=3600), base, make, 1,
                      device_cap=cap)
    assert plan.update_freq == expect_update_freq
    assert plan.max_tokens <= cap
    assert abs(plan.tgt_per_step / 25_000 - 1) <= 0.1


def test_device_table_orders_models_and_memory():
    base, big = SimpleNamespace(name="base", d_model=512), SimpleNamespace(name="big", d_model=1024)
    for gib in (16, 24, 40, 80, 141):
        assert 0 < device_max_tokens(big, gib * GIB) < device_max_tokens(base, gib * GIB)
    assert device_max_tokens(base, 80 * GIB) > 25_000  # the paper's batch in one micro-batch
    assert device_max_tokens(big, 2 * GIB) == 0
    assert device_max_tokens(base, 80 * GIB) % batch_size.MAX_TOKENS_MULTIPLE == 0


def test_setup_writes_the_derived_update_freq_into_the_config(synthetic_corpus, tiny_model,
                                                              tmp_path):
    """setup(): the loop, summary and checkpoints read the derived value from cfg.trainer."""
    from transformer_nmt.train.distributed import DistInfo
    from transformer_nmt.train.setup import setup

    cfg = compose([*synthetic_corpus.overrides, *tiny_model, f"run_dir={tmp_path}",
                   f"trainer.max_tokens={MAX_TOKENS}", f"trainer.tokens_per_step={TARGET}",
                   "trainer.update_freq=1", "trainer.auto_max_tokens=true"])
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    s = setup(cfg, info)
    assert cfg.trainer.max_tokens == MAX_TOKENS  # auto_max_tokens on CPU: as given
    _, tgt = s.sampler.real_tokens_per_batch
    uf = cfg.trainer.update_freq
    assert uf > 1 and abs(tgt * uf / TARGET - 1) <= 0.1
    assert s.steps_per_epoch == -(-len(s.sampler) // uf)
