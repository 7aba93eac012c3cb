"""bf16 / fp16 decoding with the linear layers' weights cast once (``decode.precision``).

Decoding in ``bf16`` or ``fp16`` runs under autocast
(:func:`transformer_nmt.runtime.autocast_context`), which casts a linear layer's float32 weight
and bias to the lower precision at every call, and keeps such casts for the rest of its context
only outside ``torch.inference_mode``. The searches run in inference mode (no autograd
bookkeeping at all) when the weights need no cast, else in ``torch.no_grad`` so that autocast
casts each weight once per search (:func:`without_autograd`).
:func:`cast_linears` casts them once, before decoding, as autocast would (the same rounding of
the same values), so nmt-translate and nmt-evaluate search in inference mode with no weight cast
at all, and the products and the translations are the same bit for bit; what autocast keeps in
float32 (layer normalisation, softmax, the embeddings) stays float32.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor, nn

from transformer_nmt.runtime import PRECISION_DTYPES


def cast_linears(model: nn.Module, precision: str) -> nn.Module:
    """Cast the weight and bias of every ``nn.Linear`` of ``model`` to ``precision``'s dtype, in
    place, for decoding under autocast at that precision (inference only: the new parameters
    do not require gradients).

    A pre-softmax projection tied to the target embedding (section 3.4) gets its own cast copy;
    the embedding lookups keep the float32 table.

    Args:
        model: the Transformer, in eval mode.
        precision: ``bf16`` or ``fp16`` (:data:`transformer_nmt.runtime.PRECISION_DTYPES`).

    Returns:
        ``model``, its float32 linear layers cast (other dtypes are left as they are).

    Raises:
        ValueError: ``precision`` is not a lower floating-point precision.
    """
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"cast_linears: precision={precision!r} is not one of "
                         f"{sorted(PRECISION_DTYPES)}")
    dtype = PRECISION_DTYPES[precision]
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear):
                continue
            for name in ("weight", "bias"):
                param = getattr(module, name)
                if param is not None and param.dtype == torch.float32:
                    setattr(module, name, nn.Parameter(param.detach().to(dtype),
                                                       requires_grad=False))
    return model


def recasts_weights(model: Any, device: torch.device) -> bool:
    """Whether autocast is on for ``device`` and ``model`` holds a float32 ``nn.Linear`` weight
    (one autocast would cast at every call inside ``torch.inference_mode``)."""
    modules = getattr(model, "modules", None)
    return (torch.is_autocast_enabled(device.type) and modules is not None
            and any(isinstance(m, nn.Linear) and m.weight.dtype == torch.float32
                    for m in modules()))


def without_autograd(search: Callable) -> Callable:
    """Run ``search(model, src_tokens, ...)`` in ``torch.inference_mode``, or in ``torch.no_grad``
    where :func:`recasts_weights`: autocast keeps its casts of float32 weights for the rest of its
    context only outside inference mode, and would cast every weight again at every step inside
    it (nmt-translate and nmt-evaluate cast them once before: :func:`cast_linears`;
    validation during training decodes the training model itself)."""

    @functools.wraps(search)
    def run(model: Any, src_tokens: Tensor, *args: Any, **kwargs: Any) -> Any:
        mode = torch.no_grad if recasts_weights(model, src_tokens.device) else torch.inference_mode
        with mode():
            return search(model, src_tokens, *args, **kwargs)

    return run
