"""One optimizer step's arithmetic: the gradient over its micro-batches and ranks
(:func:`forward_backward`, section 5.4's label-smoothed loss normalised by the step's global
target tokens), then the update, queued with no host read (:func:`queue_update`: unscale,
clip, the optimizer step with the skip of a non-finite step decided on the device), and the
step's one host read (:func:`finish_update`: its figures, the counters it adds to the train
state, the schedule, the skip's log line). The training loop reads a step's figures one step
late, after the next step's forward and backward are queued.

``update_freq`` micro-batches per rank make a step: their non-pad target tokens are
all-reduced once (``ntokens_global``), each micro-batch's summed loss is scaled by
``world_size / ntokens_global`` (undoing DDP's mean) and back-propagated, so the gradient is
that of ``sum(token losses) / ntokens_global`` whatever the world size and ``update_freq``.
A step with a non-finite loss or gradient norm is skipped (parameters, Adam moments and step
count unchanged, the learning-rate schedule not advanced); ``max_bad_steps`` in a row stop
training with :class:`TrainingDiverged`, and so does an fp16 loss scale below
:data:`MIN_LOSS_SCALE`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_nmt import checkpoint as ckpt_lib
from transformer_nmt.config import PAD_ID, UNK_ID, TrainerConfig
from transformer_nmt.data.batching import Batch, collate
from transformer_nmt.train import distributed
from transformer_nmt.train.loss import label_smoothed_nll_loss
from transformer_nmt.train.metrics import Window
from transformer_nmt.train.setup import Setup
from transformer_nmt.train.state import TrainState

log = logging.getLogger(__name__)


DUMMY_SENTENCES = 2
"""Sentences of the zero-weight dummy batch: more than one, so that its shape falls in the
compiled graph's dynamic range (torch.compile specialises sizes 0 and 1)."""


def _dummy_batch(pad_to_multiple: int = 8) -> Batch:
    """The zero-weight batch of a rank without data for a micro-step: ``DUMMY_SENTENCES``
    sentences of ``max(pad_to_multiple, 2) - 1`` tokens (+ eos), so shape
    (2, ``max(pad_to_multiple, 2)``) on both sides with every target position real: no size
    0 or 1 that the compiled step would specialise on, a length real batches have."""
    length = max(int(pad_to_multiple), 2) - 1
    tokens = np.full(length, UNK_ID, dtype=np.int64)
    batch = collate([(i, tokens, tokens) for i in range(DUMMY_SENTENCES)],
                    pad_to_multiple=pad_to_multiple)
    assert batch is not None
    return batch


def dummy_packed_batch(shape: tuple[int, int]) -> Batch:
    """The zero-weight batch of a rank without data for a micro-step with packed batches:
    the run's one (rows, pack_length) shape, all padding (its loss is 0 before the zero
    weight: every target is padding)."""
    grid = torch.full(shape, PAD_ID, dtype=torch.long)
    zeros = torch.zeros(shape, dtype=torch.long)
    return Batch(ids=torch.zeros(0, dtype=torch.long), src_tokens=grid, src_lengths=zeros[0, :0],
                 tgt_in=grid.clone(), tgt_out=grid.clone(), ntokens=0, nsentences=0,
                 tgt_lengths=zeros[0, :0], src_segments=zeros.int(), src_positions=zeros,
                 tgt_segments=zeros.int(), tgt_positions=zeros.clone())


def mark_dynamic_batch(src_tokens: torch.Tensor, tgt_in: torch.Tensor,
                       keep: torch.Tensor) -> None:
    """Mark the batch and length dimensions of the model's inputs (B, S), (B, T) and the
    target-token count (N,) dynamic, so that ``torch.compile`` traces one graph for all
    batch shapes instead of one per shape (``maybe_mark_dynamic``: no error where the graph
    needs a fixed size; no effect on an uncompiled model)."""
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (src_tokens, tgt_in):
        mark(t, 0)
        mark(t, 1)
    mark(keep, 0)


_COMPILED_LOSS: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()


def loss_function(model: torch.nn.Module) -> Any:
    """The loss the step calls for ``model``: :func:`label_smoothed_nll_loss`, compiled
    with the backend ``model`` was compiled with when it is a ``torch.compile`` module (so
    that Inductor fuses the loss into one forward and one backward kernel, docstring of
    :mod:`transformer_nmt.train.loss`), eager otherwise. One compiled loss per model; its
    target-count dimension is marked dynamic by the step, the vocabulary stays static."""
    callback = getattr(getattr(model, "dynamo_ctx", None), "callback", None)
    if not isinstance(model, torch._dynamo.eval_frame.OptimizedModule) or callback is None:
        return label_smoothed_nll_loss
    fn = _COMPILED_LOSS.get(model)
    if fn is None:
        from torch._dynamo.eval_frame import innermost_backend

        backend = innermost_backend(callback)
        fn = _COMPILED_LOSS[model] = torch.compile(label_smoothed_nll_loss, backend=backend)
    return fn


def _forward(model: Any, batch: Batch, device: torch.device, autocast: Any, pin: bool
             ) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """One micro-batch's logits and targets on ``device``: ``(logits, target, ignore_index)``.

    Padded batches: the real target positions only, found on the host (a bool mask on the
    device would be read back to size the selection): logits (N, V), target (N,), nothing to
    ignore. Packed batches (``trainer.packing``): every position of the run's one (R, L)
    shape through :meth:`Transformer.forward_packed`: logits (R*L, V), target (R*L,), the
    padding ignored by the loss.
    """
    if batch.packed:
        target = to_device(batch.tgt_out.reshape(-1), device)  # (R*L,)
        batch = batch.to(device)
        with autocast():
            logits = model(batch.src_tokens, batch.tgt_in, None, batch.src_segments,
                           batch.src_positions, batch.tgt_segments,
                           batch.tgt_positions).flatten(0, 1)  # (R*L, V)
        return logits, target, PAD_ID
    keep = batch.tgt_out.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)  # (N,)
    target = batch.tgt_out.reshape(-1).index_select(0, keep)  # (N,)
    if pin:
        keep, target = keep.pin_memory(), target.pin_memory()
    keep = keep.to(device, non_blocking=True)
    target = target.to(device, non_blocking=True)
    batch = batch.to(device)
    mark_dynamic_batch(batch.src_tokens, batch.tgt_in, keep)
    with autocast():
        logits = model(batch.src_tokens, batch.tgt_in, keep)  # (N, V), N real
    torch._dynamo.maybe_mark_dynamic(logits, 0)
    torch._dynamo.maybe_mark_dynamic(target, 0)
    return logits, target, None


def forward_backward(
    model: torch.nn.Module,
    micro_batches: list[Batch | None],
    *,
    epsilon: float,
    device: torch.device,
    world_size: int,
    autocast: Any = contextlib.nullcontext,
    scaler: Any = None,
    pad_to_multiple: int = 1,
    packed_shape: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Accumulate the gradient of one optimizer step over its micro-batches.

    After DDP's averaging over ranks the gradient is that of
    ``sum(token losses over all micro-batches and ranks) / ntokens_global``.

    Args:
        model: the training model (plain, compiled, or DDP, whose ``no_sync`` is used).
        micro_batches: this rank's batches of the step; None = no data on this rank for
            that micro-step (a zero-weight dummy batch joins DDP's all-reduce).
        epsilon: label smoothing.
        world_size: data-parallel ranks (the loss factor that cancels DDP's mean).
        autocast: a callable returning the autocast context.
        scaler: an fp16 GradScaler (or None / a disabled one).
        pad_to_multiple: the batches' length multiple (``trainer.pad_to_multiple``), which
            shapes the dummy batch.
        packed_shape: ``(rows, pack_length)`` when the batches are packed
            (``trainer.packing``): the model runs :meth:`Transformer.forward_packed` on every
            position of the one static shape and the loss ignores the padding (no selection
            of real positions, whose count varies); None for padded batches.

    Returns:
        ``counts``: (5,) float64 on ``device``, global sums over all ranks in the order of
        :data:`COUNT_NAMES`: non-pad target tokens, source tokens (incl. eos), and the
        sums over sentences of source length², target length², source × target length;
        this rank's ``loss_sum``, ``nll_sum`` (float32 0-dim on ``device``, detached) and
        ``nsentences`` (int). Nothing is read back to the host: the step makes no device
        synchronisation (:func:`finish_update`, the step's one host read, reads them one step
        late).
    """
    real = [b for b in micro_batches if b is not None]
    counts = to_device(step_counts(real), device)  # from pinned memory: no wait for the copy
    distributed.all_reduce_sum(counts)  # once per step: the global normaliser
    # The factor stays on the device: reading ntokens_global here would stall every step.
    factor = (world_size / counts[0].clamp(min=1.0)).to(torch.float32)  # 0-dim
    pin = device.type == "cuda"
    loss_total = torch.zeros((), dtype=torch.float32, device=device)
    nll_total = torch.zeros((), dtype=torch.float32, device=device)
    no_sync = getattr(model, "no_sync", None)
    loss_fn = loss_function(model)
    for i, batch in enumerate(micro_batches):
        dummy = batch is None
        if dummy:
            batch = (_dummy_batch(pad_to_multiple) if packed_shape is None
                     else dummy_packed_batch(packed_shape))
        last = i == len(micro_batches) - 1
        sync_ctx = contextlib.nullcontext() if (last or no_sync is None) else no_sync()
        with sync_ctx:
            logits, target, ignore = _forward(model, batch, device, autocast, pin)
            loss, nll = loss_fn(logits, target, epsilon, ignore)
            scaled = loss * (0.0 if dummy else factor)
            if scaler is not None:
                scaled = scaler.scale(scaled)
            scaled.backward()
        if not dummy:
            loss_total += loss.detach()
            nll_total += nll.detach()
    return {
        "counts": counts,
        "loss_sum": loss_total,
        "nll_sum": nll_total,
        "nsentences": sum(b.nsentences for b in real),
    }


def step_counts(batches: list[Batch]) -> torch.Tensor:
    """The counts of :data:`COUNT_NAMES` over this rank's ``batches`` (still on the host: no
    device synchronisation), (5,) float64 on the CPU."""
    if not batches:
        return torch.zeros(5, dtype=torch.float64)
    src_lens = torch.cat([b.src_lengths for b in batches]).to(torch.float64)  # (sum B,)
    tgt_lens = torch.cat([b.tgt_lengths if b.packed else b.tgt_out.ne(PAD_ID).sum(1)
                          for b in batches]).to(torch.float64)  # (sum B,) per sentence
    return torch.stack([tgt_lens.sum(), src_lens.sum(), (src_lens * src_lens).sum(),
                        (tgt_lens * tgt_lens).sum(), (src_lens * tgt_lens).sum()])


COUNT_NAMES = ("ntokens", "src_tokens", "src_sq", "tgt_sq", "src_tgt")
"""The global sums in ``forward_backward(...)["counts"]``, in order."""


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; to a GPU from page-locked memory without blocking (a copy
    from pageable memory makes the host wait for it)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def grad_norm_(params: list[torch.nn.Parameter], clip_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (clipped to ``clip_norm`` when > 0; with clipping off
    the gradients are not touched), a float32 0-dim tensor on the parameters' device (not read
    back: no synchronisation, ``error_if_nonfinite`` off); inf/nan if any is. The norm and the
    clip are the ``foreach`` kernels (one launch per group of tensors, not one per tensor)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        device = params[0].device if params else torch.device("cpu")
        return torch.zeros((), dtype=torch.float32, device=device)
    foreach = True if with_grad[0].device.type in ("cuda", "cpu") else None
    if clip_norm <= 0:  # the norm only: clip_grad_norm_ would multiply every gradient by 1
        return torch.nn.utils.get_total_norm([p.grad for p in with_grad],
                                             foreach=foreach).float()
    return torch.nn.utils.clip_grad_norm_(with_grad, clip_norm, error_if_nonfinite=False,
                                          foreach=foreach).float()


def step_optimizer(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """``optimizer.step()`` when the 0-dim bool ``finite`` (on the device) is true, decided on
    the device: an optimizer that takes a ``found_inf`` tensor (fused Adam, as GradScaler
    drives it) is stepped unconditionally, and its kernel leaves the parameters, the moments
    and the step count exactly as they were when ``finite`` is false; no host read. Another
    optimizer reads ``finite`` first (one host synchronisation)."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif bool(finite):
        optimizer.step()


@dataclass
class PendingStep:
    """A step whose update is queued (:func:`queue_update`) and whose figures are not read
    yet (:func:`finish_update`). ``figures``: (5 + 2 + F + 1 [+ 1],) float64 on the host (on
    CUDA a page-locked buffer the device copies into; ``ready`` is the event recorded after
    that copy): the counts of :data:`COUNT_NAMES`, the loss and NLL sums over the ranks, the
    F flags summed over the ranks, the gradient norm and, with fp16 loss scaling, the loss
    scale after the step. ``lr``: the learning rate the update used; None when the step was
    launched before the previous one was read and its rate depends on that step's outcome
    (:mod:`transformer_nmt.train.whole_step`): the scheduler's rate when it is read, which
    counts that step."""

    figures: torch.Tensor
    ready: Any
    nflags: int
    lr: float | None
    scaled: bool


@dataclass
class StepFigures:
    """One step's figures as :func:`finish_update` read them: summed loss and NLL over the
    ranks (nats), gradient norm, learning rate, global target tokens, the flags summed over
    the ranks (ints) and whether the parameters were updated."""

    loss_sum: float
    nll_sum: float
    grad_norm: float
    lr: float
    ntokens: int
    flags: list[int]
    stepped: bool


def to_host(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """``t`` on the host without waiting: on CUDA an asynchronous copy into page-locked
    memory and the event that marks its end; on the CPU ``t`` itself; on another device a
    copy (a host wait)."""
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready
    return (t if t.device.type == "cpu" else t.cpu()), None


def queue_update(s: Setup, out: dict[str, Any], t_cfg: TrainerConfig,
                 flags: list[int] | None = None) -> PendingStep:
    """After one step's backward, queue its update with no host read: unscale (fp16) and
    clip, all-reduce the losses with ``flags`` (this rank's small non-negative integers: the
    loop's stop and save requests, summed over the ranks), step the optimizer with the skip
    of a non-finite loss or gradient norm decided on the device (:func:`step_optimizer`),
    update the loss scale, zero the gradients, and start copying the figures to the host.

    The learning rate is the scheduler's current one: the scheduler counts the successful
    updates (:func:`finish_update` steps it once the step is known to be finite), so the
    previous step must be finished before this one is queued.
    """
    s.scaler.unscale_(s.optimizer)
    grad_norm_t = grad_norm_(s.params, t_cfg.clip_norm)
    flags = list(flags or [])
    host_flags = to_device(torch.tensor(flags, dtype=torch.float32), s.device)  # (F,)
    losses = distributed.all_reduce_sum(
        torch.cat([torch.stack([out["loss_sum"], out["nll_sum"]]), host_flags]))
    finite = torch.isfinite(losses[0]) & torch.isfinite(grad_norm_t)  # 0-dim bool, device
    lr = s.scheduler.get_last_lr()[0]
    step_optimizer(s.optimizer, finite)
    s.scaler.update()  # fp16: lowers the scale after an overflow, on the device
    s.optimizer.zero_grad(set_to_none=not s.grads_in_buckets)
    parts = [out["counts"], losses.to(torch.float64), grad_norm_t.to(torch.float64).reshape(1)]
    scale = s.scaler._get_scale_async() if s.scaler.is_enabled() else None
    if scale is not None:
        parts.append(scale.to(torch.float64).reshape(1))
    figures, ready = to_host(torch.cat(parts))
    return PendingStep(figures, ready, len(flags), lr, scale is not None)


def read_figures(pending: PendingStep) -> list[float]:
    """The step's one host read: wait for the copy of its figures (on CUDA the event
    recorded after it, not the work queued since) and return them as floats."""
    if pending.ready is not None:
        pending.ready.synchronize()
    return pending.figures.tolist()


def finish_update(s: Setup, state: TrainState, window: Window, pending: PendingStep,
                  t_cfg: TrainerConfig, run_dir: Path) -> StepFigures:
    """Read a queued step's figures (:func:`read_figures`) and account for it: the token
    counters, and for a finite step the scheduler step, ``state.step`` and the window's
    sums; a skipped step (an fp16 overflow while the loss scale calibrates, or a non-finite
    loss or gradient, counted towards ``max_bad_steps``) is logged. Its parameters were
    left unchanged on the device by :func:`queue_update`.

    Raises:
        TrainingDiverged: ``max_bad_steps`` non-finite steps in a row, or the fp16 loss scale
            below :data:`MIN_LOSS_SCALE`.
    """
    read = read_figures(pending)
    counts = dict(zip(COUNT_NAMES, (int(x) for x in read[:5])))
    loss_sum, nll_sum = read[5], read[6]
    flags = [round(x) for x in read[7:7 + pending.nflags]]
    grad_norm = read[7 + pending.nflags]
    lr = pending.lr if pending.lr is not None else s.scheduler.get_last_lr()[0]
    state.tokens_seen += counts["ntokens"]
    state.src_tokens_seen += counts["src_tokens"]
    state.src_sq_seen += counts["src_sq"]
    state.tgt_sq_seen += counts["tgt_sq"]
    state.src_tgt_seen += counts["src_tgt"]
    fig = StepFigures(loss_sum, nll_sum, grad_norm, lr, counts["ntokens"], flags, False)
    if math.isfinite(loss_sum) and math.isfinite(grad_norm):
        s.scheduler.step()
        state.step += 1
        state.bad_steps_in_row = 0
        window.loss += loss_sum
        window.nll += nll_sum
        window.ntokens += fig.ntokens
        window.grad_norm = grad_norm
        fig.stepped = True
        return fig
    state.skipped_steps += 1
    if loss_overflow(s.scaler, loss_sum, grad_norm):
        # fp16: the dynamic loss scaler calibrating (scale halved on the device); not a
        # bad step unless the scale collapses
        state.overflow_steps += 1
        scale = read[8 + pending.nflags] if pending.scaled else float(s.scaler.get_scale())
        log.info("step %d skipped: fp16 gradient overflow, loss scale lowered to %g",
                 state.step + 1, scale)
        if scale < MIN_LOSS_SCALE:
            raise _loss_scale_error(state, scale, run_dir)
        return fig
    state.bad_steps_in_row += 1
    log.warning("step %d skipped: loss %s, gradient norm %s (%d in a row, %d in total)",
                state.step + 1, loss_sum, grad_norm, state.bad_steps_in_row, state.skipped_steps)
    if state.bad_steps_in_row >= t_cfg.max_bad_steps:
        raise _bad_steps_error(state, t_cfg, loss_sum, grad_norm, lr, run_dir)
    return fig


def apply_update(s: Setup, state: TrainState, window: Window, out: dict[str, Any],
                 t_cfg: TrainerConfig, run_dir: Path,
                 flags: list[int] | None = None) -> tuple[float, float, bool]:
    """:func:`queue_update` and :func:`finish_update` at once (the figures read at once, a
    host wait for the step's work): ``(loss_sum, lr, stepped)``, with ``out["flags"]`` and
    ``out["ntokens"]`` set. The training loop reads them one step late instead.

    Raises:
        TrainingDiverged: as :func:`finish_update`.
    """
    fig = finish_update(s, state, window, queue_update(s, out, t_cfg, flags), t_cfg, run_dir)
    out["flags"], out["ntokens"] = fig.flags, fig.ntokens
    return fig.loss_sum, fig.lr, fig.stepped


DIVERGED_EXIT = 3
"""Exit status of ``nmt-train`` when the run diverged (:class:`TrainingDiverged`)."""


class TrainingDiverged(RuntimeError):
    """Training stopped because it diverged: ``trainer.max_bad_steps`` non-finite steps in a
    row, or the fp16 loss scale collapsed. No checkpoint is written for it;
    ``last_finite_checkpoint`` is the newest one whose parameters are all finite (None when
    there is none). ``nmt-train`` reports it as one line and exits with :data:`DIVERGED_EXIT`."""

    def __init__(self, message: str, last_finite_checkpoint: Path | None) -> None:
        super().__init__(message)
        self.last_finite_checkpoint = last_finite_checkpoint


def _bad_steps_error(state: TrainState, t_cfg: TrainerConfig, loss: float, gnorm: float,
                     lr: float, run_dir: Path) -> TrainingDiverged:
    return _diverged(
        f"training stopped at step {state.step}: {state.bad_steps_in_row} "
        f"consecutive steps had a non-finite loss or gradient "
        f"(trainer.max_bad_steps={t_cfg.max_bad_steps}; last loss={loss}, "
        f"gradient norm={gnorm}, lr={lr:.3g}). Lower the learning rate "
        f"(trainer.lr_multiplier), set trainer.clip_norm, or use bf16/fp32", run_dir)


def _diverged(message: str, run_dir: Path) -> TrainingDiverged:
    """The error, naming the newest checkpoint whose parameters are all finite (or none)."""
    path = ckpt_lib.latest_finite_checkpoint(run_dir)
    good = ("no checkpoint of the run has all-finite parameters" if path is None
            else f"the last checkpoint whose parameters are all finite is {path}")
    return TrainingDiverged(f"{message}; {good}", path)


MIN_LOSS_SCALE = 1e-4
"""fp16: training stops when gradient overflows push the dynamic loss scale below this
(fairseq's ``--min-loss-scale`` default)."""


def loss_overflow(scaler: Any, loss_sum: float, grad_norm: float) -> bool:
    """True for an fp16 loss-scaler overflow: the loss is finite, the (scaled) gradient is not.

    Such a step is skipped and the scale lowered; it is normal while the scale calibrates,
    so it does not count towards ``trainer.max_bad_steps`` (a non-finite loss does).
    """
    enabled = getattr(scaler, "is_enabled", lambda: False)()
    return bool(enabled) and math.isfinite(loss_sum) and not math.isfinite(grad_norm)


def _loss_scale_error(state: TrainState, scale: float, run_dir: Path) -> TrainingDiverged:
    return _diverged(
        f"training stopped at step {state.step}: fp16 gradient overflows lowered the loss "
        f"scale to {scale:g} (< {MIN_LOSS_SCALE:g}; {state.overflow_steps} overflow steps). "
        "Lower the learning rate (trainer.lr_multiplier), set trainer.clip_norm, or use "
        "bf16/fp32", run_dir)
