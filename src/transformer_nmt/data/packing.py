"""Packed batches (``trainer.packing``): whole sentence pairs laid end to end in rows of a
fixed length, so that a micro-batch has one static shape and padding only at row tails.

Pipeline position: binarize -> **packing** (:class:`PackedSampler` gives the indices,
:func:`collate_packed` the tensors) -> train. Decoding and validation keep the padded batches
of :mod:`transformer_nmt.data.batching`.

Layout
    A micro-batch is ``R`` rows x ``L`` positions (``L = pack_length``, ``R = max_tokens //
    L``) on each side. Source row ``r`` holds ``src + [eos]`` of its pairs one after the
    other, target rows ``r`` hold ``[bos] + tgt`` (``tgt_in``) and ``tgt + [eos]``
    (``tgt_out``) of the same pairs in the same order. Each position carries a segment id (0
    = padding, 1, 2, ... for the pairs of its row) and a position id that restarts at 0 for
    every sentence; the model's attention stays within a segment
    (:func:`transformer_nmt.model.transformer.segment_attn_mask`).

Which pairs go together (:meth:`PackedSampler._compose`, :func:`best_fit_rows`)
    Each row is filled *best-fit decreasing* on a pair's longer side (``max(source,
    target)`` with eos / bos): it starts with the longest pair left, then takes, while one
    fits, the longest pair left that fits the room that remains; so long pairs share their
    rows with short ones. Among pairs of one length the order is the padded sampler's random
    tie-break from ``seed``. ``R`` consecutive rows make a batch, and the batch gives its
    pairs row by row. :func:`collate_packed` lays a batch's pairs into rows *next-fit* in
    that order (:func:`next_fit_rows`: a pair joins the current row while both its source
    and target fit); greedy filling of a sequence is never worse than any split of it into
    consecutive rows, so the batch's pairs fit its ``R`` rows. Everything else (the
    composition fixed from ``seed``, each epoch's batch order, the round robin over ranks,
    the resumable position, the consumed-sentence set across GPU counts) is
    :class:`LengthBucketSampler`'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.data.batching import LengthBucketSampler, _length_order
from transformer_nmt.data.collate import Batch

__all__ = ["PackLengthError", "PackedSampler", "best_fit_rows", "collate_packed",
           "next_fit_rows", "packed_rows"]


class PackLengthError(ValueError):
    """A pair longer than the pack length. ``index``: the first such pair; ``longest``: the
    longest pair's length (either side, eos included)."""

    def __init__(self, message: str, index: int, longest: int) -> None:
        super().__init__(message)
        self.index, self.longest = index, longest


def packed_rows(max_tokens: int, pack_length: int) -> int:
    """Rows R of a packed micro-batch: ``max_tokens // pack_length``.

    Raises:
        ValueError: ``pack_length`` below 1 or above ``max_tokens`` (no row would fit).
    """
    if int(pack_length) < 1 or int(pack_length) > int(max_tokens):
        raise ValueError(f"pack_length={pack_length} must lie in [1, max_tokens={max_tokens}]")
    return int(max_tokens) // int(pack_length)


def next_fit_rows(src_len: Sequence[int] | np.ndarray, tgt_len: Sequence[int] | np.ndarray,
                  length: int) -> np.ndarray:
    """The row of each sentence, in the given order, when rows of ``length`` positions are
    filled next-fit: a sentence joins the current row while both its source and its target
    still fit, else it opens the next row.

    Args:
        src_len, tgt_len: (n,) lengths (eos / bos included), each at most ``length``.

    Returns:
        (n,) int64 row numbers, nondecreasing from 0.
    """
    rows = np.empty(len(src_len), dtype=np.int64)
    row = fill_s = fill_t = 0
    length = int(length)
    for i, (s, t) in enumerate(zip(np.asarray(src_len).tolist(),
                                   np.asarray(tgt_len).tolist(), strict=True)):
        if fill_s + s <= length and fill_t + t <= length:
            fill_s += s
            fill_t += t
        else:
            row += 1
            fill_s, fill_t = s, t
        rows[i] = row
    return rows


def best_fit_rows(longer: np.ndarray, order: np.ndarray, length: int) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    """Rows of at most ``length`` positions, filled best-fit decreasing (module docstring).

    Args:
        longer: (N,) each pair's longer side (eos / bos included), each at most ``length``.
        order: (M,) the pairs to lay out; among equal lengths, taken in this order.
        length: positions per row.

    Returns:
        ``(laid, starts)``: ``laid`` (M,) int64 the pairs row by row, ``starts`` (rows + 1,)
        int64 offsets into it (row ``r`` is ``laid[starts[r]:starts[r+1]]``).
    """
    if len(order) == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    by_length = order[np.argsort(longer[order], kind="stable")]  # ascending, ties in order
    values, first, counts = np.unique(longer[by_length], return_index=True, return_counts=True)
    values = values.tolist()
    next_of = dict(zip(values, first.tolist(), strict=True))  # next pair of each length
    end_of = dict(zip(values, (first + counts).tolist(), strict=True))
    available = list(values)  # ascending lengths with pairs left
    pairs = by_length.tolist()
    laid: list[int] = []
    starts = [0]

    def take(j: int) -> int:
        value = available[j]
        laid.append(pairs[next_of[value]])
        next_of[value] += 1
        if next_of[value] == end_of[value]:
            del available[j]
        return value

    while available:
        room = length - take(len(available) - 1)  # the longest pair left opens the row
        while True:
            j = bisect.bisect_right(available, room) - 1  # the longest pair that fits
            if j < 0:
                break
            room -= take(j)
        starts.append(len(laid))
    return np.asarray(laid, dtype=np.int64), np.asarray(starts, dtype=np.int64)


class PackedSampler(LengthBucketSampler):
    """Batch sampler of packed micro-batches: each batch is the pairs of ``rows`` rows of
    ``pack_length`` positions (module docstring), in row order.

    Args:
        src_sizes, tgt_sizes, max_tokens: as :class:`LengthBucketSampler`; ``max_tokens``
            sets the rows, ``max_tokens // pack_length``.
        pack_length: positions per row, at least the longest pair kept (either side, eos or
            bos included).
        **kwargs: ``shuffle``, ``seed``, ``rank``, ``world_size``, ``skip_too_long``,
            ``max_positions`` as :class:`LengthBucketSampler` (``size_multiple`` and
            ``pad_to_multiple`` do not apply: the shape is fixed).

    Raises:
        PackLengthError: a kept pair longer than ``pack_length`` (naming the first and the
            longest).
        ValueError: ``pack_length`` outside [1, ``max_tokens``]; the errors of
            :class:`LengthBucketSampler`.
    """

    def __init__(self, src_sizes, tgt_sizes, max_tokens: int, *, pack_length: int,
                 **kwargs) -> None:
        if tgt_sizes is None:
            raise ValueError("packed batches need a target side")
        kwargs.pop("size_multiple", None)
        kwargs.pop("pad_to_multiple", None)
        self.pack_length = int(pack_length)
        self.rows = packed_rows(max_tokens, pack_length)
        super().__init__(src_sizes, tgt_sizes, max_tokens, size_multiple=1, **kwargs)

    def _compose(self, keep: np.ndarray,
                 rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """Lay ``keep`` into rows (:func:`best_fit_rows`, ties broken by ``rng``) and cut
        every ``rows`` rows: ``(order, bounds)`` as
        :func:`~transformer_nmt.data.batching._bucket`."""
        longer = np.maximum(self._src_len, self._tgt_len)
        too_long = keep[longer[keep] > self.pack_length]
        if len(too_long):
            longest = int(longer[keep].max())
            first = int(too_long[0])
            raise PackLengthError(
                f"pair {first} is {int(longer[first])} tokens long (eos included), longer "
                f"than pack_length={self.pack_length} ({len(too_long)} such pair(s); the "
                f"longest is {longest})", first, longest)
        order = _length_order(self._src_len, self._tgt_len, keep, rng)
        laid, starts = best_fit_rows(longer, order, self.pack_length)
        bounds = starts[::self.rows]  # every rows-th row starts a batch
        if bounds[-1] != starts[-1]:
            bounds = np.append(bounds, starts[-1])
        return laid, bounds.astype(np.int64)

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / positions over all batches (all ranks), source + target: every
        batch has ``rows x pack_length`` positions a side."""
        if self.num_batches == 0:
            return 1.0
        real = self._src_len[self._order].sum() + self._tgt_len[self._order].sum()
        return float(real / (2 * self.num_batches * self.rows * self.pack_length))

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, pack_length)``: the shape of every batch's tensors."""
        return self.rows, self.pack_length


def collate_packed(samples: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
                   rows: int, length: int) -> Batch | None:
    """Lay ``(i, src_ids, tgt_ids)`` samples into a packed :class:`Batch` of shape
    ``(rows, length)`` (module docstring), the rows filled next-fit in the given order.

    The batch's ``src_tokens``, ``tgt_in``, ``tgt_out`` are (R, L) long;
    ``src_segments`` / ``tgt_segments`` (R, L) int32 (0 = padding, k = the row's k-th pair);
    ``src_positions`` / ``tgt_positions`` (R, L) long, restarting at 0 for each sentence (0 on
    padding); ``src_lengths`` / ``tgt_lengths`` (B,) per sentence (eos included); ``ntokens``
    the real target tokens. An empty sample list gives None.

    Raises:
        ValueError: a sample without a target, or samples that do not fit the rows.
    """
    if len(samples) == 0:
        return None
    if any(s[2] is None for s in samples):
        raise ValueError("packed batches need a target for every sample")
    b = len(samples)
    ids = np.fromiter((s[0] for s in samples), dtype=np.int64, count=b)
    srcs = [np.asarray(s[1], dtype=np.int64) for s in samples]
    tgts = [np.asarray(s[2], dtype=np.int64) for s in samples]
    src_len = np.fromiter((len(x) + 1 for x in srcs), dtype=np.int64, count=b)
    tgt_len = np.fromiter((len(x) + 1 for x in tgts), dtype=np.int64, count=b)
    if int(max(src_len.max(), tgt_len.max())) > length:
        raise ValueError(f"a sample is longer than the pack length {length}")
    row_of = next_fit_rows(src_len, tgt_len, length)
    if int(row_of[-1]) >= rows:
        raise ValueError(f"{b} samples need {int(row_of[-1]) + 1} rows of {length}; the batch "
                         f"has {rows}")
    starts = np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]])  # each row's first pair
    seg = np.arange(b) - np.repeat(starts, np.diff(np.r_[starts, b])) + 1  # 1, 2, ... per row

    def lay(lengths: np.ndarray) -> tuple[np.ndarray, ...]:
        """Flat (R*L,) cells of every token, and the segment / position grids."""
        offset = np.cumsum(lengths) - lengths  # (B,) start within the concatenation
        row_start = offset[starts]  # where each used row begins in it
        col = offset - np.repeat(row_start, np.diff(np.r_[starts, b]))  # (B,) column
        within = np.arange(int(lengths.sum())) - np.repeat(offset, lengths)  # position ids
        cells = np.repeat(row_of * length + col, lengths) + within  # (sum lengths,)
        segments = np.zeros(rows * length, dtype=np.int32)
        positions = np.zeros(rows * length, dtype=np.int64)
        segments[cells] = np.repeat(seg, lengths)
        positions[cells] = within
        return cells, segments.reshape(rows, length), positions.reshape(rows, length)

    src_cells, src_seg, src_pos = lay(src_len)
    tgt_cells, tgt_seg, tgt_pos = lay(tgt_len)
    eos, bos = np.array([EOS_ID]), np.array([BOS_ID])
    src_tokens = np.full(rows * length, PAD_ID, dtype=np.int64)
    src_tokens[src_cells] = np.concatenate([p for x in srcs for p in (x, eos)])
    tgt_in = np.full(rows * length, PAD_ID, dtype=np.int64)
    tgt_in[tgt_cells] = np.concatenate([p for x in tgts for p in (bos, x)])
    tgt_out = np.full(rows * length, PAD_ID, dtype=np.int64)
    tgt_out[tgt_cells] = np.concatenate([p for x in tgts for p in (x, eos)])

    def grid(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.reshape(rows, length))

    return Batch(
        ids=torch.from_numpy(ids), src_tokens=grid(src_tokens),
        src_lengths=torch.from_numpy(src_len), tgt_in=grid(tgt_in), tgt_out=grid(tgt_out),
        ntokens=int(tgt_len.sum()), nsentences=b, tgt_lengths=torch.from_numpy(tgt_len),
        src_segments=torch.from_numpy(src_seg), src_positions=torch.from_numpy(src_pos),
        tgt_segments=torch.from_numpy(tgt_seg), tgt_positions=torch.from_numpy(tgt_pos),
    )
