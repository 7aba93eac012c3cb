"""The batch as a target (paper section 5.1: "approximately 25000 source tokens and 25000
target tokens" per training batch): ``max_tokens`` per device and ``update_freq`` chosen at
start-up so that ``world_size x update_freq`` micro-batches hold the target, or a refusal.

* :func:`derive_update_freq`: the micro-batches per rank that bring the sampler's mean real
  tokens per batch closest to ``trainer.tokens_per_step`` for the running world size;
  :func:`check_tokens_per_step` refuses (a :class:`~transformer_nmt.errors.UserError`, one
  ``error:`` line) when the source or the target side misses it by more than
  ``trainer.tokens_per_step_tolerance``.
* :func:`device_max_tokens` (``trainer.auto_max_tokens``): padded tokens per micro-batch that
  fit a GPU's memory, from :data:`GIB_PER_1K_TOKENS` and :data:`FIXED_GIB` (measured on an
  H200, docs/measurements/2026-11-26-gpu-step-and-decoding-h200.md).
* :func:`plan_batch`: both together, as :func:`transformer_nmt.train.setup.setup` uses them;
  with ``trainer.auto_max_tokens`` on a GPU it searches ``max_tokens`` (and ``update_freq``)
  under the device's budget until the measured real tokens per step meet the target.

Real tokens per padded budget depend on the padding the batches get: the sampler budgets the
lengths rounded to ``trainer.pad_to_multiple`` (8 on CUDA, 1 on CPU), so planning with the
sampler of the device that runs gives that device's figures.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.errors import UserError
from transformer_nmt.train.data import real_tokens_per_step

log = logging.getLogger(__name__)

GIB_PER_1K_TOKENS = {"base": 0.48, "big": 0.84}
"""GPU memory per 1,000 padded tokens of one micro-batch, in GiB: the slope of the peak memory
the caching allocator reserved over micro-batches of 3.6k-28.8k padded tokens (bf16 autocast,
compiled, fused Adam, a 37k vocabulary; scripts/cluster/gpu_profile.py on an H200,
docs/measurements/2026-11-26-gpu-step-and-decoding-h200.md)."""
FIXED_GIB = {"base": 1.05, "big": 3.1}
"""The same fit's intercept, in GiB: mostly parameters, gradients and Adam's two moments in
fp32 (16 bytes per parameter: base 63M, big 214M parameters with a 37k vocabulary)."""
MEMORY_HEADROOM = 0.85
"""Fraction of the device's total memory the fit may fill (the CUDA context, allocator
fragmentation and the longest batches take the rest)."""
MAX_TOKENS_MULTIPLE = 256


@dataclass
class BatchPlan:
    """What :func:`plan_batch` chose: the micro-batch budget, the micro-batches per rank and
    step, and the real tokens a step then holds on average."""

    max_tokens: int
    update_freq: int
    src_per_step: float
    tgt_per_step: float
    sampler: LengthBucketSampler


def memory_class(model_cfg: Any) -> str:
    """``"big"`` for the big preset or any model with d_model >= 1024, else ``"base"`` (the
    estimate used for smaller models too: an overestimate of their memory)."""
    if str(getattr(model_cfg, "name", "")) == "big" or int(model_cfg.d_model) >= 1024:
        return "big"
    return "base"


def device_max_tokens(model_cfg: Any, total_memory_bytes: int) -> int:
    """Padded tokens per micro-batch (source and target each) estimated to fit a GPU with
    ``total_memory_bytes`` of memory: ``(MEMORY_HEADROOM x memory - FIXED_GIB) /
    GIB_PER_1K_TOKENS``, rounded down to a multiple of 256; 0 when even the model does not
    fit."""
    kind = memory_class(model_cfg)
    gib = total_memory_bytes / 2**30 * MEMORY_HEADROOM - FIXED_GIB[kind]
    tokens = gib / GIB_PER_1K_TOKENS[kind] * 1000
    return max(0, int(tokens // MAX_TOKENS_MULTIPLE) * MAX_TOKENS_MULTIPLE)


def cuda_max_tokens(model_cfg: Any, device: Any) -> tuple[int, str]:
    """:func:`device_max_tokens` for a CUDA ``device`` (from
    ``torch.cuda.get_device_properties``), and a line naming the GPU and its memory."""
    import torch

    props = torch.cuda.get_device_properties(device)
    tokens = device_max_tokens(model_cfg, int(props.total_memory))
    return tokens, (f"{props.name}, {props.total_memory / 2**30:.0f} GiB: max_tokens {tokens} "
                    f"(from the {memory_class(model_cfg)} model's memory measured on an H200, "
                    "docs/measurements/2026-11-26-gpu-step-and-decoding-h200.md)")


def derive_update_freq(per_batch: tuple[float, float], target: float, world_size: int) -> int:
    """Micro-batches per rank whose step comes closest to ``target`` real tokens on both
    sides: of ``floor`` and ``ceil`` of ``target / (mean(per_batch) x world_size)``, the one
    with the smaller worst relative error; at least 1.

    Args:
        per_batch: mean real ``(source, target)`` tokens per micro-batch
            (:attr:`LengthBucketSampler.real_tokens_per_batch`).
    """
    mean = (per_batch[0] + per_batch[1]) / 2
    if mean <= 0:
        return 1
    ideal = target / (mean * world_size)
    candidates = {max(1, math.floor(ideal)), max(1, math.ceil(ideal))}
    return min(sorted(candidates),
               key=lambda k: max(abs(x * k * world_size - target) for x in per_batch))


def check_tokens_per_step(per_step: tuple[float, float], target: float, tolerance: float, *,
                          max_tokens: int, update_freq: int, world_size: int,
                          way_out: str | None = None) -> None:
    """Refuse a step outside ``target`` ± ``tolerance`` (relative) on either side.

    Args:
        way_out: the knobs that help, for the message (default: another
            ``trainer.max_tokens`` or number of GPUs, as without ``auto_max_tokens``).

    Raises:
        UserError: one line with the step's make-up, the side that misses and by how much,
            and the overrides that fix it.
    """
    if way_out is None:
        way_out = ("change trainer.max_tokens (or the number of GPUs), or set "
                   "trainer.tokens_per_step=null to train with this batch anyway")
    for side, value in zip(("source", "target"), per_step, strict=True):
        off = value / target - 1
        if abs(off) > tolerance:
            raise UserError(
                f"trainer.tokens_per_step={target:g}: {world_size} rank(s) x update_freq "
                f"{update_freq} x max_tokens {max_tokens} hold {value:,.0f} real {side} tokens "
                f"per step, {off:+.0%} (allowed ±{tolerance:.0%}); {way_out}"
            )


def _worst_error(per_step: tuple[float, float], target: float) -> float:
    """The larger relative distance of the two sides from ``target``."""
    return max(abs(x / target - 1) for x in per_step)


def search_max_tokens(make_sampler: Callable[[int], LengthBucketSampler], target: float,
                      tolerance: float, world_size: int, cap: int, min_tokens: int = 1,
                      multiple: int = 8) -> BatchPlan:
    """``trainer.auto_max_tokens``: the largest micro-batch the device holds that gives
    ``target`` real tokens per step, searched on the sampler itself.

    The fewest micro-batches per rank ``k`` that reach the target within ``tolerance``
    (``floor`` then ``ceil`` of the count at ``cap`` padded tokens, then one more); for each,
    a bisection over ``max_tokens``
    (multiples of ``multiple``, from ``min_tokens`` to ``cap``) for the budget whose mean
    real tokens per micro-batch is ``target / (world_size x k)``. Real tokens per padded
    token fall as batches grow (more padding per batch), so a linear rescaling of ``cap``
    misses; measuring each candidate does not.

    Args:
        make_sampler: the training sampler for a given ``max_tokens`` (with the device's
            padding).
        cap: padded tokens per micro-batch the smallest device holds
            (:func:`device_max_tokens`).
        min_tokens: the smallest budget allowed (the longest training pair's length).

    Returns:
        The :class:`BatchPlan` closest to the target (within ``tolerance`` on both sides).

    Raises:
        UserError: no budget under ``cap`` and no ``update_freq`` meets the target, naming
            the knob that helps (fewer GPUs, a wider tolerance for unequal sides).
    """
    cache: dict[int, LengthBucketSampler] = {}

    def sampler_at(mt: int) -> LengthBucketSampler:
        if mt not in cache:
            cache[mt] = make_sampler(mt)
        return cache[mt]

    def mean(mt: int) -> float:
        s, t = sampler_at(mt).real_tokens_per_batch
        return (s + t) / 2

    lo = max(int(min_tokens), 1)
    lo = -(-lo // multiple) * multiple if lo < cap else cap
    grid = list(range(lo, cap, multiple)) + [cap]  # budgets the search may take
    best: tuple[float, int, int] | None = None  # (worst error, max_tokens, update_freq)
    ideal = target / max(mean(cap) * world_size, 1e-9)  # micro-batches of the cap's size
    for micro in sorted({max(1, math.floor(ideal)), max(1, math.ceil(ideal)),
                         max(1, math.ceil(ideal)) + 1}):
        want = target / (world_size * micro)  # mean real tokens per micro-batch
        a, b = 0, len(grid) - 1  # smallest grid index whose mean reaches want
        if mean(grid[b]) < want:
            a = b
        while a < b:
            mid = (a + b) // 2
            if mean(grid[mid]) >= want:
                b = mid
            else:
                a = mid + 1
        for i in {max(a - 1, 0), a}:
            mt = grid[i]
            err = _worst_error(real_tokens_per_step(sampler_at(mt), micro, world_size), target)
            if best is None or err < best[0] - 1e-12:
                best = (err, mt, micro)
        if best[0] <= tolerance:
            break
    err, mt, uf = best
    per_step = real_tokens_per_step(sampler_at(mt), uf, world_size)
    if err > tolerance:
        centre = sum(per_step) / 2 / target - 1
        if mt == grid[0] and uf == 1 and centre > tolerance:
            way_out = (f"even the smallest micro-batch (max_tokens {mt}, the longest training "
                       "pair) holds more than the target on this many GPUs: train on fewer "
                       "GPUs, or raise trainer.tokens_per_step")
        elif abs(centre) <= tolerance:
            way_out = (f"the source and target sides differ by "
                       f"{abs(per_step[0] - per_step[1]) / (sum(per_step) / 2):.0%} per batch, "
                       "more than the tolerance allows around one target: widen "
                       "trainer.tokens_per_step_tolerance, or set trainer.tokens_per_step=null")
        else:
            way_out = ("widen trainer.tokens_per_step_tolerance, or set "
                       "trainer.auto_max_tokens=false and choose trainer.max_tokens")
        check_tokens_per_step(per_step, target, tolerance, max_tokens=mt, update_freq=uf,
                              world_size=world_size,
                              way_out=f"trainer.auto_max_tokens found no closer batch: {way_out}")
    return BatchPlan(mt, uf, per_step[0], per_step[1], sampler_at(mt))


def plan_batch(t_cfg: Any, model_cfg: Any, make_sampler: Callable[[int], LengthBucketSampler],
               world_size: int, device_cap: int | None = None, min_tokens: int = 1) -> BatchPlan:
    """Choose ``max_tokens`` and ``update_freq`` for ``world_size`` ranks.

    Without ``trainer.tokens_per_step``: ``trainer.max_tokens`` (or ``device_cap``) and
    ``trainer.update_freq`` as given. With it and ``device_cap``: :func:`search_max_tokens`.
    With it and no cap: ``trainer.max_tokens`` and ``update_freq`` from
    :func:`derive_update_freq`; refused by :func:`check_tokens_per_step`.

    Args:
        make_sampler: the training sampler for a given ``max_tokens``.
        device_cap: padded tokens per micro-batch the device holds
            (:func:`device_max_tokens`), or None to use ``trainer.max_tokens``.
        min_tokens: the smallest budget allowed (the longest training pair's length).

    Raises:
        UserError: the real tokens per step miss the target (see above).
    """
    max_tokens = int(device_cap) if device_cap else t_cfg.max_tokens
    max_tokens = max(max_tokens, int(min_tokens))
    sampler = make_sampler(max_tokens)
    target = t_cfg.tokens_per_step
    if target is None:
        uf = t_cfg.update_freq
        return BatchPlan(max_tokens, uf, *real_tokens_per_step(sampler, uf, world_size), sampler)
    target = float(target)
    tolerance = float(t_cfg.tokens_per_step_tolerance)
    if device_cap:
        return search_max_tokens(lambda mt: sampler if mt == max_tokens else make_sampler(mt),
                                 target, tolerance, world_size, max_tokens, int(min_tokens))
    uf = derive_update_freq(sampler.real_tokens_per_batch, target, world_size)
    per_step = real_tokens_per_step(sampler, uf, world_size)
    check_tokens_per_step(per_step, target, tolerance,
                          max_tokens=max_tokens, update_freq=uf, world_size=world_size)
    return BatchPlan(max_tokens, uf, per_step[0], per_step[1], sampler)
