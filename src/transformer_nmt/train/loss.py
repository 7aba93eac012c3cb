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

The gradient is computed analytically in one pass over the (N, V) log-probabilities
(:class:`_LabelSmoothedCrossEntropy`): for weights ``g_loss`` and ``g_nll`` of the two sums,

    d/d logits = (g_loss + g_nll) * softmax(logits) - g_loss * eps / V
                 - (g_loss * (1 - eps) + g_nll) * onehot(y)

on real positions and zero on padding, instead of the chain of log_softmax, gather and sum
backward kernels (each of which reads or writes a full (N, V) buffer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_nmt.config import PAD_ID


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy and NLL with the analytic backward above.

    forward(logits (N, V) any float dtype, target (N,) long, epsilon, ignore_index)
    -> (loss_sum, nll_sum), both 0-dim float32. The float32 log-probabilities are kept for
    the backward, which turns them into the gradient in place: the graph can be
    back-propagated through once (``retain_graph=True`` is refused).
    """

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):  # type: ignore[override]
        vocab = logits.size(-1)
        lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V) float32
        if ignore_index is None:  # the caller guarantees real targets only: no mask, no sync
            keep, all_real = target, True
        else:
            keep = target != ignore_index  # (N,) bool
            all_real = bool(keep.all())
        safe_target = target if all_real else target.masked_fill(~keep, 0)
        nll = -lprobs.gather(dim=-1, index=safe_target.unsqueeze(-1)).squeeze(-1)  # (N,)
        smooth = -lprobs.sum(dim=-1)  # (N,) sum over classes of -log p(v)
        if not all_real:
            nll = nll.masked_fill(~keep, 0.0)
            smooth = smooth.masked_fill(~keep, 0.0)
        nll_sum = nll.sum()
        loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * smooth.sum()
        ctx.save_for_backward(lprobs, safe_target, keep)
        ctx.epsilon, ctx.all_real, ctx.logits_dtype = epsilon, all_real, logits.dtype
        ctx.consumed = False
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):  # type: ignore[override]
        if ctx.consumed:
            raise RuntimeError(
                "label_smoothed_nll_loss: backward called twice on one graph "
                "(retain_graph=True is not supported)"
            )
        ctx.consumed = True
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.size(-1)
        g_loss = g_loss.float() if g_loss is not None else torch.zeros((), device=lprobs.device)
        g_nll = g_nll.float() if g_nll is not None else torch.zeros((), device=lprobs.device)
        grad = lprobs.exp_().mul_(g_loss + g_nll)  # (N, V): softmax * (g_loss + g_nll)
        grad.sub_(g_loss * (eps / vocab))
        at_target = -(g_loss * (1.0 - eps) + g_nll)  # 0-dim
        grad.scatter_add_(
            -1, target.unsqueeze(-1), at_target.expand(target.size(0), 1).contiguous()
        )
        if not ctx.all_real:
            grad.mul_(keep.unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int | None = PAD_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-padding positions.

    Computed in float32 whatever the dtype of ``logits`` (bf16/fp16 under autocast), with
    ``log_softmax`` + ``gather`` + ``sum``: no (N, V) one-hot target is built. The backward
    is the fused analytic gradient of the module docstring (one pass over (N, V)); the
    gradient flows to ``logits`` only, once per graph.

    Args:
        logits: (N, V) unnormalised scores (any floating dtype).
        target: (N,) long reference ids; positions equal to ``ignore_index`` are ignored.
        epsilon: smoothing mass eps_ls in [0, 1), spread uniformly over all V classes.
        ignore_index: id of the padding token; None when ``target`` holds real tokens only
            (the training step selects them first), which skips the mask and its host sync.

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
