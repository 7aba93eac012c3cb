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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_nmt.config import PAD_ID


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int = PAD_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-padding positions.

    Computed in float32 whatever the dtype of ``logits`` (bf16/fp16 under autocast), with
    ``log_softmax`` + ``gather`` + ``sum``: no (N, V) one-hot target is built.

    Args:
        logits: (N, V) unnormalised scores (any floating dtype).
        target: (N,) long reference ids; positions equal to ``ignore_index`` are ignored.
        epsilon: smoothing mass eps_ls in [0, 1), spread uniformly over all V classes.
        ignore_index: id of the padding token.

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
    vocab = logits.size(-1)
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V) float32
    keep = target != ignore_index  # (N,) bool
    safe_target = target.masked_fill(~keep, 0).unsqueeze(-1)  # (N, 1)
    nll = -lprobs.gather(dim=-1, index=safe_target).squeeze(-1)  # (N,)
    smooth = -lprobs.sum(dim=-1)  # (N,) sum over classes of -log p(v)
    nll = nll.masked_fill(~keep, 0.0)
    smooth = smooth.masked_fill(~keep, 0.0)
    nll_sum = nll.sum()
    loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * smooth.sum()
    return loss_sum, nll_sum
