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

The gradient is computed analytically (:class:`_LabelSmoothedCrossEntropy`): for weights
``g_loss`` and ``g_nll`` of the two sums,

    d/d logits = (g_loss + g_nll) * softmax(logits) - g_loss * eps / V
                 - (g_loss * (1 - eps) + g_nll) * onehot(y)

on real positions and zero on padding, instead of the chain of log_softmax, gather and sum
backward kernels (each of which reads or writes a full (N, V) buffer). Both passes go over
the logits in chunks of rows converted to float32 one at a time (:data:`CHUNK_ELEMENTS`):
the forward keeps no (N, V) buffer of its own, so the logits (bf16 under autocast) are read
once forward, read once backward and their gradient written once, with no (N, V) float32
buffer (the previous version kept an (N, V) float32 copy of the log-probabilities;
``scripts/bench_loss.py`` measures both, docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_nmt.config import PAD_ID

CHUNK_ELEMENTS = 1 << 22
"""Elements of the (N, V) logits converted to float32 at a time (4M: 16 MB of float32, a
chunk of 113 rows at V = 37,000): the chunk's float32 temporaries stay in cache (a GPU's L2,
a CPU's last-level cache) instead of making (N, V) float32 copies in main memory."""


def _chunks(n: int, vocab: int, chunk_elements: int) -> list[tuple[int, int]]:
    rows = max(1, chunk_elements // max(vocab, 1))
    return [(i, min(i + rows, n)) for i in range(0, n, rows)]


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy and NLL with the analytic backward above.

    forward(logits (N, V) any float dtype, target (N,) long, epsilon, ignore_index,
    chunk_elements) -> (loss_sum, nll_sum), both 0-dim float32. Both passes walk the logits
    in chunks of rows (about ``chunk_elements`` elements each) converted to float32 one at a
    time: the forward reads the logits once (log-softmax, gather, sum per chunk) and keeps
    nothing of size (N, V) but the logits themselves; the backward reads them once more
    (softmax per chunk) and writes their gradient once, in the logits' dtype. The graph can
    be back-propagated through once (``retain_graph=True`` is refused).
    """

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index, chunk_elements):  # type: ignore[override]
        n, vocab = logits.shape
        if ignore_index is None:  # the caller guarantees real targets only: no mask, no sync
            keep, all_real = target, True
        else:
            keep = target != ignore_index  # (N,) bool
            all_real = bool(keep.all())
        safe_target = target if all_real else target.masked_fill(~keep, 0)
        nll = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,) -log p(y)
        smooth = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,) sum_v -log p(v)
        for a, b in _chunks(n, vocab, chunk_elements):
            lprobs = F.log_softmax(logits[a:b].float(), dim=-1)  # (rows, V) float32, one chunk
            nll[a:b] = lprobs.gather(-1, safe_target[a:b].unsqueeze(-1)).squeeze(-1).neg_()
            smooth[a:b] = lprobs.sum(dim=-1).neg_()
        if not all_real:
            nll = nll.masked_fill(~keep, 0.0)
            smooth = smooth.masked_fill(~keep, 0.0)
        nll_sum = nll.sum()
        loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * smooth.sum()
        ctx.save_for_backward(logits, safe_target, keep)
        ctx.epsilon, ctx.all_real, ctx.chunk_elements = epsilon, all_real, chunk_elements
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
        logits, target, keep = ctx.saved_tensors
        eps, (n, vocab) = ctx.epsilon, logits.shape
        g_loss = g_loss.float() if g_loss is not None else torch.zeros((), device=logits.device)
        g_nll = g_nll.float() if g_nll is not None else torch.zeros((), device=logits.device)
        g_sum = g_loss + g_nll
        uniform = g_loss * (eps / vocab)
        at_target = -(g_loss * (1.0 - eps) + g_nll)  # 0-dim
        grad = torch.empty_like(logits)  # (N, V) in the logits' dtype, written once
        for a, b in _chunks(n, vocab, ctx.chunk_elements):
            g = torch.softmax(logits[a:b].float(), dim=-1)  # (rows, V) float32, one chunk
            g.mul_(g_sum).sub_(uniform)
            g.scatter_add_(-1, target[a:b].unsqueeze(-1), at_target.expand(b - a, 1).contiguous())
            if not ctx.all_real:
                g.mul_(keep[a:b].unsqueeze(-1))
            grad[a:b] = g
        return grad, None, None, None, None


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int | None = PAD_ID,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-padding positions.

    Computed in float32 arithmetic whatever the dtype of ``logits`` (bf16/fp16 under
    autocast), chunk by chunk of rows: no (N, V) float32 copy and no one-hot target is built;
    the forward reads the logits once, the backward (the fused analytic gradient of the module
    docstring) reads them once and writes their gradient once. The gradient flows to
    ``logits`` only, once per graph.

    Args:
        logits: (N, V) unnormalised scores (any floating dtype).
        target: (N,) long reference ids; positions equal to ``ignore_index`` are ignored.
        epsilon: smoothing mass eps_ls in [0, 1), spread uniformly over all V classes.
        ignore_index: id of the padding token; None when ``target`` holds real tokens only
            (the training step selects them first), which skips the mask and its host sync.
        chunk_elements: about this many logits are converted to float32 at a time
            (:data:`CHUNK_ELEMENTS`); the result does not depend on it beyond round-off.

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
    return _LabelSmoothedCrossEntropy.apply(logits, target, float(epsilon), ignore,
                                            max(int(chunk_elements), 1))
