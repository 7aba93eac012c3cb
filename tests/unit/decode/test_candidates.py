"""The per-row top-k of beam search on a CPU (transformer_nmt.decode.candidates.row_topk): the
values and columns of ``torch.topk``, a NaN first, masked columns last, on the vocabulary sizes
it takes blocks for and on those it leaves to ``torch.topk``."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_nmt.decode.candidates import block_width, candidates, row_topk


@pytest.mark.parametrize("vocab", [8000, 37000, 32000, 2048, 1000, 30])
@pytest.mark.parametrize("k", [1, 8, 10])
def test_row_topk_is_torch_topk(vocab, k):
    g = torch.Generator().manual_seed(vocab + k)
    x = torch.log_softmax(3 * torch.randn(37, vocab, generator=g), dim=-1)  # (R, V)
    x[:, :3] = -math.inf  # the masked specials
    values, columns = row_topk(x, k)
    want_values, want_columns = x.topk(k, dim=1)
    assert torch.equal(values, want_values) and torch.equal(columns, want_columns)


def test_row_topk_of_a_strided_matrix():
    x = torch.randn(8000, 20).t()  # (20, 8000), not contiguous
    values, columns = row_topk(x, 8)
    want_values, want_columns = x.topk(8, dim=1)
    assert torch.equal(values, want_values) and torch.equal(columns, want_columns)


def test_blocks_are_taken_where_they_pay():
    # the blocks divide the row, and there are at least 8 of them per wanted entry
    assert block_width(8000, 8) == 32 and block_width(37000, 8) == 40
    assert block_width(2048, 10) == 16 and block_width(2048, 8) == 32
    assert block_width(1000, 8) is None and block_width(8009, 8) is None  # a prime: no blocks


def test_a_row_holding_a_nan_has_it_first():
    """beam_search reads a non-finite row of a CPU's log_softmax (all NaN) from here."""
    logits = torch.randn(5, 8000)
    logits[1, 4000] = math.nan
    logits[2, 7999] = math.inf
    logits[3] = -math.inf
    lprobs = torch.log_softmax(logits, dim=-1)
    lprobs[:, :3] = -math.inf  # masking leaves the rest of a NaN row NaN
    values, _ = row_topk(lprobs, 8)
    assert values[:, 0].isnan().tolist() == [False, True, True, True, False]
    scores = torch.zeros(5, 1)
    cand_scores, _, _ = candidates(lprobs, scores, 4)
    assert cand_scores[:, 0].isnan().tolist() == [False, True, True, True, False]


def test_candidates_are_the_best_continuations_of_each_sentence():
    """The best 2K of all W x V continuations of a sentence, as a top-k over their sums."""
    g = torch.Generator().manual_seed(3)
    k, width, n = 4, 4, 6
    lprobs = torch.log_softmax(torch.randn(n * width, 8000, generator=g), dim=-1)
    scores = -torch.rand(n, width, generator=g) * 5
    got_scores, got_beams, got_tokens = candidates(lprobs, scores, k)
    sums = (scores.unsqueeze(-1) + lprobs.view(n, width, -1)).view(n, -1)  # (A, W*V)
    want_scores, flat = sums.topk(2 * k, dim=1)
    assert torch.equal(got_scores, want_scores)
    assert torch.equal(got_beams, flat // 8000) and torch.equal(got_tokens, flat % 8000)
