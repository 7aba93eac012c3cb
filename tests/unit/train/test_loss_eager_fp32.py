"""The loss run eagerly on float32 logits (CPU training): one log-softmax kernel whose result
is the only (N, V) tensor saved, turned into the gradient in place; still the float64 formula."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.train.loss import label_smoothed_nll_loss


def _saved_shapes(logits, target, ignore_index=None):
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype, t.data_ptr() == logits.data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, nll = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=ignore_index)
    return loss, nll, saved


def test_float32_saves_the_log_probabilities_not_the_logits():
    torch.manual_seed(0)
    logits = torch.randn(40, 300, requires_grad=True)
    target = torch.randint(4, 300, (40,))
    loss, _, saved = _saved_shapes(logits, target)
    big = [s for s in saved if s[0][-1] == 300]
    assert big == [((40, 300), torch.float32, False)], saved  # one (N, V): log p, a new tensor
    loss.backward()
    x = logits.detach().double()
    lp = torch.log_softmax(x, -1)
    onehot = torch.nn.functional.one_hot(target, 300).double()
    grad = lp.exp() - 0.1 / 300 - 0.9 * onehot
    torch.testing.assert_close(logits.grad.double(), grad, rtol=0, atol=1e-6)
    ref = (-(0.9 * onehot + 0.1 / 300) * lp).sum()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_a_second_backward_through_one_float32_call_is_refused_not_wrong():
    logits = torch.randn(6, 11, requires_grad=True)
    target = torch.tensor([4, 5, 6, 0, 7, 8])
    loss, _ = label_smoothed_nll_loss(logits, target, 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_float32_matches_float64_on_padded_rows_with_both_outputs():
    torch.manual_seed(1)
    logits = torch.randn(30, 50)
    target = torch.randint(4, 50, (30,))
    target[::4] = 0
    a = logits.clone().requires_grad_()
    b = logits.clone().double().requires_grad_()  # float64: the log-softmax path too
    la, na = label_smoothed_nll_loss(a, target, 0.1)
    lb, nb = label_smoothed_nll_loss(b, target, 0.1)
    (la + 0.5 * na).backward()
    (lb + 0.5 * nb).backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-6)
    torch.testing.assert_close(a.grad.double(), b.grad, rtol=0, atol=1e-6)
    assert (a.grad[::4] == 0).all()
