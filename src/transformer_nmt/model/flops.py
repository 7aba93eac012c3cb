"""Model FLOPs of training: the one formula used by the trainer (train_summary.json
``flops``) and by the benchmarks (MFU).

With L_e / L_d encoder / decoder layers, D = d_model, h heads of size d_k / d_v, F = d_ff,
V the vocabulary, and sentences of s_i source and t_i target tokens (non-pad, eos
included)::

    P_src = L_e (W^Q + W^K + W^V + W^O + 2 D F) + L_d (W^K + W^V)      weights per source token
    P_tgt = L_d (W^Q + W^K + W^V + W^O + W^Q + W^O + 2 D F) + D V      weights per target token
    A     = L_e sum s_i^2 + L_d sum t_i^2 + L_d sum s_i t_i            attention (query, key) pairs
    FLOPs = 6 (P_src sum s_i + P_tgt sum t_i) + 6 h (d_k + d_v) A

(W^Q = W^K = D h d_k, W^V = W^O = D h d_v weights.) A multiply-add is 2 FLOPs and the
backward pass costs twice the forward, hence 6: per weight and token, and per attention
pair h d_k multiply-adds for Q K^T plus h d_v for the weights times V (12 D with
d_k = d_v = D / h). Decoder self-attention counts the full T x T square (the causal half
is not subtracted, the PaLM MFU convention). Biases, LayerNorm, softmax, embedding lookups
and the optimizer are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_nmt.config import ModelConfig

FORMULA = (
    "6 * (P_src * sum(s) + P_tgt * sum(t)) + 6 * h * (d_k + d_v) * "
    "(L_e * sum(s^2) + L_d * sum(t^2) + L_d * sum(s * t)) (transformer_nmt.model.flops)"
)
"""The formula in one line, as written into train_summary.json."""


PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "fp32": 418e12},
    "H200 SXM": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "fp32": 418e12},
    "GH200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
}
"""Dense peak FLOP/s per GPU by part and precision (NVIDIA's data sheets, without sparsity;
fp32 is TF32 tensor-core math, what ``trainer.tf32=true`` uses): the MFU denominator."""

DEVICE_PARTS: tuple[tuple[str, str], ...] = (
    (r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM5.*", "H100 SXM"),
    (r"NVIDIA H100 PCIe", "H100 PCIe"),
    (r"NVIDIA H100 NVL", "H100 NVL"),
    (r"NVIDIA H200|NVIDIA H200 SXM.*|NVIDIA H200 141GB HBM3e", "H200 SXM"),
    (r"NVIDIA H200 NVL", "H200 NVL"),
    (r"NVIDIA GH200( \d+GB)?", "GH200"),
    (r"NVIDIA A100[- ](SXM4|PCIE)[- ]\d+GB|NVIDIA A100 \d+GB PCIe|NVIDIA A100", "A100"),
)
"""``torch.cuda.get_device_name`` strings (matched whole) and the part in :data:`PEAK_FLOPS`
they name. A name that matches none gets no peak (no MFU), never a neighbour's."""


def device_part(device_name: str) -> str | None:
    """The :data:`PEAK_FLOPS` part of the device ``device_name`` (``torch.cuda.get_device_name``),
    matched whole against :data:`DEVICE_PARTS`; None for any other device (CPUs included)."""
    import re

    name = " ".join(str(device_name).split())
    for pattern, part in DEVICE_PARTS:
        if re.fullmatch(pattern, name):
            return part
    return None


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of one device named ``device_name`` (``torch.cuda.get_device_name``) at
    ``precision`` (``bf16``, ``fp16``, ``fp32``): its part's entry in :data:`PEAK_FLOPS`
    (:func:`device_part`), or None for a device not listed (CPUs included)."""
    part = device_part(device_name)
    return None if part is None else PEAK_FLOPS[part].get(str(precision))


def peak_flops_source(device_name: str, precision: str) -> str:
    """Which peak :func:`peak_flops` used, in words: part, precision and TFLOP/s, or why
    there is none."""
    part = device_part(device_name)
    peak = peak_flops(device_name, precision)
    if peak is None:
        return (f"no peak for {device_name!r} at {precision} (not one of "
                f"{', '.join(PEAK_FLOPS)}): no MFU")
    return f"{part} dense {precision} peak {peak / 1e12:g} TFLOP/s (NVIDIA data sheet)"


@dataclass
class TokenCounts:
    """Sums over sentences of source lengths s_i and target lengths t_i (non-pad tokens)."""

    src: int = 0
    """sum s_i."""
    tgt: int = 0
    """sum t_i."""
    src_sq: int = 0
    """sum s_i^2."""
    tgt_sq: int = 0
    """sum t_i^2."""
    src_tgt: int = 0
    """sum s_i t_i."""

    @classmethod
    def of(cls, src_lens: Any, tgt_lens: Any) -> TokenCounts:
        """Counts of sentences with lengths ``src_lens``, ``tgt_lens`` (equal-length 1-D arrays)."""
        s = np.asarray(src_lens, dtype=np.int64)
        t = np.asarray(tgt_lens, dtype=np.int64)
        return cls(int(s.sum()), int(t.sum()), int((s * s).sum()), int((t * t).sum()),
                   int((s * t).sum()))


def _dims(model_cfg: ModelConfig) -> tuple[int, int, int, int, int, int, int]:
    d = int(model_cfg.d_model)
    h = int(model_cfg.heads)
    dk = int(getattr(model_cfg, "d_k", None) or d // h)
    dv = int(getattr(model_cfg, "d_v", None) or d // h)
    return (int(model_cfg.encoder_layers), int(model_cfg.decoder_layers), d, h, dk, dv,
            int(model_cfg.d_ff))


def matmul_params_per_token(model_cfg: ModelConfig, vocab_size: int) -> tuple[int, int]:
    """Weights each source / target token is multiplied by in one forward pass.

    Args:
        model_cfg: anything with ``d_model, heads, d_k, d_v, d_ff, encoder_layers,
            decoder_layers`` (:class:`transformer_nmt.config.ModelConfig`; d_k / d_v None or
            absent = d_model / heads).
        vocab_size: size of the pre-softmax projection.

    Returns:
        ``(P_src, P_tgt)`` (module docstring).
    """
    le, ld, d, h, dk, dv, f = _dims(model_cfg)
    q = k = d * h * dk
    v = o = d * h * dv
    ffn = 2 * d * f
    self_attn = q + k + v + o
    per_src = le * (self_attn + ffn) + ld * (k + v)
    per_tgt = ld * (self_attn + q + o + ffn) + d * int(vocab_size)
    return per_src, per_tgt


def training_flops(model_cfg: ModelConfig, vocab_size: int, counts: TokenCounts) -> float:
    """Training FLOPs (forward + backward) of the sentences summed in ``counts``."""
    le, ld, _, h, dk, dv, _ = _dims(model_cfg)
    per_src, per_tgt = matmul_params_per_token(model_cfg, vocab_size)
    pairs = le * counts.src_sq + ld * counts.tgt_sq + ld * counts.src_tgt
    return 6.0 * (per_src * float(counts.src) + per_tgt * float(counts.tgt)) + (
        6.0 * h * (dk + dv) * float(pairs)
    )
