"""The batch as a target (paper section 5.1: "approximately 25000 source tokens and 25000
target tokens" per training batch): ``max_tokens`` per device and ``update_freq`` chosen at
start-up so that ``world_size x update_freq`` micro-batches hold the target, or a refusal.

* :func:`derive_update_freq`: the micro-batches per rank that bring the sampler's mean real
  tokens per batch closest to ``trainer.tokens_per_step`` for the running world size;
  :func:`check_tokens_per_step` refuses (a :class:`~transformer_nmt.errors.UserError`, one
  ``error:`` line) when the source or the target side misses it by more than
  ``trainer.tokens_per_step_tolerance``.
* :func:`device_max_tokens` (``trainer.auto_max_tokens``): padded tokens per micro-batch that
  fit a GPU's memory, from :data:`ESTIMATED_GIB_PER_1K_TOKENS` (an estimate, not measured
  here; docs/training.md).
* :func:`plan_batch`: both together, as :func:`transformer_nmt.train.setup.setup` uses them.
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

log = logging.getLogger("transformer_nmt.train.loop")

ESTIMATED_GIB_PER_1K_TOKENS = {"base": 0.64, "big": 1.07}
"""GPU memory per 1,000 padded tokens (source and target each) of one micro-batch, in GiB,
training with Adam in mixed precision: an ESTIMATE from a review's figures (a 25,000-token
batch in about 17 GB for base, 30 GB for big), less the model's fixed states. Not measured
on a GPU in this project; a measured table per GPU kind should replace it."""
FIXED_GIB = {"base": 1.0, "big": 3.4}
"""Parameters, gradients and Adam's two moments in fp32 (16 bytes per parameter: base about
63M, big about 213M parameters with a 37k vocabulary), in GiB."""
MEMORY_HEADROOM = 0.85
"""Fraction of the device's total memory the estimate may fill (the CUDA context, allocator
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
    ESTIMATED_GIB_PER_1K_TOKENS``, rounded down to a multiple of 256; 0 when even the model
    does not fit the estimate. An estimate (see :data:`ESTIMATED_GIB_PER_1K_TOKENS`)."""
    kind = memory_class(model_cfg)
    gib = total_memory_bytes / 2**30 * MEMORY_HEADROOM - FIXED_GIB[kind]
    tokens = gib / ESTIMATED_GIB_PER_1K_TOKENS[kind] * 1000
    return max(0, int(tokens // MAX_TOKENS_MULTIPLE) * MAX_TOKENS_MULTIPLE)


def cuda_max_tokens(model_cfg: Any, device: Any) -> tuple[int, str]:
    """:func:`device_max_tokens` for a CUDA ``device`` (from
    ``torch.cuda.get_device_properties``), and a line naming the GPU and its memory."""
    import torch

    props = torch.cuda.get_device_properties(device)
    tokens = device_max_tokens(model_cfg, int(props.total_memory))
    return tokens, (f"{props.name}, {props.total_memory / 2**30:.0f} GiB: max_tokens {tokens} "
                    f"(estimated for the {memory_class(model_cfg)} model, not measured)")


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
                          max_tokens: int, update_freq: int, world_size: int) -> None:
    """Refuse a step outside ``target`` ± ``tolerance`` (relative) on either side.

    Raises:
        UserError: one line with the step's make-up, the side that misses and by how much,
            and the overrides that fix it.
    """
    for side, value in zip(("source", "target"), per_step, strict=True):
        off = value / target - 1
        if abs(off) > tolerance:
            raise UserError(
                f"trainer.tokens_per_step={target:g}: {world_size} rank(s) x update_freq "
                f"{update_freq} x max_tokens {max_tokens} hold {value:,.0f} real {side} tokens "
                f"per step, {off:+.0%} (allowed ±{tolerance:.0%}); change trainer.max_tokens "
                "(or the number of GPUs), or set trainer.tokens_per_step=null to train with "
                "this batch anyway"
            )


def plan_batch(t_cfg: Any, model_cfg: Any, make_sampler: Callable[[int], LengthBucketSampler],
               world_size: int, device_cap: int | None = None, min_tokens: int = 1) -> BatchPlan:
    """Choose ``max_tokens`` and ``update_freq`` for ``world_size`` ranks.

    Without ``trainer.tokens_per_step``: ``trainer.max_tokens`` (or ``device_cap``) and
    ``trainer.update_freq`` as given. With it: the fewest micro-batches per rank that reach
    the target with at most ``device_cap`` tokens each (``trainer.max_tokens`` when no cap),
    the budget then lowered so that the step is not larger than the target, and
    ``update_freq`` from :func:`derive_update_freq`; refused by :func:`check_tokens_per_step`.

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
    if device_cap:
        s, t = sampler.real_tokens_per_batch
        mean = (s + t) / 2
        micro = max(1, math.ceil(target / max(mean * world_size, 1e-9)))
        scaled = int(max_tokens * target / (mean * world_size * micro))
        scaled = max(int(min_tokens), scaled // 8 * 8)
        if scaled < max_tokens:
            max_tokens, sampler = scaled, make_sampler(scaled)
    uf = derive_update_freq(sampler.real_tokens_per_batch, target, world_size)
    per_step = real_tokens_per_step(sampler, uf, world_size)
    check_tokens_per_step(per_step, target, t_cfg.tokens_per_step_tolerance,
                          max_tokens=max_tokens, update_freq=uf, world_size=world_size)
    return BatchPlan(max_tokens, uf, per_step[0], per_step[1], sampler)
