"""Adam and the paper's learning-rate schedule (section 5.3, equation 3).

    lrate = multiplier * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

Steps count from 1: the first optimizer update uses ``lrate(1)``. The rate rises linearly
for ``warmup_steps`` updates, peaks at ``d_model^-0.5 * warmup_steps^-0.5`` (6.99e-4 for
d_model = 512, warmup 4000), then decays with the inverse square root of the step. The
``cosine`` and ``linear`` schedules share the warm-up and the peak and then decay to 0 at
``max_steps`` (:func:`decay_lr`).
"""

from __future__ import annotations

import math

import torch

from transformer_nmt.config import LrScheduler, TrainerConfig


def inverse_sqrt_lr(step: int, d_model: int, warmup_steps: int, multiplier: float = 1.0) -> float:
    """The paper's learning rate at optimizer update ``step`` (equation 3).

    Args:
        step: optimizer update number, counted from 1.
        d_model: model width (the rate scales with d_model^-0.5).
        warmup_steps: updates of linear warm-up (4000 in the paper).
        multiplier: constant factor on the whole schedule (1.0 = the paper).

    Returns:
        The learning rate (float).

    Raises:
        ValueError: when step, d_model or warmup_steps is not positive.
    """
    if step < 1 or d_model < 1 or warmup_steps < 1:
        raise ValueError(
            f"inverse_sqrt_lr: step={step}, d_model={d_model}, warmup_steps={warmup_steps} "
            "must all be >= 1 (steps count from 1)"
        )
    return multiplier * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def decay_lr(step: int, d_model: int, warmup_steps: int, max_steps: int,
             kind: LrScheduler | str, multiplier: float = 1.0) -> float:
    """The learning rate at update ``step`` of a schedule that decays to 0 at ``max_steps``.

    Up to ``warmup_steps`` it is :func:`inverse_sqrt_lr` (linear warm-up to the same peak
    ``multiplier * d_model^-0.5 * warmup_steps^-0.5``); then, with
    ``p = (step - warmup_steps) / (max_steps + 1 - warmup_steps)`` (so the last update's rate
    is still positive), ``peak * (1 + cos(pi * p)) / 2`` (``cosine``, Loshchilov and Hutter
    2017, without restarts) or ``peak * (1 - p)`` (``linear``, fairseq's
    ``polynomial_decay`` with power 1 and end rate 0). ``inverse_sqrt`` is
    :func:`inverse_sqrt_lr` at every step. Past ``max_steps`` the rate is 0, so a run
    shorter than its warm-up only warms up.

    Raises:
        ValueError: when ``step``, ``d_model`` or ``warmup_steps`` is not positive, or
            ``kind`` names no schedule.
    """
    kind = LrScheduler(kind)
    if kind != LrScheduler.inverse_sqrt and step > max_steps:
        return 0.0
    if kind == LrScheduler.inverse_sqrt or step <= warmup_steps:
        return inverse_sqrt_lr(step, d_model, warmup_steps, multiplier)
    peak = inverse_sqrt_lr(warmup_steps, d_model, warmup_steps, multiplier)
    p = (step - warmup_steps) / (max_steps + 1 - warmup_steps)  # in (0, 1): step <= max_steps
    if kind == LrScheduler.cosine:
        return peak * 0.5 * (1.0 + math.cos(math.pi * p))
    return peak * (1.0 - p)


def build_optimizer(model: torch.nn.Module, trainer_cfg: TrainerConfig) -> torch.optim.Adam:
    """Adam with the paper's betas and epsilon (section 5.3) over all trainable parameters.

    The base learning rate is 1.0: :func:`build_scheduler` multiplies it by the schedule,
    so the effective rate is exactly :func:`inverse_sqrt_lr`. Uses PyTorch's fused Adam
    kernel (one pass over each parameter per step) when the parameters live on a GPU or the
    CPU (its speed against the per-tensor loop: docs/benchmarks.md).

    Args:
        model: the (plain) model whose parameters are optimised.
        trainer_cfg: ``cfg.trainer`` (``adam_betas``, ``adam_eps``, ``weight_decay``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and params[0].device.type in ("cuda", "cpu")
    betas = tuple(float(b) for b in trainer_cfg.adam_betas)
    return torch.optim.Adam(
        params,
        lr=1.0,
        betas=betas,  # type: ignore[arg-type]
        eps=float(trainer_cfg.adam_eps),
        weight_decay=float(trainer_cfg.weight_decay),
        fused=True if fused else None,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, trainer_cfg: TrainerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR applying ``trainer_cfg.lr_scheduler`` (:func:`inverse_sqrt_lr`,
    :func:`decay_lr`), with the scheduler's count shifted to start at 1.

    ``LambdaLR`` evaluates its function at 0 on construction and after each ``step()`` at
    1, 2, ...; the function adds 1 so that the first optimizer update runs at ``lrate(1)``.
    Call ``scheduler.step()`` once after every successful optimizer update (not after a
    skipped one), before the next update is queued (the training step does it when it reads
    the step's figures: :func:`transformer_nmt.train.step.finish_update`).

    Args:
        optimizer: built by :func:`build_optimizer` (base lr 1.0).
        d_model: model width.
        trainer_cfg: ``cfg.trainer`` (``warmup_steps``, ``lr_multiplier``,
            ``lr_scheduler``, ``max_steps``).
    """
    warmup = int(trainer_cfg.warmup_steps)
    multiplier = float(trainer_cfg.lr_multiplier)
    kind = LrScheduler(str(trainer_cfg.lr_scheduler))
    total = int(trainer_cfg.max_steps or 0)  # unused by inverse_sqrt (which may have none)

    def lr_at(updates_done: int) -> float:
        return decay_lr(updates_done + 1, d_model, warmup, total, kind, multiplier)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_at)
