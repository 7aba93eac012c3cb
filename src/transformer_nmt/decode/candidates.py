"""A beam search step's candidates (:func:`candidates`) and the per-row top-k they start from
(:func:`row_topk`, on a CPU a two-stage ``torch.topk``).

Beam search (:func:`~transformer_nmt.decode.beam_search.beam_search`, paper section 6.1) takes
the best 2K tokens of each row of an (R, V) matrix of log-probabilities at every step, then the
best 2K continuations of each sentence among its beams' ones. ``torch.topk`` on a CPU
keeps a partial sort over all V (value, index) pairs of a row; :func:`row_topk` reads the row
once with a vectorised maximum over blocks of B columns, then sorts only the k blocks with the
largest maxima (the k largest entries of a row lie in them: any entry outside those blocks is
at most the k-th largest block maximum, itself an entry of its own block). Timings are in
docs/benchmarks.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK_WIDTHS = (32, 40, 50, 48, 64, 25, 20, 16)
"""Block widths B that :func:`block_width` tries, in order: the first that divides V."""

MIN_BLOCKS_PER_K = 8
""":func:`row_topk` uses blocks only when a row holds at least this many blocks per wanted
entry (else the second stage would sort nearly the whole row)."""


def block_width(vocab: int, k: int) -> int | None:
    """The block width B of :func:`row_topk` for rows of ``vocab`` entries, or None (use
    ``torch.topk`` directly): the first of :data:`BLOCK_WIDTHS` dividing ``vocab`` into at
    least ``MIN_BLOCKS_PER_K * k`` blocks."""
    for width in BLOCK_WIDTHS:
        if vocab % width == 0 and vocab // width >= MIN_BLOCKS_PER_K * k:
            return width
    return None


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of every row, best first, as ``torch.topk(x, k, dim=1)``.

    Args:
        x: (R, V) float.
        k: entries wanted per row, 1 <= k <= V.

    Returns:
        ``(values, indices)``, each (R, k): the same values as ``torch.topk``; NaN counts as
        the largest value, as there, so a row holding a NaN has one first. Among equal values
        the columns may differ from those ``torch.topk`` would pick.

    On a CPU, when :func:`block_width` finds a block width, the two stages of the module
    docstring; otherwise (other devices, small V) ``torch.topk`` itself.
    """
    rows, vocab = x.shape
    width = block_width(vocab, k) if x.device.type == "cpu" else None
    if width is None or rows == 0:
        return x.topk(k, dim=1)
    blocks = vocab // width
    block_max = x.reshape(rows, blocks, width).amax(dim=-1)  # (R, V/B); NaN propagates
    best_blocks = block_max.topk(k, dim=1).indices.sort(dim=1).values  # (R, k) in column order
    columns = (best_blocks.unsqueeze(-1) * width
               + torch.arange(width, device=x.device)).view(rows, k * width)  # (R, k*B)
    values, where = x.gather(1, columns).topk(k, dim=1)  # (R, k)
    return values, columns.gather(1, where)


def candidates(lprobs: Tensor, scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best C = min(2K, W*C') extensions of each sentence's W beams, best first.

    Args:
        lprobs: (A*W, V) constrained log-probabilities of the next token.
        scores: (A, W) cumulative log-probabilities of the beams.
        k: the beam size K.

    Returns:
        ``(scores, beams, tokens)``, each (A, C): the extension's cumulative log-probability,
        the beam within the sentence it extends, the token it adds. The best 2K of a sentence
        are among the best C' = min(2K, V) of each of its rows (:func:`row_topk`). A NaN among
        a sentence's log-probabilities comes first (``scores[:, 0]`` is NaN).
    """
    n_act, width = scores.shape
    per_row = min(2 * k, lprobs.size(-1))
    row_lp, row_tokens = row_topk(lprobs, per_row)  # (A*W, C'), sorted best first
    cand = (scores.view(-1, 1) + row_lp).view(n_act, width * per_row)  # (A, W*C')
    cand_scores, cand_pos = cand.topk(min(2 * k, width * per_row), dim=1)  # (A, C)
    cand_tokens = row_tokens.view(n_act, -1).gather(1, cand_pos)  # (A, C)
    return cand_scores, cand_pos // per_row, cand_tokens
