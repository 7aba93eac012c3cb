"""The attention kernels are chosen by config: every SDPA call of the model runs under
``torch.nn.attention.sdpa_kernel`` with the configured list (training and decoding), the
default leaves cuDNN attention out, unknown names are refused, and on a GPU the chosen
kernels give the math backend's gradients on padded batches of odd lengths."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.attention import SDPBackend

from transformer_nmt.config import EOS_ID, PAD_ID, DecodeConfig, ModelConfig, TrainerConfig
from transformer_nmt.errors import UserError
from transformer_nmt.model import transformer as transformer_mod
from transformer_nmt.model.transformer import Transformer

V = 29
TINY = ModelConfig(name="test", encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64,
                   heads=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                   max_positions=128)


def _padded_batch(lengths: list[tuple[int, int]], device: str = "cpu"):
    """Source (B, S) and target input (B, T) with padding, S and T the longest lengths."""
    g = torch.Generator().manual_seed(0)
    s_max, t_max = max(s for s, _ in lengths), max(t for _, t in lengths)
    src = torch.full((len(lengths), s_max), PAD_ID, dtype=torch.long)
    tgt = torch.full((len(lengths), t_max), PAD_ID, dtype=torch.long)
    for i, (s, t) in enumerate(lengths):
        src[i, :s - 1] = torch.randint(4, V, (s - 1,), generator=g)
        src[i, s - 1] = EOS_ID
        tgt[i, :t] = torch.randint(4, V, (t,), generator=g)
    return src.to(device), tgt.to(device)


class _Recorder:
    """Stands in for ``sdpa_kernel``: records each call's backends and priority flag."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[SDPBackend], bool]] = []

    def __call__(self, backends, set_priority=False):
        self.calls.append((list(backends), set_priority))
        return contextlib.nullcontext()


def test_default_backends_leave_cudnn_out():
    assert TrainerConfig().sdpa_backends == ["flash", "efficient", "math"]
    assert DecodeConfig().sdpa_backends == ["flash", "efficient", "math"]


def test_every_attention_runs_under_the_configured_backends(monkeypatch):
    """Training forward (encoder, decoder self and cross attention): one ``sdpa_kernel``
    entry per attention call, each with the configured list in order, as priorities."""
    recorder = _Recorder()
    monkeypatch.setattr(transformer_mod, "sdpa_kernel", recorder)
    model = Transformer(TINY, vocab_size=V).train()
    src, tgt = _padded_batch([(7, 5), (3, 6), (5, 2)])
    model(src, tgt)
    assert recorder.calls == []  # None: PyTorch's own choice, no context
    model.set_sdpa_backends(["efficient", "math"])
    model(src, tgt)
    attention_calls = TINY.encoder_layers + 2 * TINY.decoder_layers
    assert recorder.calls == (
        [([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], True)] * attention_calls)


def test_configured_backends_keep_the_training_forward_one_graph():
    """The ``sdpa_kernel`` context inside every attention traces into the compiled graph,
    with the batch and length dimensions dynamic as the training step marks them."""
    from transformer_nmt.train.step import mark_dynamic_batch

    model = Transformer(TINY, vocab_size=V).train()
    model.set_sdpa_backends(["flash", "efficient", "math"])
    src, tgt = _padded_batch([(7, 5), (3, 6), (5, 2)])
    keep = tgt.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)
    mark_dynamic_batch(src, tgt, keep)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(src, tgt, keep)
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_decoding_runs_under_decode_sdpa_backends(monkeypatch):
    """``search`` (nmt-translate, nmt-evaluate) enters ``decode.sdpa_backends`` around the
    search; a model that carries its own list (a training run's validation) keeps it."""
    from transformer_nmt.decode import translate as translate_mod

    recorder = _Recorder()
    monkeypatch.setattr(transformer_mod, "sdpa_kernel", recorder)
    model = Transformer(TINY, vocab_size=V).eval()
    src, _ = _padded_batch([(7, 5), (3, 6)])
    cfg = DecodeConfig(beam_size=2, max_len_b=3, sdpa_backends=["math"])
    translate_mod.search(model, src, cfg)
    assert recorder.calls[0] == ([SDPBackend.MATH], True)
    assert len(recorder.calls) == 1  # the model itself enters none


def test_unknown_backend_is_refused_with_the_allowed_names():
    model = Transformer(TINY, vocab_size=V)
    with pytest.raises(UserError, match=r"unknown fast.*flash, efficient, cudnn, math"):
        model.set_sdpa_backends(["flash", "fast"])
    with pytest.raises(UserError, match="empty"):
        model.set_sdpa_backends([])


def test_reported_kernels_follow_the_backends():
    model = Transformer(TINY, vocab_size=V)
    model.set_sdpa_backends(["math"])
    assert model.sdpa_kernels(torch.device("cpu"), torch.float32) == {"masked": "math",
                                                                        "causal": "math"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_configured_kernels_give_the_math_backends_gradients_on_cuda(dtype):
    """Padded batches whose lengths are no multiple of 8 or 64: logits and every parameter's
    gradient of the default backends against the math backend (float64-free reference:
    the same model, same batch), and the kernels that ran are not cuDNN."""
    torch.manual_seed(0)
    cuda = torch.device("cuda", 0)
    model = Transformer(TINY, vocab_size=V).to(cuda).train()
    src, tgt = _padded_batch([(67, 13), (29, 71), (5, 3), (130, 33)], device="cuda")
    results = {}
    for names in (["flash", "efficient", "math"], ["math"]):
        model.set_sdpa_backends(names)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(src, tgt)
        keep = tgt.ne(PAD_ID)
        logits[keep].float().logsumexp(-1).sum().backward()
        results[names[0]] = (logits.float().detach(),
                             {n: p.grad.float().clone() for n, p in model.named_parameters()})
    model.set_sdpa_backends(["flash", "efficient", "math"])
    assert "cudnn" not in model.sdpa_kernels(cuda, dtype).values()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    fast, math = results["flash"], results["math"]
    torch.testing.assert_close(fast[0], math[0], **tol)
    for name in math[1]:
        torch.testing.assert_close(fast[1][name], math[1][name], **tol, msg=name)
        assert torch.isfinite(fast[1][name]).all(), name
