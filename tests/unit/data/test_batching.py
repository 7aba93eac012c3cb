"""Length-bucketed batching: budget, coverage across ranks, shuffling, resumption, collate."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.data.batching import (
    Batch,
    LengthBucketSampler,
    ParallelDataset,
    collate,
    make_batches,
    padding_efficiency,
)
from transformer_nmt.data.loader import build_dataloader


class FakeTokens:
    """In-memory stand-in for binarize.TokenDataset: ``.sizes``, ``len``, ``[i]``."""

    def __init__(self, seqs: list[list[int]]):
        self.seqs = [np.asarray(s, dtype=np.int64) for s in seqs]
        self.sizes = np.array([len(s) for s in self.seqs], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.seqs[i]


def random_sizes(n: int, seed: int, high: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, high, n)
    tgt = np.clip(src + rng.integers(-10, 25, n), 0, None)
    return src, tgt


def random_corpus(n: int, seed: int) -> ParallelDataset:
    rng = np.random.default_rng(seed)
    src_sizes, tgt_sizes = random_sizes(n, seed, high=20)
    src = FakeTokens([rng.integers(4, 100, k).tolist() for k in src_sizes])
    tgt = FakeTokens([rng.integers(4, 100, k).tolist() for k in tgt_sizes])
    return ParallelDataset(src, tgt)


def all_rank_batches(src, tgt, max_tokens, world_size, epoch, **kw) -> list[list[list[int]]]:
    out = []
    for rank in range(world_size):
        s = LengthBucketSampler(src, tgt, max_tokens, rank=rank, world_size=world_size, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


# ------------------------------------------------------------------------ budget


@pytest.mark.parametrize("max_tokens", [100, 300, 1000, 4096])
@pytest.mark.parametrize("size_multiple", [1, 8])
@pytest.mark.parametrize("with_target", [True, False])
def test_no_batch_over_budget(max_tokens, size_multiple, with_target):
    src, tgt = random_sizes(3000, seed=max_tokens)
    if not with_target:
        tgt = None
    sampler = LengthBucketSampler(src, tgt, max_tokens, seed=3, size_multiple=size_multiple)
    batches = sampler.epoch_batches(0)
    assert batches and all(batches)
    for b in batches:
        assert len(b) * (src[b].max() + 1) <= max_tokens
        if tgt is not None:
            assert len(b) * (tgt[b].max() + 1) <= max_tokens
        if size_multiple > 1 and len(b) >= size_multiple:
            assert len(b) % size_multiple == 0


def test_batches_are_full_length_buckets():
    # Greedy cutting in length order: adding the next sentence in length order to any
    # batch (but the last) would exceed the budget, unless the size was trimmed to a
    # multiple of 8.
    src, tgt = random_sizes(2000, seed=5)
    max_tokens = 500
    order_batches = make_batches(src, tgt, max_tokens, seed=2, size_multiple=1)
    flat = np.concatenate(order_batches)
    key = (src[flat] + 1) * 10_000 + tgt[flat]
    assert np.all(np.diff(key) >= 0)  # sorted by (source length, target length)
    for b, nxt in itertools.pairwise(order_batches):
        grown = np.append(b, nxt[0])
        cost = len(grown) * max(src[grown].max() + 1, tgt[grown].max() + 1)
        assert cost > max_tokens


def test_batch_sizes_grow_for_short_sentences():
    src = np.array([2] * 40 + [30] * 40)
    sampler = LengthBucketSampler(src, src, 120, shuffle=False, size_multiple=1)
    sizes = {len(src_b) for src_b in sampler.epoch_batches()}
    assert sizes == {40, 3, 1}  # 40 x 3 tokens; 3 x 31 tokens; the last one alone


# ----------------------------------------------------------------- ranks, epochs


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_example_once_per_epoch_across_ranks(world_size):
    src, tgt = random_sizes(1001, seed=7)
    for epoch in (0, 1):
        per_rank = all_rank_batches(src, tgt, 400, world_size, epoch, seed=11)
        lengths = {len(r) for r in per_rank}
        assert len(lengths) == 1  # every rank steps the same number of times
        seen = [i for r in per_rank for b in r for i in b]
        assert sorted(seen) == list(range(len(src)))
        sampler = LengthBucketSampler(src, tgt, 400, seed=11, world_size=world_size)
        assert lengths == {len(sampler)}
        assert len(sampler) == -(-sampler.num_batches // world_size)
        # Padding batches only at the end of a rank's epoch.
        for r in per_rank:
            empty = [k for k, b in enumerate(r) if not b]
            assert empty == list(range(len(r) - len(empty), len(r)))


def test_ranks_get_round_robin_of_one_shuffled_order():
    src, tgt = random_sizes(500, seed=8)
    full = all_rank_batches(src, tgt, 300, 1, epoch=4, seed=2)[0]
    split = all_rank_batches(src, tgt, 300, 3, epoch=4, seed=2)
    for rank in range(3):
        real = [b for b in split[rank] if b]
        assert real == full[rank::3]


def test_epochs_reshuffle_deterministically():
    src, tgt = random_sizes(800, seed=9)
    a = LengthBucketSampler(src, tgt, 300, seed=5)
    b = LengthBucketSampler(src, tgt, 300, seed=5)
    other_seed = LengthBucketSampler(src, tgt, 300, seed=6)
    a.set_epoch(1)
    b.set_epoch(1)
    other_seed.set_epoch(1)
    epoch1 = list(a)
    assert epoch1 == list(b)
    assert epoch1 != list(other_seed)
    a.set_epoch(2)
    epoch2 = list(a)
    assert epoch2 != epoch1
    assert sorted(map(tuple, epoch2)) == sorted(map(tuple, epoch1))  # same batches, new order
    assert list(a) == epoch2  # iterating again without set_epoch repeats the epoch


def test_no_shuffle_keeps_length_order():
    src, tgt = random_sizes(300, seed=10)
    sampler = LengthBucketSampler(src, tgt, 200, shuffle=False)
    batches = list(sampler)
    sampler.set_epoch(7)
    assert list(sampler) == batches
    firsts = [src[b[0]] for b in batches]
    assert firsts == sorted(firsts)


# ---------------------------------------------------------------------- resumption


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_mid_epoch(world_size):
    src, tgt = random_sizes(900, seed=12)

    def make(rank):
        return LengthBucketSampler(src, tgt, 350, seed=4, rank=rank, world_size=world_size)

    for rank in range(world_size):
        reference = make(rank)
        reference.set_epoch(3)
        epoch3 = list(reference)
        reference.set_epoch(4)
        epoch4 = list(reference)

        interrupted = make(rank)
        interrupted.set_epoch(3)
        it = iter(interrupted)
        consumed = [next(it) for _ in range(5)]
        state = interrupted.state_dict()
        assert state == {"epoch": 3, "position": 5, "seed": 4}
        assert consumed == epoch3[:5]

        resumed = make(rank)
        resumed.load_state_dict(state)
        resumed.set_epoch(3)  # the training loop re-announcing the epoch keeps the position
        assert resumed.state_dict() == state
        assert list(resumed) == epoch3[5:]
        assert resumed.state_dict()["position"] == len(resumed)
        resumed.set_epoch(4)
        assert list(resumed) == epoch4


def test_resume_at_epoch_end_and_bad_state():
    src, tgt = random_sizes(200, seed=13)
    sampler = LengthBucketSampler(src, tgt, 300, seed=1)
    sampler.load_state_dict({"epoch": 2, "position": len(sampler), "seed": 1})
    assert list(sampler) == []
    with pytest.raises(ValueError, match="seed 9"):
        sampler.load_state_dict({"epoch": 2, "position": 0, "seed": 9})
    with pytest.raises(ValueError, match="position"):
        sampler.load_state_dict({"epoch": 2, "position": len(sampler) + 1, "seed": 1})


# ---------------------------------------------------------------- over-long input


def test_overlong_sentence_names_index():
    src = np.array([3, 4, 5, 2, 9])
    tgt = np.array([3, 4, 20, 2, 3])
    with pytest.raises(ValueError, match=r"example 2 .*max_tokens=16.*target length 21"):
        LengthBucketSampler(src, tgt, 16)
    with pytest.raises(ValueError, match=r"example 4 .*source length 10"):
        LengthBucketSampler(src, None, 8)


def test_overlong_sentences_can_be_skipped():
    src = np.array([3, 40, 5, 2, 50])
    sampler = LengthBucketSampler(src, src, 20, skip_too_long=True)
    assert sampler.num_skipped == 2 and sampler.skipped.tolist() == [1, 4]
    seen = sorted(i for b in sampler for i in b)
    assert seen == [0, 2, 3]


# ------------------------------------------------------------------ efficiency


def test_padding_efficiency_hand_made():
    # Lengths with eos/bos: source 2, 3, 4; target 4, 2, 2. One batch of three:
    # real 9 + 8 = 17, padded 3 x 4 + 3 x 4 = 24.
    src, tgt = [1, 2, 3], [3, 1, 1]
    sampler = LengthBucketSampler(src, tgt, 100, size_multiple=1)
    assert sampler.num_batches == 1
    assert sampler.padding_efficiency == pytest.approx(17 / 24)
    assert padding_efficiency([[0, 1, 2]], src, tgt) == pytest.approx(17 / 24)
    # Source only, two batches {0, 1}, {2}: real 2 + 3 + 4 = 9, padded 2 x 3 + 4 = 10.
    assert padding_efficiency([[0, 1], [2]], src, None) == pytest.approx(9 / 10)


def test_padding_efficiency_matches_collated_batches():
    ds = random_corpus(400, seed=14)
    sampler = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 200, seed=3)
    real = padded = 0
    for idx in sampler:
        batch = collate([ds[i] for i in idx])
        real += int((batch.src_tokens != PAD_ID).sum()) + batch.ntokens
        padded += batch.src_tokens.numel() + batch.tgt_out.numel()
    assert sampler.padding_efficiency == pytest.approx(real / padded)
    assert sampler.padding_efficiency == pytest.approx(
        padding_efficiency(sampler.epoch_batches(), ds.src_sizes, ds.tgt_sizes)
    )


# ------------------------------------------------------------------------ collate


def test_collate_hand_made():
    src = FakeTokens([[10, 11, 12], [13], []])
    tgt = FakeTokens([[20], [21, 22, 23], [24, 25]])
    ds = ParallelDataset(src, tgt)
    batch = collate([ds[2], ds[0], ds[1]])
    E, B, P = EOS_ID, BOS_ID, PAD_ID
    assert batch.ids.tolist() == [2, 0, 1]
    assert batch.src_tokens.tolist() == [[E, P, P, P], [10, 11, 12, E], [13, E, P, P]]
    assert batch.src_lengths.tolist() == [1, 4, 2]
    assert batch.tgt_in.tolist() == [[B, 24, 25, P], [B, 20, P, P], [B, 21, 22, 23]]
    assert batch.tgt_out.tolist() == [[24, 25, E, P], [20, E, P, P], [21, 22, 23, E]]
    assert batch.ntokens == 3 + 2 + 4 and batch.nsentences == 3
    for t in (batch.ids, batch.src_tokens, batch.src_lengths, batch.tgt_in, batch.tgt_out):
        assert t.dtype == torch.long


def test_collate_without_target_and_empty():
    ds = ParallelDataset(FakeTokens([[5, 6], [7]]))
    assert ds.tgt_sizes is None and ds[1][2] is None
    batch = collate([ds[0], ds[1]])
    assert batch.src_tokens.tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert batch.tgt_in is None and batch.tgt_out is None and batch.ntokens == 0
    assert collate([]) is None
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.src_tokens, batch.src_tokens)


def test_parallel_dataset_length_mismatch():
    with pytest.raises(ValueError, match="3 source sentences .* 2 target sentences"):
        ParallelDataset(FakeTokens([[1], [2], [3]]), FakeTokens([[1], [2]]))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_yields_batches_and_none_padding(num_workers):
    ds = random_corpus(61, seed=15)
    num_batches = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 60, seed=2).num_batches
    world_size = next(w for w in (2, 3, 4, 5) if num_batches % w)  # some rank runs short
    per_rank = []
    for rank in range(world_size):
        sampler = LengthBucketSampler(
            ds.src_sizes, ds.tgt_sizes, 60, seed=2, rank=rank, world_size=world_size
        )
        sampler.set_epoch(1)
        loader = build_dataloader(ds, sampler, num_workers=num_workers)
        items = list(loader)
        assert len(items) == len(sampler) == len(loader)
        per_rank.append(items)
    assert any(item is None for items in per_rank for item in items)
    ids = sorted(i for items in per_rank for b in items if b is not None for i in b.ids.tolist())
    assert ids == list(range(len(ds)))
    # Tokens survive the trip: each row holds the example's source ids then eos.
    for items in per_rank:
        for b in items:
            if b is None:
                continue
            for row, i in zip(b.src_tokens.tolist(), b.ids.tolist()):
                n = int(ds.src_sizes[i])
                assert row[:n] == ds[i][1].tolist() and row[n] == EOS_ID


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_batches_move_to_gpu():
    ds = random_corpus(50, seed=16)
    sampler = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 100, seed=1)
    for batch in build_dataloader(ds, sampler, pin_memory=True):
        assert batch.src_tokens.is_pinned() and batch.tgt_out.is_pinned()
        on_gpu = batch.to("cuda")
        assert on_gpu.tgt_in.is_cuda and torch.equal(on_gpu.tgt_in.cpu(), batch.tgt_in)


def _wait_until_ignored(pid: int, signals, timeout: float = 30.0) -> None:
    """Wait until process ``pid`` ignores every signal of ``signals`` (Linux: SigIgn in
    /proc/<pid>/status); a worker just forked may not have run its worker_init_fn yet."""
    import time

    want = sum(1 << (int(s) - 1) for s in signals)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(next(line.split()[1] for line in status.splitlines()
                           if line.startswith("SigIgn:")), 16)
        if ignored & want == want:
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not ignore the stop signals within {timeout} s")


def test_loader_workers_survive_stop_signals():
    """SLURM signals every process of the job: the workers must leave the stop signals to
    the training process, which checkpoints, instead of dying and failing the loader."""
    import os
    import signal

    ds = random_corpus(400, seed=3)
    sampler = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 64, shuffle=False)
    loader = build_dataloader(ds, sampler, num_workers=2)
    it = iter(loader)
    first = next(it)
    stops = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
    for worker in it._workers:  # each worker past its worker_init_fn (SigIgn set), then signalled
        _wait_until_ignored(worker.pid, stops)
        for sig in stops:
            os.kill(worker.pid, sig)
    rest = list(it)
    assert all(w.exitcode in (None, 0) for w in it._workers)
    seen = sorted(int(i) for b in [first, *rest] for i in b.ids)
    assert seen == list(range(len(ds)))


def test_lengths_rounded_to_a_multiple_stay_within_the_budget():
    """pad_to_multiple=8: every collated length is a multiple of 8 (capped at max_length),
    nothing real changes, and the sampler budgets the rounded lengths, so no padded batch
    exceeds max_tokens."""
    ds = ParallelDataset(FakeTokens([[10, 11, 12], [13]]), FakeTokens([[20], [21] * 9]))
    batch = collate([ds[0], ds[1]], pad_to_multiple=8)
    plain = collate([ds[0], ds[1]])
    assert batch.src_tokens.shape == (2, 8) and batch.tgt_out.shape == (2, 16)
    assert torch.equal(batch.src_tokens[:, :4], plain.src_tokens)
    assert bool(batch.src_tokens[:, 4:].eq(PAD_ID).all())
    assert torch.equal(batch.tgt_out[:, :10], plain.tgt_out) and batch.ntokens == plain.ntokens
    assert collate([ds[0], ds[1]], pad_to_multiple=8, max_length=12).tgt_out.shape == (2, 12)

    corpus = random_corpus(300, seed=21)
    max_tokens = 200
    sampler = LengthBucketSampler(corpus.src_sizes, corpus.tgt_sizes, max_tokens, seed=3,
                                  pad_to_multiple=8)
    for indices in sampler:
        b = collate([corpus[i] for i in indices], pad_to_multiple=8)
        assert b.src_tokens.numel() <= max_tokens and b.tgt_out.numel() <= max_tokens
