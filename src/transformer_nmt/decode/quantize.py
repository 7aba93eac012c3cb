"""int8 decoding on a CPU (``decode.precision=int8``): the model's linear layers with int8 weights.

:func:`quantize_int8` turns every ``nn.Linear`` of a loaded Transformer (the attention
projections W^Q, W^K, W^V and W^O, both feed-forward layers, and the pre-softmax projection)
into PyTorch's dynamically quantized linear layer (``torch.ao.quantization.quantize_dynamic``;
the first feed-forward layer into its variant with the ReLU fused, the same values):
weights int8, symmetric, with one scale per output channel (per row of W); each product
quantizes its input to 8 bits with a scale of its own (per tensor, from its range) and
accumulates in int32 (fbgemm / oneDNN kernels on x86, QNNPACK on ARM). Embeddings, positional
encodings, LayerNorms, softmax and the attention products stay float32. The input's scale is
one per call, so a sentence's int8 translation can depend on the other sentences of its batch
(``decode.max_tokens``); fp32 does not (docs/benchmarks.md). With tied embeddings
(``model.share_embeddings``) the pre-softmax projection gets an int8 copy of the embedding
matrix; the embedding lookups keep the float32 table.

:func:`decoding_model` is what ``nmt-translate``, ``nmt-evaluate`` and ``nmt-plot`` call once
per loaded model: the model itself for fp32 / bf16 / fp16, the quantized model for int8 (on a
CPU only; one refusal line on a GPU).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_nmt.checkpoint import non_finite_parameters
from transformer_nmt.errors import UserError

INT8 = "int8"
"""The ``decode.precision`` of :func:`quantize_int8`."""

ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")
"""PyTorch quantized engines with per-channel int8 dynamic linear kernels, in order of
preference (``torch.backends.quantized.supported_engines`` lists those of this build)."""


def check_int8_device(device: torch.device | str, key: str = "decode.device") -> None:
    """Refuse int8 decoding anywhere but on a CPU.

    Raises:
        UserError: ``device`` is not a CPU (one line naming ``key`` and the device).
    """
    device = torch.device(device)
    if device.type != "cpu":
        raise UserError(
            f"decode.precision=int8 decodes on a CPU, and {key} resolves to {device}; set "
            f"{key}=cpu, or decode on the GPU with decode.precision=bf16 (or fp16)")


def quantized_engine() -> str:
    """The quantized engine int8 decoding uses: PyTorch's current one when it has per-channel
    int8 kernels, else the first of :data:`ENGINES` this build supports.

    Raises:
        UserError: this PyTorch build has none of them.
    """
    supported = list(torch.backends.quantized.supported_engines)
    current = torch.backends.quantized.engine
    if current in ENGINES and current in supported:
        return current
    for name in ENGINES:
        if name in supported:
            return name
    raise UserError(
        f"decode.precision=int8 needs one of PyTorch's quantized engines {list(ENGINES)}, and "
        f"torch {torch.__version__} here supports {supported}; decode with "
        "decode.precision=fp32")


def is_quantized(model: Any) -> bool:
    """True when ``model`` holds a dynamically quantized (int8) linear layer."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return False
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear  # quantization: loaded late

    return any(isinstance(m, DynamicLinear) for m in modules())


def quantize_int8(model: nn.Module, checkpoint: str | Path | None = None,
                  output_projection: bool = True) -> nn.Module:
    """Quantize the linear layers of ``model`` (in eval mode, on the CPU) to int8, in place.

    Args:
        model: a :class:`transformer_nmt.model.transformer.Transformer` on the CPU.
        checkpoint: the file it came from, named in errors.
        output_projection: quantize the pre-softmax projection too (the default); False keeps
            it float32.

    Returns:
        ``model``, its ``nn.Linear`` modules replaced by
        ``torch.ao.nn.quantized.dynamic.Linear`` (int8 weights, one scale per output channel).

    Raises:
        UserError: the model is not on the CPU, holds NaN or infinite weights (no int8 scale
            represents them), or this PyTorch build has no quantized engine or no
            ``torch.ao.quantization``.
    """
    name = str(checkpoint) if checkpoint is not None else "the model"
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params):
        raise UserError(f"{name}: decode.precision=int8 quantizes a model on the CPU, and "
                        f"this one is on {params[0].device}; set decode.device=cpu")
    bad = non_finite_parameters(model.state_dict())
    if bad:
        raise UserError(
            f"{name}: cannot quantize it to int8 (decode.precision=int8): {len(bad)} of its "
            f"parameter tensors hold NaN or inf values (e.g. {bad[0]}); decode with an earlier "
            "checkpoint (decode.checkpoint=...)")
    torch.backends.quantized.engine = quantized_engine()
    try:  # quantization: loaded late (nmt-translate without int8 never imports it)
        from torch.ao.nn.intrinsic import LinearReLU
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as e:
        raise UserError(f"decode.precision=int8 needs torch.ao.quantization, which torch "
                        f"{torch.__version__} here lacks ({e}); decode with "
                        "decode.precision=fp32") from e
    from transformer_nmt.model.transformer import PositionwiseFeedForward

    spec: dict[Any, Any] = {nn.Linear: per_channel_dynamic_qconfig,
                            LinearReLU: per_channel_dynamic_qconfig}
    if not output_projection:
        spec["output_projection"] = None
    model.eval()
    for ffn in model.modules():  # W_1 and the ReLU after it as one int8 layer
        if isinstance(ffn, PositionwiseFeedForward) and isinstance(ffn.w_1, nn.Linear):
            ffn.w_1, ffn.relu_in_w_1 = LinearReLU(ffn.w_1, nn.ReLU()), True
    with warnings.catch_warnings():
        # PyTorch marks its eager quantization API and quantized tensors deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_channel", category=UserWarning)
        try:
            quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
        except (RuntimeError, AssertionError) as e:
            raise UserError(f"{name}: cannot quantize it to int8 with PyTorch's "
                            f"{torch.backends.quantized.engine} engine ({e}); decode with "
                            "decode.precision=fp32") from e
    return model


def decoding_model(model: Any, decode_cfg: Any, device: torch.device | str,
                   checkpoint: str | Path | None = None) -> Any:
    """The model to decode with under ``decode_cfg.precision``: ``model`` itself, or for
    ``int8`` (our engine, ``decode.engine=native``) the model quantized by :func:`quantize_int8`.

    Raises:
        UserError: int8 on a device other than the CPU (:func:`check_int8_device`), or a model
            :func:`quantize_int8` refuses.
    """
    if str(decode_cfg.precision) != INT8 or str(getattr(decode_cfg, "engine", "native")) != (
            "native"):
        return model
    check_int8_device(device)
    if is_quantized(model):
        return model
    return quantize_int8(model, checkpoint)
