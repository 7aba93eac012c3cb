"""int8 decoding on a CPU (``decode.precision=int8``): the model's linear layers with int8 weights.

:func:`quantize_int8` turns every ``nn.Linear`` of a loaded Transformer (the attention
projections W^Q, W^K, W^V and W^O, both feed-forward layers, and the pre-softmax projection)
into an :class:`Int8Linear`: weights int8, symmetric, with one scale per output channel (per
row of W, PyTorch's ``per_channel_dynamic_qconfig``); each product quantizes every row of its
input with a scale of that row's own (its largest magnitude) and accumulates in int32 (fbgemm
on x86, QNNPACK or oneDNN elsewhere), as CTranslate2 does. A sentence's int8 translation thus
does not depend on the other sentences of its batch (``decode.max_tokens``), as fp32's does
not. Embeddings, positional encodings, LayerNorms, softmax and the attention products stay
float32. With tied embeddings (``model.share_embeddings``) the pre-softmax projection gets an
int8 copy of the embedding matrix; the embedding lookups keep the float32 table.

:func:`decoding_model` is what ``nmt-translate``, ``nmt-evaluate`` and ``nmt-plot`` call once
per loaded model: the quantized model for int8 (on a CPU only; one refusal line on a GPU), for
fp32 on a CPU the model with packed weights (:mod:`transformer_nmt.decode.prepack`), the
model itself for bf16 / fp16.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_nmt.checkpoint import non_finite_parameters
from transformer_nmt.decode.prepack import pad_rows
from transformer_nmt.errors import UserError
from transformer_nmt.runtime import PRECISION_DTYPES

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
    """True when ``model`` holds an int8 linear layer (:class:`Int8Linear`)."""
    modules = getattr(model, "modules", None)
    return modules is not None and any(isinstance(m, Int8Linear) for m in modules())


ROW_SCALE, ROW_ZERO_POINT = 1.0 / 63, 64
"""The 8-bit encoding of a row divided by its largest magnitude (values in [-1, 1]): codes 1 to
127, 7 bits as PyTorch's x86 kernels use (``reduce_range``: their 16-bit pair sums of AVX2
cannot overflow)."""


def _fixed_scale_product(packed: Any, in_features: int) -> bool:
    """Whether this engine's int8 product takes a fixed input scale (fbgemm, PyTorch's x86
    engine: ``linear_with_input_q_dq_qweight_dq_output_fp32``); elsewhere :class:`Int8Linear`
    fixes the scale through two anchor rows."""
    try:
        torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            torch.zeros(1, in_features), ROW_SCALE, ROW_ZERO_POINT, packed)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


def _weight(packed: Any) -> torch.Tensor:
    return torch.ops.quantized.linear_unpack(packed)[0]


class Int8Linear(nn.Module):
    """y = x W^T + b with int8 weights (one scale per output channel) and each input row
    quantized to 8 bits with its own scale, int32 accumulation.

    A row x_r is divided by s_r = max_i |x_ri| (exactly 1 at its largest entry), so every row
    shares one fixed encoding (:data:`ROW_SCALE`, :data:`ROW_ZERO_POINT`); the int8 product
    runs without a bias and y_r = s_r (W (x_r / s_r)) + b. Where the engine's product takes no
    fixed scale, two first rows of -1 and of 1 make the range it measures [-1, 1] for any batch.
    A row's result therefore depends on that row only. NaN or inf in a row make that row's
    output NaN or inf (its scale carries them).

    Args:
        weight: (N, K) qint8, per-channel symmetric (from ``quantize_dynamic``).
        bias: (N,) float32 or None.
        relu: apply max(0, .) to the output (the first feed-forward layer).

    Shapes: x (..., K) float32 -> (..., N) float32; the rows are computed in a batch of
    :func:`~transformer_nmt.decode.prepack.packed_rows` rows (zero rows added, their results
    dropped), so that the int8 product meets few distinct row counts.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> None:
        super().__init__()
        from torch.ao.nn.quantized.modules.linear import LinearPackedParams

        self.out_features, self.in_features = weight.shape
        self.relu = relu
        self.weight_packed = LinearPackedParams(dtype=torch.qint8)
        self.weight_packed.set_weight_bias(weight, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.fixed_scale = _fixed_scale_product(self.weight_packed._packed_params,
                                                self.in_features)
        # QNNPACK has no 16-bit pair sums to protect (and warns that it ignores the flag)
        self.reduce_range = torch.backends.quantized.engine != "qnnpack"
        anchor = None
        if not self.fixed_scale:
            anchor = torch.ones(2, self.in_features)
            anchor[0] = -1.0
        self.register_buffer("anchor", anchor, persistent=False)

    @classmethod
    def from_dynamic(cls, layer: nn.Module, relu: bool) -> Int8Linear:
        """From PyTorch's dynamically quantized ``Linear`` (its int8 weight and float bias)."""
        return cls(layer.weight(), layer.bias(), relu)

    def weight(self) -> torch.Tensor:
        """(N, K) qint8, the quantized weight."""
        return _weight(self.weight_packed._packed_params)

    def __repr__(self) -> str:
        return (f"Int8Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, relu={self.relu}, "
                f"fixed_scale={self.fixed_scale})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)  # (R, K)
        m = rows.size(0)
        if m == 0:
            return x.new_zeros(*lead, self.out_features)
        rows = pad_rows(rows)  # a few sizes: the product's memory stays bounded
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)  # (R, 1)
        packed = self.weight_packed._packed_params
        if self.fixed_scale:
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                rows / scale, ROW_SCALE, ROW_ZERO_POINT, packed)  # (R, N)
        else:
            xs = rows.new_empty(rows.size(0) + 2, self.in_features)  # (2 + R, K)
            xs[:2] = self.anchor
            # a non-finite row (NaN after the division) would stop the range's measurement; its
            # scale still makes its output NaN
            torch.div(rows, scale, out=xs[2:]).nan_to_num_(0.0)
            y = torch.ops.quantized.linear_dynamic(xs, packed, reduce_range=self.reduce_range)[2:]
        if self.bias is None:
            y.mul_(scale)
        else:
            torch.addcmul(self.bias, y, scale, out=y)
        if self.relu:
            y.relu_()
        return y[:m].view(*lead, self.out_features)


def quantize_int8(model: nn.Module, checkpoint: str | Path | None = None,
                  output_projection: bool = True) -> nn.Module:
    """Quantize the linear layers of ``model`` (in eval mode, on the CPU) to int8, in place.

    Args:
        model: a :class:`transformer_nmt.model.transformer.Transformer` on the CPU.
        checkpoint: the file it came from, named in errors.
        output_projection: quantize the pre-softmax projection too (the default); False keeps
            it float32.

    Returns:
        ``model``, its ``nn.Linear`` modules replaced by :class:`Int8Linear` (int8 weights, one
        scale per output channel; one input scale per row), W_1 with its ReLU.

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
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as e:
        raise UserError(f"decode.precision=int8 needs torch.ao.quantization, which torch "
                        f"{torch.__version__} here lacks ({e}); decode with "
                        "decode.precision=fp32") from e
    spec: dict[Any, Any] = {nn.Linear: per_channel_dynamic_qconfig}
    if not output_projection:
        spec["output_projection"] = None
    model.eval()
    with warnings.catch_warnings():
        # PyTorch marks its eager quantization API and quantized tensors deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_channel", category=UserWarning)
        try:
            quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
            _replace_dynamic_linears(model, DynamicLinear)
        except (RuntimeError, AssertionError) as e:
            raise UserError(f"{name}: cannot quantize it to int8 with PyTorch's "
                            f"{torch.backends.quantized.engine} engine ({e}); decode with "
                            "decode.precision=fp32") from e
    return model


def _replace_dynamic_linears(model: nn.Module, dynamic_linear: type) -> None:
    """Every ``dynamic_linear`` child of ``model`` (PyTorch's dynamically quantized layer)
    replaced by an :class:`Int8Linear` of the same weights; a feed-forward block's W_1 applies
    its ReLU itself (``relu_in_w_1``)."""
    from transformer_nmt.model.transformer import replace_linear_layers

    replace_linear_layers(model, dynamic_linear, Int8Linear.from_dynamic)


def decoding_model(model: Any, decode_cfg: Any, device: torch.device | str,
                   checkpoint: str | Path | None = None) -> Any:
    """The model to decode with under ``decode_cfg`` (our engine, ``decode.engine=native``):
    for ``int8`` the model quantized by :func:`quantize_int8`; for fp32 on a CPU its linear
    layers packed once by oneDNN (:func:`transformer_nmt.decode.prepack.prepack_linears`)
    unless ``decode.weight_prepack`` is false, ``decode.compile`` is true or a parameter is
    not finite (the search then names it); for ``bf16`` and ``fp16`` its linear layers cast
    once, in place (:func:`transformer_nmt.decode.cast.cast_linears`: the same translations,
    no weight cast per step); otherwise ``model`` itself.

    Raises:
        UserError: int8 on a device other than the CPU (:func:`check_int8_device`), or a model
            :func:`quantize_int8` refuses.
    """
    if str(getattr(decode_cfg, "engine", "native")) != "native":
        return model
    if str(decode_cfg.precision) in PRECISION_DTYPES:
        from transformer_nmt.decode.cast import cast_linears

        return cast_linears(model, str(decode_cfg.precision))
    if str(decode_cfg.precision) != INT8:
        if _packs_weights(model, decode_cfg, device):
            from transformer_nmt.decode.prepack import prepack_linears

            return prepack_linears(model)
        return model
    check_int8_device(device)
    if is_quantized(model):
        return model
    return quantize_int8(model, checkpoint)


def _packs_weights(model: Any, decode_cfg: Any, device: torch.device | str) -> bool:
    """Whether :func:`decoding_model` packs ``model``'s fp32 weights: fp32 on a CPU with
    ``decode.weight_prepack``, not under ``decode.compile=true``, all parameters finite."""
    return (str(decode_cfg.precision) == "fp32" and torch.device(device).type == "cpu"
            and bool(getattr(decode_cfg, "weight_prepack", False))
            and str(getattr(decode_cfg, "compile", "false")) != "true"
            and not non_finite_parameters(model.state_dict()))
