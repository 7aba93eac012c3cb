"""The label-smoothed loss as a few tensor operations the compiler fuses: a fixed number of
aten operations per call whatever the batch, no graph break with a symbolic token count, one
fused kernel each way under Inductor with no (N, V) float32 buffer, and the training step
compiling it with the model's backend."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
import torch.nn.functional as F
from helpers import CountOps

from transformer_nmt.train.loss import label_smoothed_nll_loss

MAX_OPS_PER_CALL = 19
"""aten operations of one loss call, forward and backward together, including autograd's own
(the seed gradient and the gradient accumulation; the NLL's unused gradient is not
materialised). 29 before the log-sum-exp, the smoothing term and the one-hot were folded."""


def _ops_per_call(n: int, vocab: int) -> list[str]:
    """aten operations of forward + backward at (n, vocab) bf16 logits on the meta device."""
    logits = torch.empty(n, vocab, dtype=torch.bfloat16, device="meta", requires_grad=True)
    target = torch.empty(n, dtype=torch.long, device="meta")
    with CountOps() as count:
        loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=None)
        loss.backward()
    return count.ops


def test_ops_per_loss_call_are_few_and_do_not_grow_with_the_batch():
    """WMT size (N = 25,000 target tokens, V = 37,000) and a small batch make the same
    operations: no loop over chunks of rows (the chunked loss made thousands at WMT size)."""
    wmt = _ops_per_call(25_000, 37_000)
    small = _ops_per_call(100, 37_000)
    assert wmt == small
    assert len(wmt) <= MAX_OPS_PER_CALL, wmt
    assert "scatter_" in wmt and "gather" in wmt  # the analytic backward, not autograd's
    assert "_log_softmax" not in wmt and "_softmax" not in wmt


def test_loss_has_no_graph_break_with_a_symbolic_token_count():
    logits = torch.randn(13, 50).bfloat16().requires_grad_()
    target = torch.randint(4, 50, (13,))
    torch._dynamo.reset()
    torch._dynamo.maybe_mark_dynamic(logits, 0)  # what the training step marks
    torch._dynamo.maybe_mark_dynamic(target, 0)
    explanation = torch._dynamo.explain(label_smoothed_nll_loss)(logits, target, 0.1, None)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    inputs = [node.meta["example_value"] for node in explanation.graphs[0].graph.nodes
              if node.op == "placeholder"]
    shapes = [x.shape for x in inputs if isinstance(x, torch.Tensor)]
    assert all(isinstance(shape[0], torch.SymInt) for shape in shapes), shapes  # N symbolic
    padded = target.clone()
    padded[::4] = 0
    explanation = torch._dynamo.explain(label_smoothed_nll_loss)(logits, padded, 0.1, 0)
    assert explanation.graph_break_count == 0, explanation.break_reasons  # no host read of the mask
    torch._dynamo.reset()


def test_compiled_loss_equals_eager_and_the_float64_formula():
    """The graph the compiler is given (AOT autograd, eager kernels): the forward of the
    module docstring and the one-hot of the compiled backward give the float64 values."""
    torch._dynamo.reset()
    compiled = torch.compile(label_smoothed_nll_loss, backend="aot_eager", dynamic=True)
    torch.manual_seed(0)
    for n in (17, 40):
        logits = (torch.randn(n, 97) * 4).requires_grad_()
        target = torch.randint(4, 97, (n,))
        loss, nll = compiled(logits, target, 0.1, None)
        (0.7 * loss + 0.3 * nll).backward()
        exact = logits.detach().double().requires_grad_()
        ref_loss = F.cross_entropy(exact, target, label_smoothing=0.1, reduction="sum")
        ref_nll = F.cross_entropy(exact, target, reduction="sum")
        (0.7 * ref_loss + 0.3 * ref_nll).backward()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
        assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
        torch.testing.assert_close(logits.grad.double(), exact.grad, rtol=0, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU backend needs a C++ compiler")
def test_inductor_fuses_the_loss_into_one_kernel_each_way_with_no_float32_logits():
    """Inductor on the CPU (the same fusion decisions as on a GPU): the forward is one
    kernel reading the bf16 logits, the backward one kernel writing their bf16 gradient,
    and no buffer of the logits' size is float32."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(label_smoothed_nll_loss, dynamic=True)
    logits = (torch.randn(40, 97) * 4).bfloat16().requires_grad_()
    target = torch.randint(4, 97, (40,))

    def call():
        loss, _ = compiled(logits, target, 0.1, None)
        loss.backward()
        return loss

    loss, codes = run_and_get_code(call)
    torch._dynamo.reset()
    assert len(codes) == 2  # forward, backward
    for code in codes:
        kernels = set(re.findall(r"\b(cpp_fused_\w+) = ", code))
        assert len(kernels) == 1, kernels
        buffers = re.findall(
            r"empty_strided_cpu\(\((\w+), (\w+)\), \([^)]*\), torch\.(\w+)\)", code)
        assert all(dtype != "float32" for rows, cols, dtype in buffers if cols != "1"), buffers
    exact = F.cross_entropy(logits.detach().double(), target, label_smoothing=0.1, reduction="sum")
    assert loss.item() == pytest.approx(exact.item(), rel=1e-5)


def test_training_step_compiles_the_loss_with_the_model_backend_once():
    """A compiled model gets the loss compiled with its backend (a second frame beside the
    model's), traced once for every token count; an uncompiled model gets the eager loss."""
    import numpy as np
    from torch._dynamo.testing import CompileCounterWithBackend

    from transformer_nmt.config import ModelConfig
    from transformer_nmt.data.batching import collate
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.train.step import forward_backward, loss_function

    cfg = ModelConfig(name="test", encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32,
                      heads=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      max_positions=64)
    model = Transformer(cfg, vocab_size=23).train()
    assert loss_function(model) is label_smoothed_nll_loss
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter)
    rng = np.random.default_rng(0)
    eager_losses, compiled_losses = [], []
    for lengths in ([5, 3, 7], [9, 4], [6, 6, 2, 8]):
        batch = collate([(i, rng.integers(4, 23, n), rng.integers(4, 23, n + 1))
                         for i, n in enumerate(lengths)])
        for fn, out in ((model, eager_losses), (compiled, compiled_losses)):
            result = forward_backward(fn, [batch], epsilon=0.1, device=torch.device("cpu"),
                                      world_size=1)
            out.append(result["loss_sum"].item())
            model.zero_grad(set_to_none=True)
    assert loss_function(compiled) is loss_function(compiled)  # one compiled loss per model
    torch._dynamo.reset()
    assert counter.frame_count == 2, counter.frame_count  # the model and the loss
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses))
