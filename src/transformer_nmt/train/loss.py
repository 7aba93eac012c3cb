"""Label-smoothed cross-entropy (paper section 5.4, epsilon_ls = 0.1).

Smoothing convention: **uniform over the whole vocabulary** (Szegedy et al. 2016, the
convention of ``torch.nn.CrossEntropyLoss(label_smoothing=...)``). For a position whose
reference token is ``y`` the target distribution over the ``V`` classes is::

    q(v) = (1 - eps) * [v == y] + eps / V

so the reference class receives ``1 - eps + eps / V`` and every other class (including
the padding class) ``eps / V``. The loss of one position is the cross-entropy
``-sum_v q(v) log p(v) = (1 - eps) * nll + eps * mean_v(-log p(v))``.

Positions whose reference is ``ignore_index`` (padding) contribute nothing to either sum.
Both returned values are **sums** over the non-padding positions: the training loop divides
them once by the global count of non-padding target tokens of the optimizer step.

The forward needs three numbers per row, each a reduction over the row's logits ``x``:
the log-sum-exp ``lse = log sum_v exp(x_v)``, the sum ``sum_v x_v`` and the reference logit
``x_y``; then ``nll = lse - x_y`` and ``sum_v -log p(v) = V * lse - sum_v x_v``. The gradient
is analytic (:class:`_LabelSmoothedCrossEntropy`): for weights ``g_loss`` and ``g_nll`` of
the two sums,

    d/d logits = (g_loss + g_nll) * exp(x - lse) - g_loss * eps / V
                 - (g_loss * (1 - eps) + g_nll) * onehot(y)

on real positions and zero on padding. Both passes are a few whole-tensor operations with no
Python loop and no host synchronisation, and only the logits and (N,) vectors are saved for
the backward. Under ``torch.compile`` (the training step compiles the loss with the model's
backend, :func:`transformer_nmt.train.step.loss_function`) Inductor fuses the float32
conversion into the row reductions and the backward into one elementwise kernel: the bf16
logits are read once forward, once backward, their gradient written once, and no (N, V)
float32 buffer exists. Run eagerly, each pass makes one transient (N, V) float32 buffer,
freed before it returns.
"""

from __future__ import annotations

import torch

from transformer_nmt.config import PAD_ID


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 arithmetic for bf16 / fp16 / fp32 logits, float64 for float64 logits."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy and NLL with the analytic backward above.

    forward(logits (N, V) any float dtype, target (N,) long, epsilon, ignore_index)
    -> (loss_sum, nll_sum), both 0-dim float32 (float64 for float64 logits). Saves the
    logits, the target and the (N,) log-sum-exp; the backward recomputes ``exp(x - lse)``
    from the logits and returns their gradient in their dtype.
    """

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):  # type: ignore[override]
        vocab, dtype = logits.size(-1), _compute_dtype(logits.dtype)
        keep = None if ignore_index is None else target.ne(ignore_index).unsqueeze(-1)  # (N, 1)
        if keep is not None:
            target = target.masked_fill(~keep.squeeze(-1), 0)  # a valid index on padding
        # float32 results from the logits' dtype by type promotion: no float32 copy of them
        lse = logits.amax(-1, keepdim=True).to(dtype)  # (N, 1) the row maximum, exact
        lse = (logits - lse).exp_().sum(-1, keepdim=True).log_().add_(lse)  # (N, 1) log-sum-exp
        x_y = logits.gather(-1, target.unsqueeze(-1))  # (N, 1) the reference logit
        nll = lse - x_y  # (N, 1) -log p(y)
        # per row: (1 - eps) * nll + eps / V * (V * lse - sum_v x_v)
        #        = nll + eps * x_y - eps / V * sum_v x_v
        if keep is None:
            nll_sum = nll.sum()
            loss_sum = nll.add(x_y, alpha=epsilon).sum().sub(logits.sum(dtype=dtype),
                                                              alpha=epsilon / vocab)
            ctx.save_for_backward(logits, target, lse)
        else:  # padding rows count nothing, whatever their logits hold
            row = nll.add(x_y, alpha=epsilon).sub_(logits.sum(-1, keepdim=True, dtype=dtype),
                                                  alpha=epsilon / vocab)  # (N, 1)
            nll_sum = torch.where(keep, nll, 0.0).sum()
            loss_sum = torch.where(keep, row, 0.0).sum()
            ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon = epsilon
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):  # type: ignore[override]
        logits, target, lse, *keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        g_sum = g_loss + g_nll  # 0-dim
        at_target = g_loss.mul(eps).sub_(g_sum)  # 0-dim: -(g_loss * (1 - eps) + g_nll)
        grad = (logits - lse).exp_().mul_(g_sum).sub_(g_loss, alpha=eps / vocab)  # (N, V)
        if torch.compiler.is_compiling():  # a comparison Inductor fuses into the same kernel
            onehot = torch.arange(vocab, device=target.device) == target.unsqueeze(-1)  # (N, V)
            grad = grad + onehot * at_target
        else:  # eager: in place, no second (N, V) buffer
            grad.scatter_add_(-1, target.unsqueeze(-1), at_target.expand(target.size(0), 1))
        if keep:
            grad.mul_(keep[0])
        return grad.to(logits.dtype), None, None, None


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int | None = PAD_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-padding positions.

    Computed in float32 arithmetic whatever the dtype of ``logits`` (bf16/fp16 under
    autocast; float64 logits stay float64), as a few tensor operations that
    ``torch.compile`` fuses into row reductions (forward) and one elementwise kernel
    (backward, the analytic gradient of the module docstring); no one-hot target is built
    and no host synchronisation is made. The gradient flows to ``logits`` only.

    Args:
        logits: (N, V) unnormalised scores (any floating dtype).
        target: (N,) long reference ids; positions equal to ``ignore_index`` are ignored.
        epsilon: smoothing mass eps_ls in [0, 1), spread uniformly over all V classes.
        ignore_index: id of the padding token; None when ``target`` holds real tokens only
            (the training step selects them first), which skips the mask.

    Returns:
        ``(loss_sum, nll_sum)``: 0-dim float32 tensors, summed (not averaged) over the
        non-padding positions; ``loss_sum`` is the smoothed cross-entropy (nats),
        ``nll_sum`` the plain negative log-likelihood of the references (nats).

    Raises:
        ValueError: when the shapes do not match (N, V) and (N,), or epsilon is outside [0, 1).
    """
    if logits.dim() != 2 or target.dim() != 1 or logits.size(0) != target.size(0):
        raise ValueError(
            f"label_smoothed_nll_loss expects logits (N, V) and target (N,); got "
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)}"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label_smoothed_nll_loss: epsilon={epsilon} must be in [0, 1)")
    ignore = None if ignore_index is None else int(ignore_index)
    return _LabelSmoothedCrossEntropy.apply(logits, target, float(epsilon), ignore)
