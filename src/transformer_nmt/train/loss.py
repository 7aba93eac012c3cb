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

The forward needs three numbers per row, each a reduction over the row's logits ``x`` (taken
in float32): the log-sum-exp ``lse = log sum_v exp(x_v)`` (``logsumexp``, shifted by the row
maximum), the sum ``sum_v x_v`` and the reference logit ``x_y``; then ``nll = lse - x_y`` and
the row's loss is ``nll + eps * (x_y - mean_v x_v)`` (the same as ``(1 - eps) * nll + eps *
mean_v(-log p(v))``), summed over the rows. Padding rows are masked by a multiply (their
logits must be finite). The gradient is analytic (:class:`_LabelSmoothedCrossEntropy`): for
weights ``g_loss`` and ``g_nll`` of the two sums,

    d/d logits = (g_loss + g_nll) * exp(x - lse) - g_loss * eps / V
                 - (g_loss * (1 - eps) + g_nll) * onehot(y)

on real positions and zero on padding; in training only the loss has a gradient (``g_nll``
is not materialised), so it is ``g_loss * (exp(x - lse) - eps / V - (1 - eps) * onehot(y))``.
Both passes are a few whole-tensor operations (18 aten operations per training call,
forward and backward, autograd's own included) with no Python loop and no host
synchronisation, and only the logits and (N, 1) vectors are saved for the backward. Under
``torch.compile`` (the training step compiles the loss with the model's backend,
:func:`transformer_nmt.train.step.loss_function`) Inductor fuses the float32 conversion into
the row reductions and the backward into one elementwise kernel: the bf16 logits are read
once forward, once backward, their gradient written once, and no (N, V) float32 buffer
exists. Run eagerly on bf16 / fp16 logits, the forward makes two transient (N, V) float32
buffers (the float32 logits, the log-sum-exp's exponentials) and the backward one, each freed
before it returns. On float32 / float64 logits (CPU training; compiled or not, so that both
compute the same values) the forward is one log-softmax kernel whose (N, V) result is saved in
place of the logits (the same memory) and turned into the gradient in place by the backward:
run eagerly, as fast as PyTorch's own log-softmax loss.
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
    logits, the (N, 1) target index, the (N, 1) log-sum-exp (and the (N, 1) padding mask);
    the backward recomputes ``exp(x - lse)`` from the logits and returns their gradient in
    their dtype. Gradients are not materialised: an output nothing depends on (the NLL in
    training) costs no zero tensor and no arithmetic.
    """

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        vocab = logits.size(-1)
        index = target.unsqueeze(-1)  # (N, 1)
        keep = None
        if ignore_index is not None:
            keep = index.ne(ignore_index)  # (N, 1)
            index = index * keep  # a valid index (0) on padding rows
        # float32 / float64 logits: one log-softmax kernel, whose (N, V) result replaces the
        # logits as the saved tensor (the same memory, two passes fewer when run eagerly)
        ctx.log_probs = logits.dtype in (torch.float32, torch.float64)
        if ctx.log_probs:
            lprobs = torch.log_softmax(logits, -1)  # (N, V) log p
            lp_y = lprobs.gather(-1, index)  # (N, 1) log p(y)
            # per row, (1 - eps) * nll + eps * mean_v(-log p(v)) = nll + eps * (lp_y - mean lp)
            nll = lp_y.neg()  # (N, 1) -log p(y)
            smooth = lp_y.sub_(lprobs.sum(-1, keepdim=True), alpha=1.0 / vocab)  # (N, 1)
            saved, lse = lprobs, None
        else:
            # the float32 values of the logits (no copy for float32 / float64 logits), which
            # Inductor fuses into the three row reductions below
            x = logits.to(_compute_dtype(logits.dtype))  # (N, V)
            lse = x.logsumexp(-1, keepdim=True)  # (N, 1) log-sum-exp (shifted by the row max)
            x_y = x.gather(-1, index)  # (N, 1) the reference logit
            # per row, (1 - eps) * nll + eps * (lse - mean_v x_v) = nll + eps * (x_y - mean_v x_v)
            nll = lse - x_y  # (N, 1) -log p(y)
            smooth = x_y.sub_(x.sum(-1, keepdim=True), alpha=1.0 / vocab)  # (N, 1)
            saved = logits
        if keep is not None:  # padding rows count nothing (their logits must be finite)
            nll = nll.mul_(keep)
            smooth = smooth.mul_(keep)
        tensors = (saved, index) if lse is None else (saved, index, lse)
        ctx.save_for_backward(*tensors, *(() if keep is None else (keep,)))
        nll_sum = nll.sum()
        ctx.epsilon = epsilon
        return torch.add(nll_sum, smooth.sum(), alpha=epsilon), nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):  # type: ignore[override]
        if ctx.log_probs:
            lprobs, index, *keep = ctx.saved_tensors
            logits = lprobs  # (N, V) log p, in the logits' dtype
        else:
            logits, index, lse, *keep = ctx.saved_tensors
        if g_loss is None and g_nll is None:
            return None, None, None, None
        eps, vocab = ctx.epsilon, logits.size(-1)
        if ctx.log_probs:
            # (N, V) softmax, in place: the saved log-probabilities become the gradient (a
            # second backward through this call is refused by autograd's version check)
            p = lprobs.exp_()
        else:
            p = (logits - lse).exp_()  # (N, V) softmax, float32 (float64 for float64 logits)
        if g_nll is None:  # training: the loss alone, g * (p - eps / V - (1 - eps) onehot(y))
            grad = _minus_onehot(p.sub_(eps / vocab), index, 1.0 - eps).mul_(g_loss)
        else:  # both: the same loss term (bit for bit where g_nll is 0), plus the NLL's
            if g_loss is None:
                g_loss = torch.zeros_like(g_nll)
            compiling = torch.compiler.is_compiling()
            nll_dir = _minus_onehot(p if compiling else p.clone(), index, 1.0)  # p - onehot(y)
            grad = _minus_onehot(p.sub(eps / vocab), index, 1.0 - eps).mul_(g_loss)
            grad = grad.add_(nll_dir.mul_(g_nll))
        if keep:
            grad.mul_(keep[0])
        return grad.to(logits.dtype), None, None, None


def _minus_onehot(grad: torch.Tensor, index: torch.Tensor, value: float) -> torch.Tensor:
    """``grad - value * onehot(index)`` for (N, V) ``grad`` and (N, 1) ``index``: eager, in
    place (one scatter, no second (N, V) buffer); compiled, a comparison that Inductor fuses
    into the backward's one elementwise kernel."""
    if torch.compiler.is_compiling():
        onehot = torch.arange(grad.size(-1), device=index.device) == index  # (N, V)
        return grad - onehot * value
    return grad.scatter_(-1, index, -value, reduce="add")


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
