"""The label-smoothed cross-entropy of transformer_nmt.train.loss (section 5.4): hand and reference
computations, the fused backward, padding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_nmt.config import PAD_ID
from transformer_nmt.train.loss import label_smoothed_nll_loss


def _direct_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float]:
    """Cross-entropy against an explicit target distribution, one position at a time."""
    n, v = logits.shape
    loss = nll = 0.0
    for i in range(n):
        y = int(target[i])
        if y == PAD_ID:
            continue
        logp = torch.log_softmax(logits[i].double(), dim=0)
        q = torch.full((v,), eps / v, dtype=torch.float64)  # uniform over the whole vocabulary
        q[y] += 1.0 - eps
        assert math.isclose(float(q.sum()), 1.0, rel_tol=1e-12)
        for c in range(v):
            loss -= float(q[c] * logp[c])
        nll -= float(logp[y])
    return loss, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_matches_direct_computation(eps):
    torch.manual_seed(0)
    logits = torch.randn(7, 11) * 3
    target = torch.tensor([4, PAD_ID, 1, 10, PAD_ID, 3, 0 + 2])
    loss, nll = label_smoothed_nll_loss(logits, target, eps)
    ref_loss, ref_nll = _direct_loss(logits, target, eps)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll, rel=1e-5)
    if eps == 0.0:
        assert loss.item() == pytest.approx(nll.item(), rel=1e-6)


def test_loss_agrees_with_torch_cross_entropy_and_ignores_padding():
    torch.manual_seed(1)
    logits = torch.randn(20, 50)
    target = torch.randint(1, 50, (20,))
    target[::3] = PAD_ID
    loss, _ = label_smoothed_nll_loss(logits, target, 0.1)
    ref = torch.nn.functional.cross_entropy(
        logits, target, ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum"
    )
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    # Changing the logits of padding positions changes nothing.
    logits2 = logits.clone()
    logits2[target == PAD_ID] = 100.0
    assert torch.equal(label_smoothed_nll_loss(logits2, target, 0.1)[0], loss)


def test_loss_in_fp32_from_bf16_logits():
    torch.manual_seed(2)
    logits = (torch.randn(16, 300) * 4).bfloat16()
    target = torch.randint(1, 300, (16,))
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1)
    ref_loss, ref_nll = label_smoothed_nll_loss(logits.float(), target, 0.1)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, ref_loss) and torch.equal(nll, ref_nll)


def test_loss_gradient_matches_softmax_minus_target():
    torch.manual_seed(3)
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, 4, PAD_ID])
    loss, _ = label_smoothed_nll_loss(logits, target, 0.2)
    loss.backward()
    q = torch.full((3, 5), 0.2 / 5, dtype=torch.float64)
    q[0, 1] += 0.8
    q[1, 4] += 0.8
    expected = torch.softmax(logits.detach(), -1) - q
    expected[2] = 0.0
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def _reference_loss(logits, target, eps):
    """The loss written with autograd-differentiated ops (the pre-fusion formulation)."""
    lprobs = torch.log_softmax(logits.float(), -1)
    keep = target != PAD_ID
    nll = -lprobs.gather(-1, target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    loss = (1 - eps) * nll_sum + eps / logits.size(-1) * smooth.masked_fill(~keep, 0.0).sum()
    return loss, nll_sum


@pytest.mark.parametrize("with_padding", [False, True])
def test_fused_backward_matches_autograd_for_both_outputs(with_padding):
    # Weighted sum of both returned values: checks the gradient of loss_sum and nll_sum.
    torch.manual_seed(5)
    logits = torch.randn(37, 50) * 3
    target = torch.randint(4, 50, (37,))
    if with_padding:
        target[::5] = PAD_ID
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    loss, nll = label_smoothed_nll_loss(a, target, 0.1)
    (0.7 * loss + 0.3 * nll).backward()
    ref_loss, ref_nll = _reference_loss(b, target, 0.1)
    (0.7 * ref_loss + 0.3 * ref_nll).backward()
    assert torch.allclose(loss, ref_loss) and torch.allclose(nll, ref_nll)
    assert torch.allclose(a.grad, b.grad, atol=1e-6)
    if with_padding:
        assert torch.all(a.grad[::5] == 0)


def test_ignore_index_none_equals_selecting_real_positions():
    # The training step selects real targets itself and passes ignore_index=None.
    torch.manual_seed(6)
    logits = torch.randn(20, 30)
    target = torch.randint(4, 30, (20,))
    target[::4] = PAD_ID
    keep = target != PAD_ID
    a = logits.clone().requires_grad_()
    b = logits[keep].clone().requires_grad_()
    loss, nll = label_smoothed_nll_loss(a, target, 0.1)
    loss.backward()
    loss_sel, nll_sel = label_smoothed_nll_loss(b, target[keep], 0.1, ignore_index=None)
    loss_sel.backward()
    assert torch.allclose(loss, loss_sel) and torch.allclose(nll, nll_sel)
    assert torch.allclose(a.grad[keep], b.grad, atol=1e-7)


def test_fused_backward_returns_logits_dtype_and_the_same_gradient_twice():
    logits = torch.randn(6, 11).to(torch.bfloat16).requires_grad_()
    target = torch.tensor([4, 5, 6, PAD_ID, 7, 8])
    loss, _ = label_smoothed_nll_loss(logits, target, 0.1)
    loss.backward(retain_graph=True)
    assert logits.grad.dtype == torch.bfloat16
    first = logits.grad.clone()
    loss.backward()
    torch.testing.assert_close(logits.grad, 2 * first)


def test_loss_rejects_bad_shapes():
    with pytest.raises(ValueError, match="logits"):
        label_smoothed_nll_loss(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_nll_loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 1.0)


def _previous_loss():
    """The loss before chunking (scripts/micro/bench_loss.py keeps it for the benchmark)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "micro" / "bench_loss.py"
    spec = importlib.util.spec_from_file_location("bench_loss", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.previous_loss


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loss_equals_the_previous_function_and_the_float64_formula(dtype):
    """The loss gives what the float32 log-softmax of the whole (N, V) gave (the previous
    function) and what the plain formula gives in float64, for the values and the gradient."""
    torch.manual_seed(7)
    n, v = 40, 97
    logits = (torch.randn(n, v) * 4).to(dtype)
    target = torch.randint(4, v, (n,))
    chunked = logits.clone().requires_grad_()
    loss, nll = label_smoothed_nll_loss(chunked, target, 0.1, ignore_index=None)
    (0.7 * loss + 0.3 * nll).backward()
    before = logits.clone().requires_grad_()
    prev_loss, prev_nll = _previous_loss()(before, target, 0.1)
    (0.7 * prev_loss + 0.3 * prev_nll).backward()
    exact = logits.double().requires_grad_()
    ref_loss = F.cross_entropy(exact, target, label_smoothing=0.1, reduction="sum")
    ref_nll = F.cross_entropy(exact, target, reduction="sum")
    (0.7 * ref_loss + 0.3 * ref_nll).backward()

    assert loss.item() == pytest.approx(prev_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(prev_nll.item(), rel=1e-6)
    assert chunked.grad.dtype == dtype
    atol = 1e-2 if dtype == torch.bfloat16 else 1e-6  # bf16: 8 bits of mantissa
    torch.testing.assert_close(chunked.grad, before.grad, rtol=0, atol=atol)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    torch.testing.assert_close(chunked.grad.double(), exact.grad, rtol=0, atol=atol)


def test_loss_keeps_no_float32_copy_of_the_logits_for_the_backward():
    """What the loss saves for its backward: the bf16 logits and (N,) vectors, never an
    (N, V) float32 tensor (the previous version kept the log-probabilities: 4 bytes per
    logit on top of the logits' 2)."""
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    logits = torch.randn(64, 300).bfloat16().requires_grad_()
    target = torch.randint(4, 300, (64,))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=None)
    loss.backward()
    assert saved, "no saved tensors seen"
    big = [(shape, dtype) for shape, dtype in saved if shape[-1] == 300]
    assert big == [((64, 300), torch.bfloat16)], saved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_loss_on_cuda_in_bf16_matches_float64_and_keeps_no_float32_copy():
    """On the GPU, compiled as the training step compiles it, WMT-sized rows (V = 37,000):
    the values and gradient of the plain formula in float64, and the allocator's peak above
    the bf16 logits and their gradient stays below one (N, V) float32 buffer."""
    torch.manual_seed(8)
    loss_fn = torch.compile(label_smoothed_nll_loss, dynamic=True)
    warm = torch.randn(64, 37_000, device="cuda").bfloat16().requires_grad_()
    loss_fn(warm, torch.randint(4, 37_000, (64,), device="cuda"), 0.1, None)[0].backward()
    n, v = 512, 37_000
    logits = (torch.randn(n, v, device="cuda") * 4).bfloat16().requires_grad_()
    target = torch.randint(4, v, (n,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss, _ = loss_fn(logits, target, 0.1, None)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - logits.grad.numel() * 2
    assert extra < n * v * 4, f"{extra / 2**20:.0f} MiB above the logits and their gradient"
    exact = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(exact, target, label_smoothing=0.1, reduction="sum")
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(logits.grad.double(), exact.grad, rtol=0, atol=1e-2)
