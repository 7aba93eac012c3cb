"""The decoder's incremental cache: self- and cross-attention keys and values kept between
decode calls (one sentence batch), with the beam reorder of section 6.1's search:
:class:`DecoderCache` (growing, for the eager step) and :class:`StaticDecoderCache` (fixed,
bucketed shapes, for the compiled step of ``decode.compile``).

Shape legend as in :mod:`transformer_nmt.model.transformer`: R target rows, N source rows, H heads,
L cached target positions, t new positions, S source length, Dk / Dv per-head sizes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class DecoderCache:
    """Keys and values kept between incremental decoder calls (one sentence batch).

    Per decoder layer: self-attention K (R, H, L, Dk) and V (R, H, L, Dv) for the R target
    rows; cross-attention K (N, H, S, Dk) and V (N, H, S, Dv) for the N source rows,
    computed from the encoder memory on the first call and reused. R is a multiple of N and
    target row r reads source row r // (R / N): the K beams of a sentence share one copy of
    its cross-attention K/V (beam search keeps R = N x K), which a beam reorder never has
    to touch.

    :meth:`reorder` is lazy: the next :meth:`append_self` of each layer gathers the kept
    rows with one ``index_select``. On a CPU the self-attention K/V are then contiguous
    tensors of exactly L positions, rebuilt by each call (the step's attention matmuls read
    them twice as fast as strided views); elsewhere they live in reused buffers whose
    capacity doubles when full (docs/model.md, "Decoder cache", has the design and its
    timings). Inference only: the buffers are written in place, which autograd does not
    allow.

    Attributes:
        length: target positions already decoded (L); the next call starts at this position.
        contiguous: True: the CPU layout (contiguous K/V rebuilt per call); False: reused
            buffers; None (the default): the CPU layout on a CPU, buffers elsewhere.
        cross_attn_mask: (N, 1, 1, S) bool or None, the source padding mask for
            cross-attention, computed once with the cross K/V.
    """

    def __init__(self, num_layers: int, contiguous: bool | None = None) -> None:
        self.length = 0
        self.contiguous = contiguous
        # Per layer: two (rows, H, capacity, Dk|Dv) K/V buffer pairs used in turn (a reorder
        # gathers from one into the other, so steady-state steps allocate nothing; the
        # contiguous layout keeps its (rows, H, L, Dk|Dv) pair in slot 0), the index of the
        # pair in use, the rows in use, and a row order not yet applied.
        self._buffers: list[list[tuple[Tensor, Tensor] | None]] = [
            [None, None] for _ in range(num_layers)
        ]
        self._current = [0] * num_layers
        self._rows = [0] * num_layers
        self._pending: list[Tensor | None] = [None] * num_layers
        self.cross_k: list[Tensor | None] = [None] * num_layers
        self.cross_v: list[Tensor | None] = [None] * num_layers
        self.cross_attn_mask: Tensor | None = None
        self.has_memory = False

    @property
    def sources(self) -> int | None:
        """N, the source rows held by the cross-attention K/V (None before the first call)."""
        k = next((x for x in self.cross_k if x is not None), None)
        return None if k is None else k.size(0)

    def _buffer_pair(
        self, layer: int, slot: int, rows: int, capacity: int, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Buffer pair ``slot`` of ``layer`` with at least ``rows`` rows and ``capacity``
        positions."""
        pair = self._buffers[layer][slot]
        if pair is None or pair[0].size(0) < rows or pair[0].size(2) < capacity:
            if pair is not None:
                rows = max(rows, pair[0].size(0))
            pair = (
                k.new_empty(rows, k.size(1), capacity, k.size(3)),
                v.new_empty(rows, v.size(1), capacity, v.size(3)),
            )
            self._buffers[layer][slot] = pair
        return pair

    def append_self(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append new self-attention keys (R, H, t, Dk) and values (R, H, t, Dv).

        Returns:
            All keys (R, H, L + t, Dk) and values (R, H, L + t, Dv) of this layer (views of
            the buffers, valid until the next call).

        Raises:
            ValueError: R differs from the rows the cache holds (after any reorder).
        """
        order, rows = self._pending[layer], k.size(0)
        start = self.length
        end = start + k.size(2)
        if start > 0:
            held = self._rows[layer] if order is None else order.numel()
            if rows != held:
                raise ValueError(
                    f"decoder cache holds {held} target rows, the decode call brought "
                    f"{rows}; reorder the cache to the new rows first"
                )
        if self.contiguous or (self.contiguous is None and k.device.type == "cpu"):
            return self._append_contiguous(layer, order, start, k, v)
        cur = self._current[layer]
        pair = self._buffers[layer][cur]
        capacity = 0 if pair is None else pair[0].size(2)
        if order is not None or end > capacity:
            new_capacity = capacity if end <= capacity else max(end, 2 * capacity, 16)
            nxt = 1 - cur
            new_k, new_v = self._buffer_pair(layer, nxt, rows, new_capacity, k, v)
            if start > 0:
                held = self._rows[layer]
                _copy_rows(pair[0][:held, :, :start], new_k[:rows, :, :start], order)
                _copy_rows(pair[1][:held, :, :start], new_v[:rows, :, :start], order)
            self._current[layer], self._pending[layer] = nxt, None
            pair = (new_k, new_v)
        self._rows[layer] = rows
        buf_k, buf_v = pair[0][:rows], pair[1][:rows]
        buf_k[:, :, start:end] = k
        buf_v[:, :, start:end] = v
        return buf_k[:, :, :end], buf_v[:, :, :end]  # (R, H, L + t, Dk|Dv)

    def _append_contiguous(self, layer: int, order: Tensor | None, start: int, k: Tensor,
                           v: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`append_self` with K/V rebuilt as contiguous (R, H, L + t, Dk|Dv) tensors,
        the kept rows gathered straight into them (held in buffer slot 0)."""
        rows, end = k.size(0), start + k.size(2)
        old = self._buffers[layer][self._current[layer]]
        pair = (k.new_empty(rows, k.size(1), end, k.size(3)),
                v.new_empty(rows, v.size(1), end, v.size(3)))
        if start > 0:
            assert old is not None
            held = self._rows[layer]
            _copy_rows(old[0][:held, :, :start], pair[0][:, :, :start], order)
            _copy_rows(old[1][:held, :, :start], pair[1][:, :, :start], order)
        pair[0][:, :, start:] = k
        pair[1][:, :, start:] = v
        self._buffers[layer][0], self._current[layer] = pair, 0
        self._pending[layer], self._rows[layer] = None, rows
        return pair

    @torch.no_grad()
    def reorder(self, indices: Tensor, sources: Tensor | None = None) -> None:
        """Select target rows (beam reorder) and, optionally, source rows (finished sentences).

        Args:
            indices: (R',) long, target rows of the current batch to keep, in their new order;
                R' may be smaller or larger than R and may repeat rows. Each new row must
                belong to the source row it is grouped with afterwards (row r reads source
                r // (R' / N')): beam search only moves beams within their sentence. The
                self-attention K/V are gathered lazily, by the next decode call.
            sources: (N',) long, source rows of the cross-attention K/V (and source mask) to
                keep, in their new order; None leaves them as they are.

        Raises:
            ValueError: when R' is not a multiple of N' (target rows could not be grouped
                onto source rows).
        """
        n_src = self.sources if sources is None else sources.numel()
        rows = indices.numel()
        if n_src is not None and (rows % n_src if n_src else rows):
            raise ValueError(
                f"DecoderCache.reorder: {rows} target rows cannot be grouped onto {n_src} "
                f"source rows (need a multiple); pass `sources` when sentences are added "
                f"or dropped"
            )
        if self.length > 0:
            for i, order in enumerate(self._pending):  # compose with a reorder not yet applied
                self._pending[i] = indices if order is None else order.index_select(0, indices)
        if sources is None:
            return
        if self.cross_attn_mask is not None:
            self.cross_attn_mask = self.cross_attn_mask.index_select(0, sources)
        for store in (self.cross_k, self.cross_v):
            for i, x in enumerate(store):
                if x is not None:
                    store[i] = x.index_select(0, sources)


def _copy_rows(src: Tensor, dst: Tensor, order: Tensor | None) -> None:
    """``dst`` = ``src``, or its rows ``order``, gathered straight into ``dst`` (a strided view
    of a K/V buffer: (R, H, L, D)) in one pass, without a temporary."""
    if order is None:
        dst.copy_(src)
    else:
        torch.index_select(src, 0, order, out=dst)


LENGTH_BUCKET = 16
"""The static cache's capacity and padded source length are multiples of this."""


def row_bucket(sentences: int) -> int:
    """Sentences a static cache holds for ``sentences`` live ones: the next power of two, at
    least 2 (a dimension of size 1 would be specialized by ``torch.compile``: one more graph)."""
    return max(1 << max(sentences - 1, 0).bit_length(), 2)


def length_bucket(length: int) -> int:
    """``length`` rounded up to a multiple of :data:`LENGTH_BUCKET` (at least one bucket)."""
    return max(-(-length // LENGTH_BUCKET), 1) * LENGTH_BUCKET


class BufferPool:
    """Zero-filled tensors kept by shape, so that a static cache of a given bucket reuses the
    same memory (the same addresses, which a recorded CUDA graph reads) from one batch to the
    next. Every tensor is marked as a static address for ``torch.compile``."""

    def __init__(self) -> None:
        self._tensors: dict[tuple, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> Tensor:
        """The pool's tensor ``name`` of this shape, dtype and device (created zero-filled)."""
        key = (name, tuple(shape), dtype, torch.device(device))
        x = self._tensors.get(key)
        if x is None:
            x = self._tensors[key] = torch.zeros(shape, dtype=dtype, device=device)
            torch._dynamo.mark_static_address(x)
        return x


class StaticDecoderCache:
    """A decoder cache of fixed shapes for a compiled decoder step (``decode.compile``).

    Per decoder layer: self-attention K (R, H, P, Dk) and V (R, H, P, Dv) for P = :attr:`span`
    positions, the positions written so far rounded up by :func:`length_bucket` and at most the
    capacity C (longest output + 1, rounded up likewise): when the step passes P, the K/V move
    into the pool's buffers of the next span (a copy, outside the step, at most C / 16 times per
    batch). Cross-attention K/V (N, H, Sb, Dk|Dv) hold the source padded to Sb =
    :func:`length_bucket` (S) positions (the padding masked). Rows are buckets too: N =
    :func:`row_bucket` (live sentences) and R = N x K rows, K per sentence (``width``); rows
    past the live ones are dead (any finite values, never read back). The step writes its new
    K/V at :attr:`position`, a 0-d long tensor, and reorders and attends over the P positions,
    the keys past the position masked: one traced graph serves every step of a bucket (and,
    traced with symbolic R, N, P and Sb, every bucket). The search's rows map onto the cache's:
    with W rows per sentence (1 at the first step, K after), search row r is cache row
    (r // W) * K + r % W.

    :meth:`reorder` keeps the search's interface (:class:`DecoderCache`): a beam reorder is
    written into :attr:`order` and applied in the next step (``index_select`` then
    ``copy_`` into the same buffers: their addresses never change); dropping sentences
    gathers at once, into the buffers of the new (possibly smaller) row bucket.
    Inference only.
    """

    def __init__(self, pool: BufferPool, layers: int, heads: int, d_k: int, d_v: int,
                 width: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.pool, self.layers, self.heads, self.d_k, self.d_v = pool, layers, heads, d_k, d_v
        self.width, self.capacity, self.dtype, self.device = width, capacity, dtype, device
        self.position = pool.get("position", (), torch.long, device)
        self.sentences = 0  # live sentences (search side)
        self.self_k: list[Tensor] = []
        self.self_v: list[Tensor] = []
        self.cross_k: list[Tensor] = []
        self.cross_v: list[Tensor] = []
        self.cross_attn_mask: Tensor | None = None
        self.tokens: Tensor | None = None
        self.order: Tensor | None = None
        self.max_len: Tensor | None = None
        self._max_len_from: Tensor | None = None
        self.step_width = 1  # rows per sentence of the search's last step
        self._order_fresh = False  # a reorder since the last step
        self._order_identity = True

    @property
    def rows(self) -> int:
        """R, the cache's rows (its bucket)."""
        return self.tokens.size(0)

    @property
    def span(self) -> int:
        """P, the positions the step reorders and reads."""
        return self.self_k[0].size(2)

    def _kv(self, prefix: str, rows: int, length: int) -> tuple[list[Tensor], list[Tensor]]:
        """The pool's K (rows, H, length, Dk) and V (rows, H, length, Dv) of every layer, named
        with ``prefix`` (self-attention "", cross-attention "c")."""
        g, h = self.pool.get, self.heads
        return ([g(f"{prefix}k{i}", (rows, h, length, self.d_k), self.dtype, self.device)
                 for i in range(self.layers)],
                [g(f"{prefix}v{i}", (rows, h, length, self.d_v), self.dtype, self.device)
                 for i in range(self.layers)])

    def _bucket_tensors(self, n: int, src_len: int, span: int) -> None:
        """Take the buffers of the bucket of ``n`` sentences (N), source length Sb and
        ``span`` positions."""
        g, r, get = self.pool.get, n * self.width, self.device
        self.self_k, self.self_v = self._kv("", r, span)
        self.tokens = g("tokens", (r,), torch.long, get)
        self.order = g("order", (r,), torch.long, get)
        self.max_len = g("max_len", (n,), torch.long, get)
        self.cross_attn_mask = g("cross_mask", (n, 1, 1, src_len), torch.bool, get)

    @torch.no_grad()
    def start(self, memory: Tensor, src_mask: Tensor, project: Any) -> None:
        """Set the cache up for the sentences of ``memory`` (N', S, D), ``src_mask`` (N', S)
        bool: zeroed self-attention K/V, and the cross-attention K/V of every layer,
        ``project(layer, memory)`` -> K (N, H, Sb, Dk), V (N, H, Sb, Dv), computed once
        from the memory padded to the row and length buckets."""
        live, s = memory.size(0), memory.size(1)
        n, sb = row_bucket(live), length_bucket(s)
        self.sentences = live
        self._bucket_tensors(n, sb, min(LENGTH_BUCKET, self.capacity))
        for x in self.self_k + self.self_v:
            x.zero_()
        pick = padded_index(live, n, memory.device)  # dead sentences copy sentence 0
        padded = memory.new_zeros(n, sb, memory.size(2))
        padded[:, :s] = memory.index_select(0, pick)
        mask = src_mask.new_zeros(n, sb)
        mask[:, :s] = src_mask.index_select(0, pick)
        self.cross_attn_mask.copy_(mask[:, None, None, :])
        self.cross_k, self.cross_v = self._kv("c", n, sb)
        for i in range(self.layers):
            k, v = project(i, padded)
            self.cross_k[i].copy_(k)
            self.cross_v[i].copy_(v)
        self.order.copy_(torch.arange(self.rows, device=self.device))
        self.position.zero_()
        self._max_len_from = None
        self.step_width = 1

    def set_step(self, last: Tensor, t: int, max_len: Tensor) -> None:
        """Write the step's inputs into the static tensors: the last tokens (A*W, 1) of the
        search's rows, the position ``t`` and the sentences' length limits (A,)."""
        rows = last.size(0)
        self.step_width = rows // self.sentences
        if self.step_width == self.width:
            self.tokens[:rows].copy_(last.view(-1))
        else:
            self.tokens.index_copy_(0, self._cache_rows(rows), last.view(-1))
        self.begin_step(t)
        if not self._order_fresh and not self._order_identity:  # no reorder: keep the rows
            self.order.copy_(torch.arange(self.rows, device=self.device))
            self._order_identity = True
        self._order_fresh = False
        if max_len is not self._max_len_from:  # changes only at a read
            self.max_len[: max_len.numel()].copy_(max_len)
            self._max_len_from = max_len

    def begin_step(self, t: int) -> None:
        """Set :attr:`position` to ``t`` and move the K/V into the buffers of the next span
        when the step reaches the end of the current one."""
        self.position.fill_(t)
        span = min(length_bucket(t + 1), self.capacity)
        if span != self.span:
            self._grow(span)

    def _grow(self, span: int) -> None:
        """Move the self-attention K/V into the buffers of ``span`` positions (zeros past the
        current ones)."""
        held = self.span
        news = self._kv("", self.rows, span)
        for olds, new_list in zip((self.self_k, self.self_v), news):
            for old, new in zip(olds, new_list):
                new[:, :, :held].copy_(old)
                new[:, :, held:].zero_()
        self.self_k, self.self_v = news

    def _cache_rows(self, rows: int) -> Tensor:
        idx = torch.arange(rows, device=self.device)
        w = self.step_width
        return idx if w == self.width else (idx // w) * self.width + idx % w

    def step_output(self, x: Tensor) -> Tensor:
        """The search's rows (A*W, ...) of a step output (R, ...) of the cache's rows."""
        n, w = self.sentences, self.step_width
        if w == self.width:
            return x[: n * w]
        return x.view(-1, self.width, *x.shape[1:])[:n, :w].flatten(0, 1)

    def key_mask(self) -> Tensor:
        """(1, 1, 1, P) bool, True for the positions up to :attr:`position`."""
        return (torch.arange(self.span, device=self.device) <= self.position)[None, None, None]

    def append_self(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Apply :attr:`order` to this layer's K/V (R, H, P, ·), write the new keys (R, H, 1,
        Dk) and values at :attr:`position`; returns the whole buffers (R, H, P, Dk|Dv)."""
        pos = self.position.view(1)
        buf_k, buf_v = self.self_k[layer], self.self_v[layer]
        buf_k.copy_(buf_k.index_select(0, self.order))
        buf_v.copy_(buf_v.index_select(0, self.order))
        buf_k.index_copy_(2, pos, k)
        buf_v.index_copy_(2, pos, v)
        return buf_k, buf_v

    @torch.no_grad()
    def reorder(self, indices: Tensor, sources: Tensor | None = None) -> None:
        """As :meth:`DecoderCache.reorder`, in the search's rows of its last step.

        Args:
            indices: (R',) long, search rows to keep (K per kept sentence), in their new order.
            sources: (N',) long, sentences to keep, in their new order; None: all of them.
        """
        rows = self._cache_rows(self.sentences * self.step_width).index_select(0, indices)
        if sources is None:
            self.order[: rows.numel()].copy_(rows)
            self._order_fresh, self._order_identity = True, False
            return
        live = sources.numel()
        pick = padded_index(live, row_bucket(live), self.device)
        rows = torch.cat([rows, rows[: self.width].repeat(pick.numel() - live)])
        self._gather_sentences(rows, sources.index_select(0, pick), live)

    @torch.no_grad()
    def leave(self, padded: Tensor, live: int) -> None:
        """Keep the ``live`` sentences ``padded[:live]`` (of :attr:`rows` / K), in that order,
        after the pending beam reorder in :attr:`order` (which the whole compiled beam step
        writes): their K/V rows and :attr:`tokens` gathered into the buffers of the row bucket
        of ``padded`` (N,) long (past ``live``, dead sentences copying a kept one)."""
        rows = self.order.view(-1, self.width).index_select(0, padded).view(-1)
        tokens = self.tokens.view(-1, self.width).index_select(0, padded).view(-1)
        self._gather_sentences(rows, padded, live)
        self.tokens.copy_(tokens)

    def _gather_sentences(self, rows: Tensor, src: Tensor, live: int) -> None:
        """Move to the buffers of the row bucket of ``src`` (N,) long, the sentences kept
        (padded: dead ones copy a kept one), holding the self-attention K/V ``rows`` (N*K,)
        long and the cross-attention K/V, mask and length limits of ``src``; ``live`` of
        them are the search's."""
        old_self = (self.self_k, self.self_v)
        old_cross = (self.cross_k, self.cross_v, self.cross_attn_mask)
        n, sb = src.numel(), self.cross_attn_mask.size(-1)
        old_max = self.max_len
        self._bucket_tensors(n, sb, self.span)
        for olds, news in zip(old_self, (self.self_k, self.self_v)):
            for old, new in zip(olds, news):
                new.copy_(old.index_select(0, rows))
        self.cross_attn_mask.copy_(old_cross[2].index_select(0, src))
        self.max_len.copy_(old_max.index_select(0, src))
        cross_k, cross_v = self._kv("c", n, sb)
        for olds, news in zip(old_cross[:2], (cross_k, cross_v)):
            for old, new in zip(olds, news):
                new.copy_(old.index_select(0, src))
        self.cross_k, self.cross_v = cross_k, cross_v
        self.order.copy_(torch.arange(self.rows, device=self.device))
        self.sentences = live
        self._max_len_from = None


def padded_index(live: int, total: int, device: torch.device) -> Tensor:
    """(total,) long: 0 .. live - 1, then zeros (dead rows copy the first)."""
    idx = torch.zeros(total, dtype=torch.long, device=device)
    idx[:live] = torch.arange(live, device=device)
    return idx
