"""The decoder's incremental cache: self- and cross-attention keys and values kept between
decode calls (one sentence batch), with the beam reorder of section 6.1's search.

Shape legend as in :mod:`transformer_nmt.model.transformer`: R target rows, N source rows, H heads,
L cached target positions, t new positions, S source length, Dk / Dv per-head sizes.
"""

from __future__ import annotations

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

    Self-attention K/V live in reused buffers (capacity doubles when full) and
    :meth:`reorder` is lazy: the next :meth:`append_self` of each layer gathers the kept
    rows with one ``index_select`` (docs/model.md, "Decoder cache", has the design and its
    timings). Inference only: the buffers are written in place, which autograd does not
    allow.

    Attributes:
        length: target positions already decoded (L); the next call starts at this position.
        cross_attn_mask: (N, 1, 1, S) bool or None, the source padding mask for
            cross-attention, computed once with the cross K/V.
    """

    def __init__(self, num_layers: int) -> None:
        self.length = 0
        # Per layer: two (rows, H, capacity, Dk|Dv) K/V buffer pairs used in turn (a reorder
        # gathers from one into the other, so steady-state steps allocate nothing), the
        # index of the pair in use, the rows in use, and a row order not yet applied.
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
        cur = self._current[layer]
        pair = self._buffers[layer][cur]
        capacity = 0 if pair is None else pair[0].size(2)
        if order is not None or end > capacity:
            new_capacity = capacity if end <= capacity else max(end, 2 * capacity, 16)
            nxt = 1 - cur
            new_k, new_v = self._buffer_pair(layer, nxt, rows, new_capacity, k, v)
            if start > 0:
                held = self._rows[layer]
                for old, new in ((pair[0][:held, :, :start], new_k[:rows, :, :start]),
                                 (pair[1][:held, :, :start], new_v[:rows, :, :start])):
                    if order is None:
                        new.copy_(old)
                    elif k.device.type == "cpu":  # one copy: gather straight into the buffer
                        torch.index_select(old, 0, order, out=new)
                    else:
                        new.copy_(old.index_select(0, order))
            self._current[layer], self._pending[layer] = nxt, None
            pair = (new_k, new_v)
        self._rows[layer] = rows
        buf_k, buf_v = pair[0][:rows], pair[1][:rows]
        buf_k[:, :, start:end] = k
        buf_v[:, :, start:end] = v
        return buf_k[:, :, :end], buf_v[:, :, :end]  # (R, H, L + t, Dk|Dv)

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
