"""The whole optimizer step as one function (``trainer.cuda_graphs``): forward and
label-smoothed loss of every micro-batch, their gradients (``torch.autograd.grad``, traced
into the same graph), the global gradient norm and the clip, the skip of a non-finite step
as a ``torch.where`` on the device, Adam with the learning rate as a device tensor, and the
step's figures, over the run's static packed shape (``trainer.packing``).

Compiled with ``torch.compile(mode="reduce-overhead", fullgraph=True)`` on CUDA (captured
once as a CUDA graph and replayed), with the default mode on another device, and run eagerly
with ``trainer.compile=false``. The host's work per step is two copies into static device
tensors (the micro-batches as one (7, update_freq, R, L) grid; the counts, the two candidate
learning rates, the micro-batch weights and the loop's flags as one float64 vector), the
launch, and the copy of the figures back, which the loop reads one step late as it reads the
eager step's (:func:`transformer_nmt.train.step.finish_update`).

The learning rate: the scheduler counts successful steps on the host, and a step is launched
before the previous one's figures are read. The host therefore writes the rate for both
outcomes of the unread previous step, and the graph takes the one its ``finite`` flag (kept
on the device by the previous launch) selects; the loop learns which when it reads that step.

With several ranks the step sums the counts and flags, the gradients and the losses over
the ranks inside the function (functional collectives, traced into the graph), each rank on
its own copy of the model with no DDP wrapper: every rank applies the same update.

Adam is this module's own update (:func:`adam_update`, the arithmetic of PyTorch's fused
Adam), on the ``torch.optim.Adam`` object's own state tensors (``step``, ``exp_avg``,
``exp_avg_sq``, created as fused Adam creates them): checkpoints are those of the eager
step, and a run resumes with ``trainer.cuda_graphs`` on or off either way.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from transformer_nmt.config import PAD_ID, TrainerConfig
from transformer_nmt.data.batching import Batch
from transformer_nmt.train import distributed
from transformer_nmt.train import loss as loss_module
from transformer_nmt.train.step import (
    PendingStep,
    dummy_packed_batch,
    step_counts,
    to_device,
    to_host,
)

log = logging.getLogger(__name__)

GRID_FIELDS = ("src_tokens", "tgt_in", "tgt_out", "src_segments", "src_positions",
               "tgt_segments", "tgt_positions")
"""The packed batch's (R, L) tensors, in the order of the step's input grid."""


def adam_update(params: list[torch.Tensor], grads: list[torch.Tensor],
                exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                steps: list[torch.Tensor], *, lr: torch.Tensor, finite: torch.Tensor,
                beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One Adam update in place (Kingma and Ba, with L2 ``weight_decay`` added to the
    gradient as ``torch.optim.Adam`` does), as PyTorch's fused kernel computes it:
    ``m = lerp(m, g, 1 - beta1)``, ``v = beta2 v + (1 - beta2) g²``, ``p -= lr / (1 -
    beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``. Where the 0-dim bool ``finite``
    is false every parameter, moment and step count keeps its value (a ``torch.where``, no
    host read). ``lr``: 0-dim tensor on the parameters' device; ``steps``: 0-dim float32
    tensors."""
    keep = finite.to(torch.float32)
    for p, g, m, v, t in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):
        g = g.to(p.dtype)
        if weight_decay:
            g = g + weight_decay * p
        t_new = t + 1
        m_new = torch.lerp(m, g, 1 - beta1)
        v_new = v * beta2 + (1 - beta2) * g * g
        bias1 = 1 - beta1 ** t_new
        bias2_sqrt = (1 - beta2 ** t_new).sqrt()
        denom = v_new.sqrt() / bias2_sqrt + eps
        p_new = p - (lr / bias1) * m_new / denom
        p.copy_(torch.where(finite, p_new, p))
        m.copy_(torch.where(finite, m_new, m))
        v.copy_(torch.where(finite, v_new, v))
        t.add_(keep)


class WholeStep:
    """The run's step as one function over static device tensors (module docstring).

    Args:
        model: the plain training model (its parameters are updated in place).
        optimizer: the run's ``torch.optim.Adam`` (its state holds the moments and step
            counts; its first group's betas, eps and weight decay are used).
        scheduler: the run's ``LambdaLR`` (its function gives the learning rate).
        t_cfg: ``cfg.trainer`` (``update_freq``, ``label_smoothing``, ``clip_norm``).
        shape: ``(rows, pack_length)`` of every packed micro-batch.
        device: the run's device.
        autocast: a callable returning the run's autocast context.
        compile: ``torch.compile`` the step (CUDA: mode ``reduce-overhead``, a CUDA graph).
        backend: the backend off CUDA (``torch.compile``'s, default inductor).
        grad_compression: ``"bf16"``: with several ranks the gradients are all-reduced in
            bf16 (``trainer.grad_compression`` resolved); ``"none"``: in their own dtype.

    With several ranks (a process group of more than one) every rank runs this step on its
    own copy of the model, which the constructor sets to rank 0's parameters; the step sums
    the counts and flags, the gradients, and the loss and NLL over the ranks inside the
    function, so every rank applies the same update and takes the same skip decision.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, t_cfg: TrainerConfig, shape: tuple[int, int],
                 device: torch.device, autocast: Any = contextlib.nullcontext,
                 compile: bool = False, backend: Any = "inductor",
                 grad_compression: str = "none") -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.update_freq = int(t_cfg.update_freq)
        self.epsilon = float(t_cfg.label_smoothing)
        self.clip_norm = float(t_cfg.clip_norm)
        self.shape = (int(shape[0]), int(shape[1]))
        self.device = device
        self.autocast = autocast
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        group = optimizer.param_groups[0]
        self.betas = (float(group["betas"][0]), float(group["betas"][1]))
        self.eps, self.weight_decay = float(group["eps"]), float(group["weight_decay"])
        self.world_size = distributed.get_world_size()
        self.bucket_bytes = max(int(float(t_cfg.bucket_cap_mb) * 2**20), 1)
        self.compress = torch.bfloat16 if grad_compression == "bf16" else None
        if self.world_size > 1:  # as DDP starts: every rank from rank 0's parameters
            with torch.no_grad():
                for p in self.params:
                    torch.distributed.broadcast(p, src=0)
        self.finite = torch.ones((), dtype=torch.bool, device=device)
        """Whether the last launched step was finite (written by the step on the device)."""
        self.grid = torch.zeros((len(GRID_FIELDS), self.update_freq, *self.shape),
                                dtype=torch.long, device=device)
        self._scalars: dict[int, torch.Tensor] = {}
        for positions in {id(m): m for m in (model.src_positions, model.tgt_positions)}.values():
            if hasattr(positions, "table"):  # grow the sinusoidal tables now, not in the graph
                positions(self.shape[1])
        self.compiled = compile
        self.fn: Any = self.step_function
        if compile:
            for t in (self.finite, self.grid):
                torch._dynamo.mark_static_address(t)
            if device.type == "cuda":
                self.fn = torch.compile(self.step_function, mode="reduce-overhead",
                                        fullgraph=True)
            else:
                self.fn = torch.compile(self.step_function, backend=backend, fullgraph=True)

    # ---- the state ------------------------------------------------------------------------

    def optimizer_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                       list[torch.Tensor]]:
        """The Adam moments and step counts of every parameter, created (zero, step a float32
        0-dim tensor on the parameter's device, as fused Adam creates them) where the
        optimizer has none yet; read afresh each step (a resume replaces them)."""
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in self.params:
            state = self.optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if self.compiled:
                    for t in state.values():
                        torch._dynamo.mark_static_address(t)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return exp_avgs, exp_avg_sqs, steps

    def learning_rates(self, follows_unread: bool) -> tuple[float, float]:
        """``(rate if the unread previous step was skipped, rate if it stepped)``: the
        schedule at the scheduler's count of successful steps and at one more; the same rate
        twice when the previous step has been read (``follows_unread`` false)."""
        n = int(self.scheduler.last_epoch)
        lam, base = self.scheduler.lr_lambdas[0], float(self.scheduler.base_lrs[0])
        now = base * lam(n)
        return now, (base * lam(n + 1) if follows_unread else now)

    # ---- the step -------------------------------------------------------------------------

    def step_function(self, grid: torch.Tensor, scalars: torch.Tensor,
                      previous_finite: torch.Tensor, exp_avgs: list[torch.Tensor],
                      exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor]
                      ) -> torch.Tensor:
        """The step on the device, no host read: ``grid`` (7, U, R, L) long of
        :data:`GRID_FIELDS`; ``scalars`` float64 ``[counts (5), lr if the previous step was
        skipped, lr if it stepped, U micro-batch weights (1 real, 0 padding), F flags]``
        (this rank's counts and flags);
        ``previous_finite`` 0-dim bool (overwritten with this step's). Returns the figures
        (5 + 2 + F + 1,) float64 in :class:`~transformer_nmt.train.step.PendingStep`'s
        order, counts, sums and flags over all ranks.

        Several ranks: the counts and flags are all-reduced first (the normaliser is the
        global target-token count), the gradients with the loss and NLL sums after the
        backward (buckets of ``trainer.bucket_cap_mb``), before the norm, the clip and the
        finite test, which are therefore the same on every rank."""
        u = self.update_freq
        counts = scalars[:5]
        weights = scalars[7:7 + u].to(torch.float32)
        flags = scalars[7 + u:]
        if self.world_size > 1:
            summed = distributed.all_reduce_sum_traced([torch.cat([counts, flags])])[0]
            counts, flags = summed[:5], summed[5:]
        lr = torch.where(previous_finite, scalars[6], scalars[5]).to(torch.float32)
        factor = 1.0 / counts[0].clamp(min=1.0).to(torch.float32)  # 1 / global ntokens
        loss_fn = loss_module.label_smoothed_nll_loss
        params = self.params
        grads: list[torch.Tensor] | None = None
        loss_total = torch.zeros((), dtype=torch.float32, device=grid.device)
        nll_total = torch.zeros((), dtype=torch.float32, device=grid.device)
        for i in range(u):
            src, tgt_in, tgt_out, src_seg, src_pos, tgt_seg, tgt_pos = grid[:, i].unbind(0)
            with torch.enable_grad():
                with self.autocast():
                    logits = self.model(src, tgt_in, None, src_seg, src_pos, tgt_seg,
                                        tgt_pos).flatten(0, 1)  # (R*L, V)
                loss, nll = loss_fn(logits, tgt_out.reshape(-1), self.epsilon, PAD_ID)
                g = torch.autograd.grad(loss * (factor * weights[i]), params)
            grads = list(g) if grads is None else torch._foreach_add(grads, g)
            loss_total = loss_total + loss.detach() * weights[i]
            nll_total = nll_total + nll.detach() * weights[i]
        assert grads is not None
        if self.world_size > 1:
            grads, (loss_total, nll_total) = self.all_reduce(grads, loss_total, nll_total)
        # the global L2 norm and the clip as torch.nn.utils.clip_grad_norm_ computes them
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2)), 2)
        if self.clip_norm > 0:
            coef = (self.clip_norm / (norm + 1e-6)).clamp(max=1.0)
            grads = torch._foreach_mul(grads, coef)
        norm = norm.to(torch.float32)
        finite = torch.isfinite(loss_total) & torch.isfinite(norm)
        adam_update(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, finite=finite,
                    beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                    weight_decay=self.weight_decay)
        previous_finite.copy_(finite)
        return torch.cat([counts, torch.stack([loss_total, nll_total]).to(torch.float64),
                          flags, norm.to(torch.float64).reshape(1)])

    def all_reduce(self, grads: list[torch.Tensor], loss: torch.Tensor, nll: torch.Tensor
                   ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The gradients and the 0-dim loss and NLL sums summed over the ranks: in the
        gradients' last bucket, or with bf16 compression in an all-reduce of their own (the
        figures keep float32)."""
        sums = torch.stack([loss, nll])
        if self.compress is None:
            *grads, sums = distributed.all_reduce_sum_traced([*grads, sums], self.bucket_bytes)
        else:
            grads = distributed.all_reduce_sum_traced(grads, self.bucket_bytes, self.compress)
            sums = distributed.all_reduce_sum_traced([sums])[0]
        return grads, (sums[0], sums[1])

    def host_inputs(self, micro_batches: list[Batch | None], flags: list[int],
                    follows_unread: bool) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """The step's two host tensors: the (7, U, R, L) grid (a missing micro-batch, at the
        end of an epoch, all padding with weight 0) and the float64 scalars of
        :meth:`step_function`; and the two candidate learning rates."""
        u, (rows, length) = self.update_freq, self.shape
        if len(micro_batches) > u:
            raise ValueError(f"{len(micro_batches)} micro-batches for update_freq {u}")
        real = [b for b in micro_batches if b is not None]
        grid = torch.empty((len(GRID_FIELDS), u, rows, length), dtype=torch.long)
        weights = torch.zeros(u, dtype=torch.float64)
        for i in range(u):
            batch = micro_batches[i] if i < len(micro_batches) else None
            if batch is None:
                batch = dummy_packed_batch(self.shape)
            elif tuple(batch.src_tokens.shape) != self.shape or not batch.packed:
                raise ValueError(f"micro-batch of shape {tuple(batch.src_tokens.shape)}; the "
                                 f"step's packed shape is {self.shape}")
            else:
                weights[i] = 1.0
            for f, name in enumerate(GRID_FIELDS):
                grid[f, i] = getattr(batch, name)
        lr_skipped, lr_stepped = self.learning_rates(follows_unread)
        scalars = torch.cat([step_counts(real), torch.tensor([lr_skipped, lr_stepped],
                                                             dtype=torch.float64),
                             weights, torch.tensor(flags, dtype=torch.float64)])
        return grid, scalars, lr_skipped, lr_stepped

    def launch(self, micro_batches: list[Batch | None], flags: list[int] | None = None, *,
               follows_unread: bool = False) -> PendingStep:
        """Queue one step over ``micro_batches`` (at most ``update_freq`` packed batches of
        the run's shape) with the loop's ``flags``, no host read; ``follows_unread``: the
        previous step's figures are not read yet (its outcome picks the learning rate on the
        device). Returns the step as the loop reads it (:func:`finish_update`), its learning
        rate None when it depends on that previous step.

        Raises:
            ValueError: more micro-batches than ``update_freq``, or one of another shape.
        """
        flags = list(flags or [])
        grid, scalars, lr_skipped, lr_stepped = self.host_inputs(micro_batches, flags,
                                                                  follows_unread)
        self.grid.copy_(to_device(grid, self.device), non_blocking=True)
        static = self._scalars.get(len(scalars))
        if static is None:
            static = self._scalars[len(scalars)] = torch.zeros(
                len(scalars), dtype=torch.float64, device=self.device)
            if self.compiled:
                torch._dynamo.mark_static_address(static)
        static.copy_(to_device(scalars, self.device), non_blocking=True)
        exp_avgs, exp_avg_sqs, steps = self.optimizer_state()
        if self.compiled and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), torch._dynamo.config.patch(trace_autograd_ops=True):
            figures = self.fn(self.grid, static, self.finite, exp_avgs, exp_avg_sqs, steps)
        host, ready = to_host(figures)
        lr = None if lr_skipped != lr_stepped else lr_skipped
        return PendingStep(host, ready, len(flags), lr, False)


def build_whole_step(run: Any, t_cfg: TrainerConfig) -> WholeStep:
    """The :class:`WholeStep` of a run's :class:`~transformer_nmt.train.setup.Setup`,
    compiled when ``trainer.compile`` resolves to on for its device."""
    from transformer_nmt.train.setup import (
        compile_enabled,
        limit_recompiles,
        resolve_grad_compression,
    )

    compiled = compile_enabled(t_cfg.compile, run.device)
    if compiled:
        limit_recompiles(run.device)
    log.info("the whole step in one function (trainer.cuda_graphs): %s",
             "compiled, captured as a CUDA graph" if compiled and run.device.type == "cuda"
             else "compiled" if compiled else "eager (trainer.compile=false: no graph)")
    return WholeStep(run.model, run.optimizer, run.scheduler, t_cfg, run.packed_shape,
                     run.device, run.autocast, compile=compiled,
                     grad_compression=resolve_grad_compression(str(t_cfg.grad_compression),
                                                               run.device))
