"""fp32 decoding on a CPU with the linear layers' weights packed once (``decode.weight_prepack``).

A GEMM library lays the weight matrix out in blocks that suit its kernel; PyTorch's
``F.linear`` hands it the plain (N, K) matrix, so the library re-packs it on every call, which
costs about as much as the product itself when a call holds few rows (a decoder step with a
few sentences). :func:`prepack_linears` replaces every ``nn.Linear`` of a loaded Transformer
by a :class:`PackedLinear` whose weight oneDNN has packed once, in its blocked layout, as
PyTorch's inductor does for a frozen CPU model (``torch._inductor.config.cpp.weight_prepack``).
The products are the same to float32 rounding, and each row's result depends on that row
only, never on how many rows its batch holds (the plain product's may:
scripts/micro/bench_prepack.py). oneDNN keeps memory for each row count it meets, so the rows
are computed in batches of a few fixed sizes (:func:`packed_rows`), which bounds the memory
of a long decoding job. Measurements: docs/measurements/2026-11-28-prepacked-fp32-weights.md,
docs/measurements/2026-11-28-packed-weights-memory.md.

:func:`transformer_nmt.decode.quantize.decoding_model` packs the model for fp32 decoding on a
CPU unless ``decode.weight_prepack=false`` or ``decode.compile=true``; it leaves it as it is
where this PyTorch build has no oneDNN (:func:`prepack_supported`).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 -> the same matrix in oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().float().contiguous(), None)


@functools.cache
def prepack_supported() -> bool:
    """Whether this PyTorch build packs linear weights with oneDNN and its product agrees
    with ``F.linear`` (checked once, on a small example)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w, b = torch.randn(24, 16, generator=gen), torch.randn(24, generator=gen)
        x = torch.randn(5, 16, generator=gen)
        y = torch.ops.mkldnn._linear_pointwise(x, _pack(w), b, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return y.shape == (5, 24) and torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-5)


EXACT_ROWS = 16
"""Calls of up to this many rows run at their own size; larger ones are padded
(:func:`packed_rows`)."""


def packed_rows(rows: int) -> int:
    """The rows a packed product is computed for when ``rows`` are asked: ``rows`` itself up to
    :data:`EXACT_ROWS`, else ``rows`` rounded up to a multiple of 2^(b - 4), b its bit length (at
    most 1/8 more rows, 8 sizes per doubling).

    oneDNN keeps memory for every distinct row count its packed product meets, and a decoding
    job meets as many counts as its steps hold live rows: without a bound, peak memory grows
    with the job's length (docs/measurements/2026-11-28-packed-weights-memory.md). With
    these sizes at most 16 + 8 per doubling are met (80 up to 4,096 rows); each row's result
    does not depend on the rows computed with it, so the padded rows change nothing.
    """
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def pad_rows(rows: torch.Tensor) -> torch.Tensor:
    """(M, K) -> (:func:`packed_rows` (M), K): ``rows`` followed by zero rows (``rows`` itself
    when M is one of the sizes already)."""
    extra = packed_rows(rows.size(0)) - rows.size(0)
    return rows if extra == 0 else torch.cat([rows, rows.new_zeros(extra, rows.size(1))])


class PackedLinear(nn.Module):
    """y = x W^T + b (optionally max(0, y)) with W packed once by oneDNN; inference only.

    Args:
        linear: the ``nn.Linear`` (float32, on the CPU) whose weight and bias it takes.
        relu: apply the ReLU in the same pass (the first feed-forward layer, section 3.3).

    Shapes: x (..., K) float32 -> (..., N) float32; the rows are computed in a batch of
    :func:`packed_rows` rows (zero rows added, their results dropped).

    The packed weight is an opaque oneDNN tensor held outside the state dict: the module is
    not saved, copied or moved to another device.
    """

    def __init__(self, linear: nn.Linear, relu: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.relu = relu
        self.packed_weight = _pack(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()

    def __repr__(self) -> str:
        return (f"PackedLinear(in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"relu={self.relu})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (M, K)
        y = torch.ops.mkldnn._linear_pointwise(pad_rows(rows), self.packed_weight, self.bias,
                                               "relu" if self.relu else "none", [], "")
        return y[: rows.size(0)].view(*x.shape[:-1], self.out_features)  # (..., N)


def is_prepacked(model: object) -> bool:
    """True when ``model`` holds a :class:`PackedLinear`."""
    modules = getattr(model, "modules", None)
    return modules is not None and any(isinstance(m, PackedLinear) for m in modules())


def prepack_linears(model: nn.Module) -> nn.Module:
    """Replace every float32 ``nn.Linear`` of ``model`` (in eval mode, on the CPU) by a
    :class:`PackedLinear`, in place; a feed-forward block's W_1 applies its ReLU itself.

    A tied pre-softmax projection gets a packed copy of the embedding matrix; the embedding
    lookups keep the table. Returns ``model``; unchanged where :func:`prepack_supported` is
    False or a linear layer is not float32 on the CPU.
    """
    from transformer_nmt.model.transformer import replace_linear_layers

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears or not prepack_supported():
        return model
    if any(lin.weight.device.type != "cpu" or lin.weight.dtype != torch.float32
           for lin in linears):
        return model
    model.eval()
    with torch.no_grad():
        count = replace_linear_layers(model, nn.Linear, PackedLinear)
    log.debug("packed %d linear layers with oneDNN", count)
    return model
