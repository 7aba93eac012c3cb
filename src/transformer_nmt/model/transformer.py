"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), sections 3.1-3.5.

One encoder-decoder model whose sizes all come from :class:`transformer_nmt.config.ModelConfig`;
the ``tiny``, ``base`` and ``big`` presets differ only in config, and so do the paper's
Table 3 variants (rows A-E: ``heads``, ``d_k``, ``d_v``, layers, ``d_model``, ``d_ff``,
``dropout``, ``positions=learned``).

Shape legend (used in every shape comment below):
    B  batch (sentences, or sentences x beam during search)
    S  source length (tokens, padding included)
    T  target length (tokens, padding included)
    t  target positions fed to one decode call (T without a cache, usually 1 with one)
    L  target positions already held by a decoder cache
    D  d_model              F  d_ff
    H  heads                Dk d_k (query/key size per head)   Dv d_v (value size per head)
    V  vocabulary size

Masks: boolean, True = may attend (the convention of
``torch.nn.functional.scaled_dot_product_attention``). Every attention mask is built by
:func:`key_padding_attn_mask`, :func:`causal_attn_mask` or (packed batches)
:func:`segment_attn_mask`, nowhere else. A mask is only
materialised when it masks something: a batch without padding attends with
``attn_mask=None``, and full-prefix decoder self-attention uses SDPA's ``is_causal``.
Target padding needs no mask of its own: targets are right-padded, so the causal mask
already keeps every real position away from the pads that follow it.

Layer order: post-norm ``LayerNorm(x + Dropout(Sublayer(x)))`` (sections 3.1, 5.4) by
default; ``norm=pre``: ``x + Dropout(Sublayer(LayerNorm(x)))`` plus a final LayerNorm on the
encoder and decoder outputs.

Initialisation (the paper does not say; details in docs/model.md): ``init=xavier``:
Xavier-uniform linear weights (W^Q, W^K, W^V each as its own (D, H*Dk) block), zero biases,
N(0, D^-0.5) embeddings and learned positions, zero padding rows. ``init=fairseq``: as
fairseq's transformer: W^Q, W^K, W^V Xavier-uniform with gain 1/sqrt(2), their biases and
the feed-forward layers as ``nn.Linear``'s default (uniform +-1/sqrt(fan_in)).

The decoder's incremental cache is :class:`transformer_nmt.model.cache.DecoderCache`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_nmt.config import PAD_ID, ModelConfig, validate_model_config
from transformer_nmt.errors import UserError
from transformer_nmt.model.cache import (
    BufferPool,
    DecoderCache,
    StaticDecoderCache,
    length_bucket,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# Masks (the one place they are built; True = may attend)
# --------------------------------------------------------------------------------------


SDPA_BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
"""The names ``trainer.sdpa_backends`` and ``decode.sdpa_backends`` accept, and the SDPA
backends they name (``torch.nn.attention.SDPBackend``)."""


def sdpa_backends(names: list[str] | tuple[str, ...]) -> list[SDPBackend]:
    """The SDPA backends named by ``names`` (:data:`SDPA_BACKENDS`), in that order.

    Raises:
        UserError: an unknown name or an empty list (with the allowed names).
    """
    names = [str(n) for n in names]
    unknown = [n for n in names if n not in SDPA_BACKENDS]
    if unknown or not names:
        what = f"unknown {', '.join(unknown)}" if unknown else "empty"
        raise UserError(f"sdpa_backends={names}: {what}; choose from "
                        f"{', '.join(SDPA_BACKENDS)}, in order of preference")
    return [SDPA_BACKENDS[n] for n in names]


def sdpa_context(backends: list[SDPBackend] | None) -> contextlib.AbstractContextManager:
    """``torch.nn.attention.sdpa_kernel(backends, set_priority=True)``: every
    ``F.scaled_dot_product_attention`` inside uses the first of ``backends`` that supports
    its inputs; None: PyTorch's own choice (no context)."""
    if backends is None:
        return contextlib.nullcontext()
    return sdpa_kernel(backends, set_priority=True)


def sdpa_choice(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                is_causal: bool = False, dropout_p: float = 0.0) -> str:
    """The name of the backend ``F.scaled_dot_product_attention`` runs for these inputs
    under the backends enabled now (PyTorch's own choice, ``torch._fused_sdp_choice``):
    one of :data:`SDPA_BACKENDS`' names, or ``"none"`` when no enabled backend fits."""
    index = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal)
    by_value = {int(b.value): name for name, b in SDPA_BACKENDS.items()}
    return by_value.get(int(index), "none")


def key_padding_attn_mask(key_mask: Tensor, drop_if_unpadded: bool = True) -> Tensor | None:
    """SDPA mask that hides padded keys, or None when nothing is padded.

    Args:
        key_mask: (B, S) bool, True = real token.
        drop_if_unpadded: return None when every key is real (SDPA then takes its fastest,
            unmasked kernel). Checking reads the mask on the host (a device synchronisation
            and a ``torch.compile`` graph break), so training passes False.

    Returns:
        (B, 1, 1, S) bool (broadcast over heads and queries), True = may attend;
        None when ``drop_if_unpadded`` and every key is real.
    """
    if drop_if_unpadded and bool(key_mask.all()):
        return None
    return key_mask[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def causal_attn_mask(t: int, offset: int, device: torch.device) -> Tensor:
    """Decoder self-attention mask for ``t`` new queries after ``offset`` cached positions.

    Query i (absolute position offset + i) may attend keys 0 .. offset + i (section 3.2.3:
    no leftward information flow). Only needed when a cached decode is fed several positions
    at once; otherwise SDPA's ``is_causal`` (offset 0) or no mask (t = 1) is used.

    Returns:
        (t, offset + t) bool, True = may attend.
    """
    q_pos = torch.arange(offset, offset + t, device=device)
    k_pos = torch.arange(offset + t, device=device)
    return k_pos[None, :] <= q_pos[:, None]  # (t, offset + t)


PACKED_ATTENTION = ("dense", "flex")
"""How a packed batch attends (:meth:`Transformer.set_packed_attention`): ``dense``: a
(B, 1, Tq, Tk) boolean mask with SDPA (any device, attention dropout included); ``flex``:
``torch.nn.attention.flex_attention`` with a block mask that skips the blocks no query of it
may see (compiled, CUDA for training: torch 2.13 has no flex backward on a CPU; no attention
dropout)."""


def _segment_rule(q_seg: Tensor, k_seg: Tensor, q_idx: Tensor, k_idx: Tensor,
                  causal: bool) -> Tensor:
    """Who may attend whom in a packed row: a query sees the keys of its own segment (and,
    ``causal``, only those at or before it); a padding query (segment 0) sees every key, so
    that no row of the softmax is empty (no NaN) while no real query ever sees padding."""
    allowed = q_seg == k_seg
    if causal:
        allowed = allowed & (k_idx <= q_idx)
    return allowed | (q_seg == 0)


def segment_attn_mask(q_segments: Tensor, k_segments: Tensor, causal: bool,
                      kind: str = "dense") -> Any:
    """Attention mask of a packed batch: each query attends only within its own sentence.

    Encoder self-attention: ``(src, src, False)``; decoder self-attention: ``(tgt, tgt,
    True)``; cross-attention: ``(tgt, src, False)`` (target segment k sees source segment k,
    the same pair). Padding queries see every key (:func:`_segment_rule`).

    Args:
        q_segments: (B, Tq) integer segment ids of the queries (0 = padding, k >= 1 the
            row's k-th pair); k_segments: (B, Tk) of the keys.
        causal: also hide the keys after each query (decoder self-attention, Tq == Tk).
        kind: ``dense`` or ``flex`` (:data:`PACKED_ATTENTION`).

    Returns:
        ``dense``: (B, 1, Tq, Tk) bool, True = may attend; ``flex``: a
        ``torch.nn.attention.flex_attention.BlockMask`` of the same rule.
    """
    if kind == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return _segment_rule(q_segments[b, q_idx], k_segments[b, kv_idx], q_idx, kv_idx,
                                 causal)

        return create_block_mask(mask_mod, q_segments.size(0), None, q_segments.size(1),
                                 k_segments.size(1), device=q_segments.device)
    q_idx = torch.arange(q_segments.size(1), device=q_segments.device)
    k_idx = torch.arange(k_segments.size(1), device=k_segments.device)
    allowed = _segment_rule(q_segments[:, :, None], k_segments[:, None, :],
                            q_idx[None, :, None], k_idx[None, None, :], causal)  # (B, Tq, Tk)
    return allowed[:, None]  # (B, 1, Tq, Tk)


def _is_block_mask(mask: Any) -> bool:
    return type(mask).__name__ == "BlockMask"


# --------------------------------------------------------------------------------------
# Positions (section 3.5)
# --------------------------------------------------------------------------------------


def sinusoidal_table(num_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).

    Positions count from 0; even and odd channels interleave as in the paper's formula.

    Returns:
        (num_positions, D) float32.
    """
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, ceil(D/2))
    table = torch.zeros(num_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positional encodings (section 3.5), a non-persistent buffer.

    The table grows on demand, so sequences longer than ``max_positions`` still work.
    """

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1, shape (length, D)."""
        end = offset + length
        if end > self.table.size(0):
            grown = sinusoidal_table(max(end, 2 * self.table.size(0)), self.d_model)
            self.table = grown.to(self.table)  # keep device and dtype
        return self.table[offset:end]

    def at(self, position_ids: Tensor, width: int) -> Tensor:
        """Encodings of the positions ``position_ids`` (B, n), each below ``width``:
        (B, n, D)."""
        return self.forward(width)[position_ids]


class LearnedPositions(nn.Module):
    """Learned positional embeddings (paper Table 3 row E), one vector per position."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Embeddings of positions offset .. offset + length - 1, shape (length, D).

        Raises:
            ValueError: when the sequence runs past ``model.max_positions``.
        """
        end = offset + length
        if end > self.weight.size(0):
            raise ValueError(
                f"sequence needs position {end - 1} but learned positions cover "
                f"model.max_positions={self.weight.size(0)}; raise model.max_positions"
            )
        return self.weight[offset:end]

    def at(self, position_ids: Tensor, width: int) -> Tensor:
        """Embeddings of the positions ``position_ids`` (B, n), each below
        ``model.max_positions`` (``width`` is not used): (B, n, D)."""
        return self.weight[position_ids]


# --------------------------------------------------------------------------------------
# Sub-layers (sections 3.2 and 3.3)
# --------------------------------------------------------------------------------------


def attention_probs(
    q: Tensor, k: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    """The attention weights softmax(Q K^T / sqrt(d_k)) with the mask applied (section 3.2.1).

    Written out the paper's way (SDPA computes the same product without returning it);
    multiplied with V it gives Attention(Q, K, V).

    Args:
        q: (B, H, T, Dk); k: (B, H, S, Dk).
        attn_mask: bool, broadcastable to (B, H, T, S), True = may attend; or None.
        is_causal: also apply :func:`causal_attn_mask` (square self-attention, T == S).

    Returns:
        (B, H, T, S) probabilities over the S keys of each query (a fully masked row is NaN,
        as in SDPA).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * (q.size(-1) ** -0.5)  # (B, H, T, S)
    if is_causal:
        scores = scores.masked_fill(~causal_attn_mask(q.size(2), 0, q.device), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(dim=-1)


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v for a few queries per row (cached decoding steps on CPU).

    The same function as SDPA (section 3.2.1) as two batched matmuls: on CPU the flash
    kernel's blocking costs more than it saves for one or a few queries (docs/benchmarks.md).

    Args:
        q: (B, H, n, Dk); k: (B, H, L, Dk); v: (B, H, L, Dv).
        attn_mask: bool, broadcastable to (B, H, n, L), True = may attend; or None.

    Returns:
        (B, H, n, Dv).
    """
    return torch.matmul(attention_probs(q, k, attn_mask), v)  # (B, H, n, Dv)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Section 3.2.2. Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (section 3.2.1) runs in
    ``F.scaled_dot_product_attention`` (or, for cached CPU steps, two matmuls);
    :meth:`attention_weights` returns the softmax itself. The per-head projections W_i^Q,
    W_i^K, W_i^V are stored fused: self-attention keeps [W^Q | W^K | W^V] in one Linear
    (``in_proj``), encoder-decoder attention keeps W^Q in ``q_proj`` and [W^K | W^V] in
    ``kv_proj``. Columns h*Dk .. (h+1)*Dk of each block belong to head h, exactly as h
    separate matrices would.
    """

    def __init__(
        self, d_model: int, heads: int, d_k: int, d_v: int, attention_dropout: float,
        self_attention: bool,
    ) -> None:
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.self_attention = self_attention
        self.sdpa_backends: list[SDPBackend] | None = None
        """The SDPA backends tried in order (:meth:`Transformer.set_sdpa_backends`); None:
        PyTorch's choice."""
        self.attention_dropout = attention_dropout
        if self_attention:
            self.in_proj = nn.Linear(d_model, heads * (2 * d_k + d_v))
        else:
            self.q_proj = nn.Linear(d_model, heads * d_k)
            self.kv_proj = nn.Linear(d_model, heads * (d_k + d_v))
        self.out_proj = nn.Linear(heads * d_v, d_model)  # W^O

    def reset_parameters(self, init: str = "xavier") -> None:
        """Initialise W^Q, W^K, W^V (each as its own (D, H*Dk) matrix) and W^O.

        ``init="xavier"``: Xavier-uniform, zero biases. ``init="fairseq"``: W^Q, W^K, W^V
        Xavier-uniform with gain 1/sqrt(2) and biases uniform +-1/sqrt(D) (``nn.Linear``'s
        default), as fairseq's ``MultiheadAttention``. W^O: Xavier-uniform, zero bias.
        """
        gain = 2 ** -0.5 if init == "fairseq" else 1.0
        h_k, h_v = self.heads * self.d_k, self.heads * self.d_v
        if self.self_attention:
            pairs = [(self.in_proj.weight.split([h_k, h_k, h_v], dim=0), self.in_proj.bias)]
        else:
            pairs = [((self.q_proj.weight,), self.q_proj.bias),
                     (self.kv_proj.weight.split([h_k, h_v], dim=0), self.kv_proj.bias)]
        with torch.no_grad():
            for blocks, bias in pairs:
                for block in blocks:
                    nn.init.xavier_uniform_(block, gain=gain)
                if init == "fairseq":
                    bound = blocks[0].shape[1] ** -0.5
                    nn.init.uniform_(bias, -bound, bound)
                else:
                    bias.zero_()
            nn.init.xavier_uniform_(self.out_proj.weight)
            self.out_proj.bias.zero_()

    # ---- projections (section 3.2.2) ---------------------------------------------------

    def _heads(self, x: Tensor, size: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, size).transpose(1, 2)  # (B, n, H*size) -> (B, H, n, size)

    def _merge_heads(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape
        # (B, H, n, Dv) -> (B, n, H*Dv)
        return out.transpose(1, 2).reshape(b, n, self.heads * self.d_v)

    def _self_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, t, D) -> Q (B, H, t, Dk), K (B, H, t, Dk), V (B, H, t, Dv)."""
        h_k, h_v = self.heads * self.d_k, self.heads * self.d_v
        q, k, v = self.in_proj(x).split([h_k, h_k, h_v], dim=-1)  # 3 x (B, t, H*Dk|H*Dv)
        return self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)

    def _memory_projections(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (N, S, D) -> K (N, H, S, Dk), V (N, H, S, Dv)."""
        h_k, h_v = self.heads * self.d_k, self.heads * self.d_v
        k, v = self.kv_proj(memory).split([h_k, h_v], dim=-1)  # (N, S, H*Dk|H*Dv)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)  # (N, H, S, Dk|Dv)

    def _query_key_value(
        self, x: Tensor, memory: Tensor | None, cache: DecoderCache | None, layer: int
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Q (B, H, t, Dk) and all keys/values this call attends to.

        Self-attention: K/V (B, H, L + t, Dk|Dv), the new ones appended to the cache.
        Cross-attention: K/V (N, H, S, Dk|Dv), from the cache when it holds them (computed
        and stored there on the first call); Q is None (see :meth:`forward`).
        """
        if self.self_attention:
            q, k, v = self._self_projections(x)  # (B, H, t, Dk|Dv)
            if cache is not None:
                k, v = cache.append_self(layer, k, v)  # (B, H, L + t, Dk|Dv)
            return q, k, v
        if cache is not None and cache.cross_k[layer] is not None:
            return None, cache.cross_k[layer], cache.cross_v[layer]  # (N, H, S, Dk|Dv)
        k, v = self._memory_projections(memory)  # (N, H, S, Dk|Dv)
        if cache is not None:
            if self._cpu_step(memory):
                # laid out once as the CPU step's matmuls read them (K^T and V contiguous):
                # the fused projection's strided views would be copied by every step's matmul
                # (SDPA elsewhere wants K's last dimension contiguous, as the views have it)
                k, v = k.transpose(-2, -1).contiguous().transpose(-2, -1), v.contiguous()
            cache.cross_k[layer], cache.cross_v[layer] = k, v
        return None, k, v

    # ---- attention paths -----------------------------------------------------------------

    def _cpu_step(self, x: Tensor) -> bool:
        return not self.training and x.device.type == "cpu"

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
              is_causal: bool) -> Tensor:
        """SDPA with attention dropout in training:
        (B, H, t, Dk), (B, H, S, Dk|Dv) -> (B, H, t, Dv). A block mask
        (:func:`segment_attn_mask`, ``kind="flex"``) runs flex attention instead (no
        dropout: the flex path is chosen only without attention dropout)."""
        if _is_block_mask(attn_mask):
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention(q, k, v, block_mask=attn_mask)  # (B, H, t, Dv)
        with sdpa_context(self.sdpa_backends):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                dropout_p=self.attention_dropout if self.training else 0.0,
            )  # (B, H, t, Dv)

    def _grouped_cross_attention(
        self, x: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, cached: bool
    ) -> Tensor:
        """Cross-attention where B / N consecutive target rows share one source row.

        The g = B / N rows of a source row become g * t queries of that row, so the
        cross K/V (N, H, S, Dk|Dv) are never repeated per beam.

        Args:
            x: (B, t, D); k, v: (N, H, S, Dk|Dv); attn_mask: (N, 1, 1, S) or None.

        Returns:
            (B, t, H*Dv), before W^O.

        Raises:
            ValueError: without a cache, or when N does not divide B.
        """
        b, t, _ = x.shape
        n_src = k.size(0)
        if not cached or b % n_src:
            raise ValueError(
                f"encoder-decoder attention: {b} target rows cannot share {n_src} "
                f"source rows (a cached decode needs a multiple, B / N rows each)"
            )
        g = b // n_src
        q = self.q_proj(x).view(n_src, g, t, self.heads, self.d_k)  # (N, g, t, H, Dk)
        q = q.permute(0, 3, 1, 2, 4).reshape(n_src, self.heads, g * t, self.d_k)  # (N, H, g*t, Dk)
        if self._cpu_step(x):
            out = _matmul_attention(q, k, v, attn_mask)  # (N, H, g*t, Dv)
        else:
            with sdpa_context(self.sdpa_backends):
                # (N, H, g*t, Dv)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out = out.view(n_src, self.heads, g, t, self.d_v).permute(0, 2, 3, 1, 4)  # (N, g, t, H, Dv)
        return out.reshape(b, t, self.heads * self.d_v)  # (B, t, H*Dv)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        cache: DecoderCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        """Attend from ``x`` to itself (self-attention) or to ``memory`` (encoder-decoder).

        Args:
            x: (B, t, D) queries (and keys/values for self-attention).
            memory: (N, S, D) encoder output; cross-attention only (unused when the cache
                already holds this layer's cross K/V). Without a cache N = B; with one, B
                may be a multiple of N (B / N consecutive rows share a source row, see
                :class:`~transformer_nmt.model.cache.DecoderCache`).
            attn_mask: bool mask broadcastable to (B, H, t, keys), True = may attend, or
                None; for grouped cross-attention (N, 1, 1, S).
            is_causal: let SDPA apply the causal mask itself (square self-attention only).
            cache: decoder cache; self-attention appends to it, cross-attention reads it.
            layer: index of this decoder layer in the cache.

        Returns:
            (B, t, D).

        Raises:
            ValueError: B is not a multiple of the cached source rows N.
        """
        b, t, _ = x.shape
        q, k, v = self._query_key_value(x, memory, cache, layer)
        if q is None:  # cross-attention
            if k.size(0) != b:
                return self.out_proj(
                    self._grouped_cross_attention(x, k, v, attn_mask, cache is not None))
            q = self._heads(self.q_proj(x), self.d_k)  # (B, H, t, Dk)
        if t == 1 and self._cpu_step(x):
            out = _matmul_attention(q, k, v, attn_mask)  # (B, H, 1, Dv): cached step
        else:
            out = self._sdpa(q, k, v, attn_mask, is_causal)  # (B, H, t, Dv)
        return self.out_proj(self._merge_heads(out))  # (B, t, H*Dv) -> (B, t, D)

    def attention_weights(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """The attention probabilities of every head, without a cache (for inspection, plots).

        Args:
            x: (B, T, D) queries; memory: (B, S, D) for cross-attention (self-attention: S = T).
            attn_mask, is_causal: as in :meth:`forward`.

        Returns:
            (B, H, T, S): softmax(Q K^T / sqrt(d_k)) per head (section 3.2.1), see
            :func:`attention_probs`; multiplied with V it gives what :meth:`forward` attends.
        """
        q, k, _ = self._query_key_value(x, memory, None, 0)
        if q is None:
            q = self._heads(self.q_proj(x), self.d_k)  # (B, H, T, Dk)
        return attention_probs(q, k, attn_mask, is_causal)  # (B, H, T, S)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3), with optional dropout after the
    ReLU."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = nn.Dropout(activation_dropout)
        self.relu_in_w_1 = False
        """True when ``w_1`` applies the ReLU itself (a decoding layer from
        :func:`replace_linear_layers`: int8 or packed fp32)."""

    def forward(self, x: Tensor) -> Tensor:
        """(B, n, D) -> (B, n, D)."""
        h = self.w_1(x)  # (B, n, d_ff)
        if not self.relu_in_w_1:
            h = F.relu(h)
        return self.w_2(self.activation_dropout(h))


def replace_linear_layers(model: nn.Module, kind: type,
                          build: Callable[[nn.Module, bool], nn.Module]) -> int:
    """Replace every ``kind`` child of ``model`` by ``build(child, relu)``, in place.

    ``relu`` is True for a feed-forward block's W_1, whose block then leaves the ReLU to the
    new layer (``relu_in_w_1``). Returns the number of layers replaced.
    """
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, kind):
                continue
            relu = isinstance(parent, PositionwiseFeedForward) and name == "w_1"
            setattr(parent, name, build(child, relu))
            if relu:
                parent.relu_in_w_1 = True
            replaced += 1
    return replaced


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual dropout and LayerNorm (3.1)."""

    def __init__(self, cfg: ModelConfig, d_k: int, d_v: int) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, d_k, d_v, cfg.attention_dropout, self_attention=True
        )
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        """x (B, S, D), attn_mask (B, 1, 1, S) or None -> (B, S, D)."""
        if self.pre_norm:
            x = x + self.dropout(self.self_attn(self.self_attn_norm(x), attn_mask=attn_mask))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.self_attn_norm(x + self.dropout(self.self_attn(x, attn_mask=attn_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (section 3.1)."""

    def __init__(self, cfg: ModelConfig, d_k: int, d_v: int) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, d_k, d_v, cfg.attention_dropout, self_attention=True
        )
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.cross_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, d_k, d_v, cfg.attention_dropout, self_attention=False
        )
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        self_causal: bool,
        cross_mask: Tensor | None,
        cache: DecoderCache | None,
        layer: int,
    ) -> Tensor:
        """x (B, t, D), memory (B, S, D) -> (B, t, D).

        ``self_mask``/``self_causal`` carry the causal mask (see :func:`causal_attn_mask`),
        ``cross_mask`` (B, 1, 1, S) or None the source padding.
        """
        def self_attn(y: Tensor) -> Tensor:
            return self.self_attn(
                y, attn_mask=self_mask, is_causal=self_causal, cache=cache, layer=layer
            )

        def cross_attn(y: Tensor) -> Tensor:
            return self.cross_attn(y, memory, attn_mask=cross_mask, cache=cache, layer=layer)

        if self.pre_norm:
            x = x + self.dropout(self_attn(self.self_attn_norm(x)))
            x = x + self.dropout(cross_attn(self.cross_attn_norm(x)))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.self_attn_norm(x + self.dropout(self_attn(x)))
        x = self.cross_attn_norm(x + self.dropout(cross_attn(x)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------


class Transformer(nn.Module):
    """Encoder-decoder Transformer (section 3, Figure 1).

    Args:
        cfg: :class:`~transformer_nmt.config.ModelConfig`.
        vocab_size: size V of the shared source/target vocabulary.
        pad_id: padding id; its embedding row is zero and padded source keys are masked.

    Attributes (state-dict names are stable):
        embed_tokens: source token embedding (V, D); also the target embedding and the
            pre-softmax matrix when ``share_embeddings=all`` (section 3.4).
        tgt_embed_tokens: target token embedding; the same module as ``embed_tokens`` when
            ``share_embeddings=all``.
        output_projection: pre-softmax linear map D -> V without bias; its weight is the
            target embedding's Parameter unless ``share_embeddings=none``.
        src_positions / tgt_positions: positional encodings (one shared sinusoidal table,
            or separate learned tables).
        encoder_layers / decoder_layers: N layers each; encoder_norm / decoder_norm: final
            LayerNorms (pre-norm only, else None).

    Raises:
        ValueError: from :func:`validate_model_config`, naming every bad key and value.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int,
                 pad_id: int = PAD_ID) -> None:
        super().__init__()
        validate_model_config(cfg, vocab_size, pad_id)
        self.cfg = cfg
        self.vocab_size, self.pad_id = vocab_size, pad_id
        d_model = cfg.d_model
        d_k = cfg.d_k if cfg.d_k is not None else d_model // cfg.heads
        d_v = cfg.d_v if cfg.d_v is not None else d_model // cfg.heads
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        self.embed_scale = math.sqrt(d_model)

        # Section 3.4: embeddings and softmax, with weight sharing.
        self.embed_tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        if cfg.share_embeddings == "all":
            self.tgt_embed_tokens = self.embed_tokens
        else:
            self.tgt_embed_tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.output_projection = nn.Linear(d_model, vocab_size, bias=False)
        if cfg.share_embeddings != "none":
            self.output_projection.weight = self.tgt_embed_tokens.weight

        # Section 3.5: positional encoding.
        if cfg.positions == "sinusoidal":
            self.src_positions = SinusoidalPositions(cfg.max_positions, d_model)
            self.tgt_positions = self.src_positions
        else:
            self.src_positions = LearnedPositions(cfg.max_positions, d_model)
            self.tgt_positions = LearnedPositions(cfg.max_positions, d_model)
        self.embed_dropout = nn.Dropout(cfg.dropout)

        # Section 3.1: encoder and decoder stacks.
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(cfg, d_k, d_v) for _ in range(cfg.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(cfg, d_k, d_v) for _ in range(cfg.decoder_layers)
        )
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(d_model) if pre else None
        self.decoder_norm = nn.LayerNorm(d_model) if pre else None

        self.packed_attention = "dense"
        """How packed batches attend (:meth:`set_packed_attention`)."""

        self.reset_parameters()
        logger.info("%s", self.summary())

    # ---- set-up ----------------------------------------------------------------------

    def reset_parameters(self) -> None:
        """Initialise as ``model.init`` says (module docstring; docs/model.md)."""
        init = str(self.cfg.init)  # an Init member or, read back from a checkpoint, its value
        std = self.d_model ** -0.5
        with torch.no_grad():
            embeddings = {id(self.embed_tokens.weight): self.embed_tokens.weight}
            embeddings[id(self.tgt_embed_tokens.weight)] = self.tgt_embed_tokens.weight
            embeddings[id(self.output_projection.weight)] = self.output_projection.weight
            for w in embeddings.values():
                nn.init.normal_(w, mean=0.0, std=std)
            for emb in (self.embed_tokens, self.tgt_embed_tokens):
                emb.weight[self.pad_id].zero_()
            for positions in (self.src_positions, self.tgt_positions):
                if isinstance(positions, LearnedPositions):
                    nn.init.normal_(positions.weight, mean=0.0, std=std)
            for module in self.modules():
                if isinstance(module, MultiHeadAttention):
                    module.reset_parameters(init)
                elif isinstance(module, PositionwiseFeedForward):
                    for linear in (module.w_1, module.w_2):
                        if init == "fairseq":
                            linear.reset_parameters()  # uniform +-1/sqrt(fan_in)
                        else:
                            nn.init.xavier_uniform_(linear.weight)
                            linear.bias.zero_()
                elif isinstance(module, nn.LayerNorm):
                    module.reset_parameters()

    def set_sdpa_backends(self, names: list[str] | tuple[str, ...] | None) -> None:
        """Run every attention of the model under ``torch.nn.attention.sdpa_kernel`` with the
        backends ``names`` (``trainer.sdpa_backends``, ``decode.sdpa_backends``), tried in
        that order; None: PyTorch's own choice.

        Raises:
            UserError: an unknown name or an empty list (:func:`sdpa_backends`).
        """
        backends = None if names is None else sdpa_backends(names)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.sdpa_backends = backends

    def set_packed_attention(self, kind: str) -> None:
        """How packed batches attend: ``dense`` or ``flex`` (:data:`PACKED_ATTENTION`).

        Raises:
            ValueError: another name, or ``flex`` with attention dropout (flex attention
                has none).
        """
        if kind not in PACKED_ATTENTION:
            raise ValueError(f"packed attention {kind!r}: choose from "
                             f"{', '.join(PACKED_ATTENTION)}")
        if kind == "flex" and float(self.cfg.attention_dropout) > 0:
            raise ValueError("flex attention has no attention dropout; use dense with "
                             f"model.attention_dropout={self.cfg.attention_dropout}")
        self.packed_attention = kind

    def sdpa_kernels(self, device: torch.device, dtype: torch.dtype) -> dict[str, str]:
        """The SDPA backend each kind of attention of this model runs on ``device`` with
        ``dtype`` activations under its backends (PyTorch's own choice for inputs of the
        model's head sizes, :func:`sdpa_choice`): ``masked`` (encoder and cross attention
        with a (B, 1, 1, S) key-padding mask), ``causal`` (decoder self-attention)."""
        attn = next(m for m in self.modules() if isinstance(m, MultiHeadAttention))
        b, s = 2, 13  # a length that is no multiple of 8
        q = torch.zeros(b, attn.heads, s, self.d_k, device=device, dtype=dtype)
        v = torch.zeros(b, attn.heads, s, self.d_v, device=device, dtype=dtype)
        mask = torch.ones(b, 1, 1, s, device=device, dtype=torch.bool)
        dropout = float(self.cfg.attention_dropout)
        with sdpa_context(attn.sdpa_backends):
            return {"masked": sdpa_choice(q, q, v, mask, False, dropout),
                    "causal": sdpa_choice(q, q, v, None, True, dropout)}

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())

    def summary(self) -> str:
        """One line: preset name, sizes, options and the parameter count."""
        c = self.cfg
        return (
            f"Transformer {c.name}: N={c.encoder_layers}/{c.decoder_layers} D={self.d_model} "
            f"F={c.d_ff} H={c.heads} Dk={self.d_k} Dv={self.d_v} V={self.vocab_size} "
            f"norm={c.norm} positions={c.positions} share_embeddings={c.share_embeddings} "
            f"init={c.init}: "
            f"{self.num_parameters():,} parameters"
        )

    def new_cache(self) -> DecoderCache:
        """An empty :class:`DecoderCache` for incremental decoding of one batch."""
        return DecoderCache(len(self.decoder_layers))

    def new_static_cache(self, pool: BufferPool, width: int, steps: int,
                         dtype: torch.dtype, device: torch.device) -> StaticDecoderCache:
        """A :class:`StaticDecoderCache` for ``width`` rows per sentence and up to ``steps``
        decoder positions, its K/V in ``dtype``; set it up with :meth:`start_static`."""
        attn = self.decoder_layers[0].self_attn
        capacity = length_bucket(steps)
        if isinstance(self.tgt_positions, SinusoidalPositions):
            self.tgt_positions(capacity)  # grow the table now, not in the traced step
        return StaticDecoderCache(pool, len(self.decoder_layers), attn.heads, self.d_k, self.d_v,
                                  width, capacity, dtype, device)

    def start_static(self, cache: StaticDecoderCache, memory: Tensor, src_mask: Tensor) -> None:
        """Set ``cache`` up for a batch: memory (N, S, D) and src_mask (N, S) bool from
        :meth:`encode`; the cross-attention K/V are computed here, once."""
        def project(i: int, padded: Tensor) -> tuple[Tensor, Tensor]:
            return self.decoder_layers[i].cross_attn._memory_projections(padded)

        cache.start(memory, src_mask, project)

    def decode_static(self, cache: StaticDecoderCache) -> Tensor:
        """One decoder step over a static cache: the tokens (R,) of :attr:`cache.tokens`
        at position :attr:`cache.position` (a tensor), after the cache's pending row order;
        no host read and no Python value of the step, so one traced graph serves every step
        of a bucket (``decode.compile``).

        Returns:
            logits (R, V) of every cache row (dead rows included).
        """
        tokens = cache.tokens.view(-1, 1)  # (R, 1)
        pos = self.tgt_positions.at(cache.position.view(1, 1), cache.capacity)  # (1, 1, D)
        x = self.embed_dropout(self.tgt_embed_tokens(tokens) * self.embed_scale + pos)
        self_mask = cache.key_mask()  # (1, 1, 1, C)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, None, self_mask, False, cache.cross_attn_mask, cache, i)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output_projection(x[:, 0])  # (R, V)

    # ---- embedding -------------------------------------------------------------------

    def _embed(self, tokens: Tensor, embed: nn.Embedding, positions: nn.Module,
               offset: int) -> Tensor:
        """Dropout(Embedding(tokens) * sqrt(D) + PE), (B, n) -> (B, n, D)
        (sections 3.4, 3.5, 5.4)."""
        x = embed(tokens) * self.embed_scale  # (B, n, D)
        x = x + positions(tokens.size(1), offset)  # (n, D) broadcast over B
        return self.embed_dropout(x)

    # ---- encoder / decoder ------------------------------------------------------------

    def encode(self, src_tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Run the encoder stack.

        Args:
            src_tokens: (B, S) long, right-padded with ``pad_id``; every row needs at least
                one real token (the batcher always appends eos).

        Returns:
            ``(memory, src_mask)``: memory (B, S, D); src_mask (B, S) bool, True = real token.
        """
        memory, src_mask, _ = self._encode(src_tokens)
        return memory, src_mask

    def _encode(self, src_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        src_mask = src_tokens.ne(self.pad_id)  # (B, S)
        # training: no host read of the mask (no sync, no graph break); decoding: drop it if
        # unpadded
        attn_mask = key_padding_attn_mask(src_mask, not self.training)  # (B, 1, 1, S) or None
        x = self._embed(src_tokens, self.embed_tokens, self.src_positions, 0)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, src_mask, attn_mask

    def decode(
        self,
        tgt_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Run the decoder stack and the pre-softmax projection.

        Args:
            tgt_tokens: (B, t) long. Without a cache, the whole target prefix (positions
                0 .. t-1, causal mask). With a cache, only the new position(s); their
                positions continue from ``cache.length``, and the cache grows by t.
            memory: (N, S, D) from :meth:`encode` (read only on the cache's first call).
                N = B, or, with a cache, any N dividing B: then rows
                r * B/N .. (r+1) * B/N - 1 of ``tgt_tokens`` all translate source row r
                (the beams of one sentence) and share its cross-attention K/V.
            src_mask: (N, S) bool, True = real source token.
            cache: from :meth:`new_cache`, or None.

        Returns:
            logits (B, t, V) (unnormalised; apply log_softmax for scores).

        Raises:
            ValueError: B is not a multiple of the source rows N (cached), or N != B
                (without a cache).
        """
        if cache is None:
            return self._decode(tgt_tokens, memory, key_padding_attn_mask(src_mask), None)
        if not cache.has_memory:
            cache.cross_attn_mask = key_padding_attn_mask(src_mask)
            cache.has_memory = True
        return self._decode(tgt_tokens, memory, cache.cross_attn_mask, cache)

    def _decode(
        self,
        tgt_tokens: Tensor,
        memory: Tensor,
        cross_mask: Tensor | None,
        cache: DecoderCache | None,
        output_mask: Tensor | None = None,
    ) -> Tensor:
        t = tgt_tokens.size(1)
        offset = cache.length if cache is not None else 0
        if offset == 0:
            # causal also for t = 1 (a 1 x 1 causal mask allows the one key): a constant, where
            # ``t > 1`` under torch.compile with a dynamic length is symbolic, which SDPA's
            # is_causal does not take (a graph break)
            self_mask, self_causal = None, True
        elif t == 1:
            self_mask, self_causal = None, False  # one new query sees every cached key
        else:
            self_mask, self_causal = causal_attn_mask(t, offset, tgt_tokens.device), False
        x = self._embed(tgt_tokens, self.tgt_embed_tokens, self.tgt_positions, offset)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, self_mask, self_causal, cross_mask, cache, i)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if cache is not None:
            cache.length += t
        if output_mask is not None:
            if output_mask.dtype == torch.bool:
                x = x[output_mask]  # (N, D): only the positions whose logits are wanted
            else:  # (N,) flat indices: no host read of a mask, no graph break
                x = x.flatten(0, 1).index_select(0, output_mask)  # (B*t, D) -> (N, D)
        return self.output_projection(x)  # (B, t, V), or (N, V) with output_mask

    def forward_packed(self, src_tokens: Tensor, tgt_in: Tensor, src_segments: Tensor,
                       src_positions: Tensor, tgt_segments: Tensor,
                       tgt_positions: Tensor) -> Tensor:
        """Teacher-forced logits of a packed batch (:mod:`transformer_nmt.data.packing`):
        several sentence pairs per row, each attending only within itself
        (:func:`segment_attn_mask`: encoder, causal decoder and cross-attention by segment,
        ``packed_attention`` dense or flex), positions restarting at every sentence. Every
        real position gets the logits the padded forward gives the same pair.

        Args:
            src_tokens, tgt_in: (R, L) long, padding only at row tails.
            src_segments, tgt_segments: (R, L) integer segment ids (0 = padding).
            src_positions, tgt_positions: (R, L) long position of each token in its sentence.

        Returns:
            logits (R, L, V); those of padding positions are finite and meaningless.
        """
        kind = self.packed_attention
        enc_mask = segment_attn_mask(src_segments, src_segments, False, kind)
        self_mask = segment_attn_mask(tgt_segments, tgt_segments, True, kind)
        cross_mask = segment_attn_mask(tgt_segments, src_segments, False, kind)
        width = src_tokens.size(1)
        x = self.embed_tokens(src_tokens) * self.embed_scale  # (R, L, D)
        x = self.embed_dropout(x + self.src_positions.at(src_positions, width))
        for layer in self.encoder_layers:
            x = layer(x, enc_mask)
        memory = self.encoder_norm(x) if self.encoder_norm is not None else x
        width = tgt_in.size(1)
        y = self.tgt_embed_tokens(tgt_in) * self.embed_scale  # (R, L, D)
        y = self.embed_dropout(y + self.tgt_positions.at(tgt_positions, width))
        for i, layer in enumerate(self.decoder_layers):
            y = layer(y, memory, self_mask, False, cross_mask, None, i)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        return self.output_projection(y)  # (R, L, V)

    def forward(
        self, src_tokens: Tensor, tgt_in: Tensor, output_mask: Tensor | None = None,
        src_segments: Tensor | None = None, src_positions: Tensor | None = None,
        tgt_segments: Tensor | None = None, tgt_positions: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced logits.

        Args:
            src_tokens: (B, S) long, source + eos, right-padded.
            tgt_in: (B, T) long, bos + target, right-padded.
            output_mask: optional (B, T) bool, or (N,) long indices into the flattened
                (B * T) positions; when given, the pre-softmax projection runs only on those
                positions (training passes the non-padding targets, which saves the (V x D)
                product for every padding position). Indices, computed on the host, avoid
                the device synchronisation and ``torch.compile`` graph break of a bool mask.

            src_segments, src_positions, tgt_segments, tgt_positions: (B, S) / (B, T) of a
                packed batch (:meth:`forward_packed`, which then runs; ``output_mask`` must
                be None), or None.

        Returns:
            logits (B, T, V), or (N, V) for the N True positions of ``output_mask`` in
            row-major order (for indices: in their order).
        """
        if src_segments is not None:
            if output_mask is not None:
                raise ValueError("a packed batch takes no output_mask")
            return self.forward_packed(src_tokens, tgt_in, src_segments, src_positions,
                                       tgt_segments, tgt_positions)
        memory, _, attn_mask = self._encode(src_tokens)
        return self._decode(tgt_in, memory, attn_mask, None, output_mask)
