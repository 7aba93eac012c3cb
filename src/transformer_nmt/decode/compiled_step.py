"""The decoder step of beam and greedy search compiled over a static cache (``decode.compile``).

One function, :func:`static_log_probs`, computes a step's constrained log-probabilities over a
:class:`~transformer_nmt.model.cache.StaticDecoderCache` with tensor ops only, so that
``torch.compile`` traces it with symbolic shapes (rows, capacity, padded source length), so one
compiled graph serves every bucket of shapes, and on CUDA (mode ``reduce-overhead``) records a
CUDA graph per bucket and replays it. :class:`StaticStep` is what
the searches call each step. docs/model.md, "Compiled decoding step", has the design.

Shape legend as in :mod:`transformer_nmt.decode.beam_search`; R the static cache's rows.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import weakref
from typing import Any, Callable

import torch
from torch import Tensor

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.model.cache import BufferPool


def resolve_compile(value: bool | str | None, device: torch.device | str) -> bool:
    """Whether the decoder step runs compiled (``decode.compile``).

    Args:
        value: ``true``/``false`` (bools or their text), or ``auto``/None: on a CUDA device only
            (on a CPU compiling costs more than it saves, docs/model.md).
        device: where the search runs.

    Raises:
        ValueError: anything else (names the value).
    """
    text = str(value).strip().lower() if value is not None else "auto"
    if text == "auto":
        return torch.device(device).type == "cuda"
    if text in ("true", "false"):
        return text == "true"
    raise ValueError(f"compile={value!r} must be auto, true or false (run the decoder step "
                     "compiled over a static cache)")


def static_log_probs(model: Any, cache: Any, min_len: int) -> tuple[Tensor, Tensor]:
    """The decoder step of :func:`~transformer_nmt.decode.beam_search.next_token_log_probs`,
    constraints included, over a :class:`~transformer_nmt.model.cache.StaticDecoderCache`, in
    tensor ops only (the function ``decode.compile`` compiles): (R, V) float32 constrained
    log-probabilities and (R,) bool non-finite flags of every cache row."""
    logits = model.decode_static(cache)  # (R, V)
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    bad = ~torch.isfinite(lprobs.amax(dim=-1))  # (R,)
    col = torch.arange(lprobs.size(-1), device=lprobs.device)  # (V,)
    pos = cache.position
    barred = col.eq(PAD_ID) | col.eq(BOS_ID) | (col.eq(EOS_ID) & pos.lt(min_len))  # (V,)
    lprobs = lprobs.masked_fill(barred, -math.inf)
    at_limit = cache.max_len.repeat_interleave(cache.width).eq(pos)  # (R,) eos forced
    lprobs = lprobs.masked_fill(at_limit[:, None] & col.ne(EOS_ID), -math.inf)
    return lprobs, bad


RECOMPILE_LIMIT = 256
"""Graphs the compiled step may hold (two serve every bucket: a step with a pending beam
reorder and one without)."""


def _fx_config() -> Any:
    """``torch.fx.experimental._config`` where it has ``use_duck_shape``, else None."""
    try:
        config = importlib.import_module("torch.fx.experimental._config")
    except ImportError:
        return None
    return config if hasattr(config, "use_duck_shape") else None


_FX_CONFIG = _fx_config()  # looked up once, not at every step


def _no_duck_sizing() -> contextlib.AbstractContextManager:
    """Tracing without "duck sizing" (``use_duck_shape``): a bucket's size that equals another
    size at trace time (d_k, say) is not tied to it (which would make it static). A no-op on a
    torch without that setting."""
    return (_FX_CONFIG.patch(use_duck_shape=False) if _FX_CONFIG is not None
            else contextlib.nullcontext())


_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> BufferPool
_COMPILED: dict[Any, Callable] = {}


def _compiled_step(device: torch.device, backend: Any) -> Callable:
    """:func:`static_log_probs` under ``torch.compile`` with dynamic shapes (the buckets'
    sizes symbolic: one compilation serves them all): mode ``reduce-overhead`` on CUDA without
    ``backend`` (a CUDA graph recorded per bucket), else ``backend`` (default inductor)."""
    key = (device.type, backend)
    if key not in _COMPILED:
        if backend is None and device.type == "cuda":
            fn = torch.compile(static_log_probs, mode="reduce-overhead", dynamic=True)
        else:
            fn = torch.compile(static_log_probs, backend=backend or "inductor", dynamic=True)
        _COMPILED[key] = fn
    return _COMPILED[key]


class StaticStep:
    """The search's decoder step over a static cache: inputs written into the cache's static
    tensors, one call of the (compiled) step, the search's rows of its outputs."""

    def __init__(self, model: Any, memory: Tensor, src_mask: Tensor, width: int, steps: int,
                 backend: Any) -> None:
        device = memory.device
        dtype = (torch.get_autocast_dtype(device.type)
                 if torch.is_autocast_enabled(device.type) else memory.dtype)
        pool = _POOLS.setdefault(model, BufferPool())
        self.model, self.device = model, device
        self.cache = model.new_static_cache(pool, width, steps, dtype, device)
        model.start_static(self.cache, memory, src_mask)
        self.fn = _compiled_step(device, backend)

    def __call__(self, last: Tensor, t: int, min_len: int, max_len: Tensor
                 ) -> tuple[Tensor, Tensor]:
        """(A*W, V) constrained log-probabilities and (A*W,) non-finite flags."""
        cache = self.cache
        cache.set_step(last, t, max_len)
        if self.device.type == "cuda":  # the outputs of the previous replay are done with
            torch.compiler.cudagraph_mark_step_begin()
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), _no_duck_sizing():
            lprobs, bad = self.fn(self.model, cache, min_len)
        return cache.step_output(lprobs), cache.step_output(bad)
