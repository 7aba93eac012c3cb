"""The label-smoothed loss with its reductions folded: the log-sum-exp, the smoothing term and
the reference logit from one float32 view of the logits, padding masked by a multiply, and
no gradient materialised for an unused output; still exact to the float64 formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import CountOps

from transformer_nmt.train.loss import label_smoothed_nll_loss


def _ops(ignore_index: int | None) -> tuple[list[str], list[str]]:
    logits = torch.empty(25_000, 37_000, dtype=torch.bfloat16, device="meta",
                         requires_grad=True)
    target = torch.empty(25_000, dtype=torch.long, device="meta")
    with CountOps() as fwd:
        loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index)
    with CountOps() as bwd:
        loss.backward()
    return fwd.ops, bwd.ops


def test_training_call_is_under_twenty_ops_and_materialises_no_zero_gradient():
    fwd, bwd = _ops(None)
    assert len(fwd) + len(bwd) < 20, (fwd, bwd)
    assert "zeros" not in bwd and "zeros_like" not in bwd  # the NLL's gradient is None


def test_padding_is_masked_by_a_multiply():
    fwd, bwd = _ops(0)
    assert "masked_fill" not in fwd and "where" not in fwd and "bitwise_not" not in fwd, fwd
    assert len(fwd) + len(bwd) <= 23, (fwd, bwd)  # 39 with masked_fill and where


@pytest.mark.parametrize("shift", [0.0, 100.0])
@pytest.mark.parametrize("weights", [(1.0, None), (0.7, 0.3), (None, 1.0)])
def test_values_and_gradient_equal_float64_whichever_outputs_are_used(shift, weights):
    """The loss alone (training), both outputs, or the NLL alone: the float64 formula's
    values and gradient at 1e-6; with logits near 100 (exp overflows float32 without the
    log-sum-exp's shift) the gradient to float32's resolution there (ulp(100) = 7.6e-6)."""
    torch.manual_seed(11)
    logits = torch.randn(53, 101) * 4 + shift
    target = torch.randint(4, 101, (53,))
    x = logits.clone().requires_grad_()
    loss, nll = label_smoothed_nll_loss(x, target, 0.1, ignore_index=None)
    w_loss, w_nll = weights
    total = sum(w * t for w, t in ((w_loss, loss), (w_nll, nll)) if w is not None)
    total.backward()
    exact = logits.double().requires_grad_()
    ref_loss = F.cross_entropy(exact, target, label_smoothing=0.1, reduction="sum")
    ref_nll = F.cross_entropy(exact, target, reduction="sum")
    sum(w * t for w, t in ((w_loss, ref_loss), (w_nll, ref_nll)) if w is not None).backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    atol = 1e-6 if shift == 0.0 else 1e-4
    torch.testing.assert_close(x.grad.double(), exact.grad, rtol=0, atol=atol)
