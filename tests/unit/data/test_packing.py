"""Packed batches: rows of whole pairs with segments and positions, one shape per run, the
sampler's resumable position and consumed-sentence set as for padded batches."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.data.packing import (
    PackedSampler,
    PackLengthError,
    best_fit_rows,
    collate_packed,
    next_fit_rows,
)


def random_sizes(n: int, seed: int, high: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, high, n)
    tgt = np.clip(src + rng.integers(-5, 8, n), 0, None)
    return src, tgt


def _samples(src: np.ndarray, tgt: np.ndarray, batch: list[int]):
    return [(i, np.full(int(src[i]), 4 + i % 7), np.full(int(tgt[i]), 5 + i % 5))
            for i in batch]


def test_next_fit_rows_fill_each_row_while_both_sides_fit():
    # lengths with eos: (3, 4) (3, 4) (5, 1) (2, 2): 3+3 <= 8 and 4+4 <= 8; then 5 > 8-6
    assert next_fit_rows([3, 3, 5, 2], [4, 4, 1, 2], 8).tolist() == [0, 0, 1, 1]
    assert next_fit_rows([], [], 8).tolist() == []


def test_best_fit_puts_short_pairs_beside_long_ones():
    longer = np.array([10, 2, 7, 3, 8, 2])
    laid, starts = best_fit_rows(longer, np.arange(6), 10)
    rows = [laid[a:b].tolist() for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert rows == [[0], [4, 1], [2, 3], [5]]  # 10 | 8 + 2 | 7 + 3 | 2
    # among equal lengths the given order (the seed's tie-break) decides
    laid, _ = best_fit_rows(longer, np.array([5, 0, 1, 2, 3, 4]), 10)
    assert laid.tolist() == [0, 4, 5, 2, 3, 1]


def test_collated_rows_hold_whole_pairs_with_segments_and_positions():
    samples = [(0, np.array([7, 8]), np.array([9])), (1, np.array([10]), np.array([11, 12])),
               (2, np.array([13, 14, 15, 16]), np.array([17, 18, 19]))]
    b = collate_packed(samples, rows=2, length=6)
    assert b.packed and b.src_tokens.shape == b.tgt_in.shape == (2, 6)
    assert b.src_tokens.tolist() == [[7, 8, EOS_ID, 10, EOS_ID, PAD_ID],
                                     [13, 14, 15, 16, EOS_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 9, BOS_ID, 11, 12, PAD_ID],
                                 [BOS_ID, 17, 18, 19, PAD_ID, PAD_ID]]
    assert b.tgt_out.tolist() == [[9, EOS_ID, 11, 12, EOS_ID, PAD_ID],
                                  [17, 18, 19, EOS_ID, PAD_ID, PAD_ID]]
    assert b.src_segments.tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 0]]
    assert b.src_positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 0]]
    assert b.tgt_segments.tolist() == [[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]]
    assert b.tgt_positions.tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 0]]
    assert b.ntokens == 2 + 3 + 4 == int(b.tgt_out.ne(PAD_ID).sum())
    assert b.src_lengths.tolist() == [3, 2, 5] and b.tgt_lengths.tolist() == [2, 3, 4]
    assert collate_packed([], rows=2, length=6) is None
    with pytest.raises(ValueError, match="rows"):
        collate_packed(samples, rows=1, length=6)


def test_every_batch_has_one_shape_and_every_sentence_comes_once():
    src, tgt = random_sizes(700, seed=1)
    sampler = PackedSampler(src, tgt, 500, pack_length=48, seed=3)
    assert sampler.shape == (10, 48) and len(sampler) == sampler.num_batches
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(700))
    for batch in batches:
        b = collate_packed(_samples(src, tgt, batch), *sampler.shape)
        assert b.src_tokens.shape == b.tgt_out.shape == (10, 48)
        # padding only at row tails: a segment never follows padding
        for seg in (b.src_segments, b.tgt_segments):
            assert bool((seg[:, 1:].ne(0) <= seg[:, :-1].ne(0)).all())
        assert b.ntokens == int(tgt[batch].sum()) + len(batch)
    assert 0.5 < sampler.padding_efficiency <= 1.0


def test_a_pair_longer_than_the_pack_length_is_refused_naming_the_longest():
    src, tgt = np.array([3, 9, 4, 30]), np.array([3, 4, 12, 2])
    with pytest.raises(PackLengthError, match=r"pair 2 is 13 .*pack_length=12 .*longest is 31"
                       ) as info:
        PackedSampler(src, tgt, 100, pack_length=12)
    assert info.value.longest == 31 and info.value.index == 2
    # a pair the model's positions leave out does not count
    PackedSampler(src, tgt, 100, pack_length=13, max_positions=13)
    with pytest.raises(ValueError, match="pack_length=200"):
        PackedSampler(src, tgt, 100, pack_length=200)


@pytest.mark.parametrize("world_size", [1, 2])
def test_packed_resume_mid_epoch_is_exact(world_size):
    src, tgt = random_sizes(600, seed=5)

    def make(rank):
        return PackedSampler(src, tgt, 400, pack_length=64, seed=4, rank=rank,
                             world_size=world_size)

    for rank in range(world_size):
        reference = make(rank)
        reference.set_epoch(2)
        epoch2 = list(reference)
        interrupted = make(rank)
        interrupted.set_epoch(2)
        it = iter(interrupted)
        assert [next(it) for _ in range(3)] == epoch2[:3]
        resumed = make(rank)
        resumed.load_state_dict(interrupted.state_dict())
        resumed.set_epoch(2)
        assert list(resumed) == epoch2[3:]


def test_consumed_sentences_carry_over_to_another_world_size():
    """Two ranks take 4 batches each; one rank resumes from their consumed sentences and
    gives exactly the rest of the epoch, packed in its own rows."""
    src, tgt = random_sizes(600, seed=6)
    two = PackedSampler(src, tgt, 400, pack_length=64, seed=2, world_size=2)
    consumed = two.consumed(1, 4)
    one = PackedSampler(src, tgt, 400, pack_length=64, seed=2)
    one.resume_epoch(1, consumed)
    rest = [i for b in one for i in b]
    assert sorted(rest + consumed.tolist()) == list(range(600))
    for batch in one.epoch_batches(1):
        assert collate_packed(_samples(src, tgt, batch), *one.shape) is not None
