"""Packed batches in the model: attention by segment equals the padded forward of the same
sentences (logits, loss, gradients), and the dense and flex forms of the segment mask agree."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_nmt.config import PAD_ID, ModelConfig
from transformer_nmt.data.batching import collate
from transformer_nmt.data.packing import collate_packed
from transformer_nmt.model.transformer import Transformer, segment_attn_mask
from transformer_nmt.train.loss import label_smoothed_nll_loss

V = 23
TINY = ModelConfig(
    name="test", encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4,
    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_positions=64,
)
VARIANTS = {
    "post_sinusoidal": {},
    "pre_norm": {"norm": "pre"},
    "learned_positions": {"positions": "learned"},
}


def _samples(n: int = 9, seed: int = 0) -> list[tuple[int, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(i, rng.integers(4, V, int(rng.integers(1, 9))),
             rng.integers(4, V, int(rng.integers(1, 9)))) for i in range(n)]


def _loss_and_grads(model: Transformer, logits: torch.Tensor, target: torch.Tensor,
                    ignore: int | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore)
    model.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_packed_forward_equals_the_padded_forward_of_the_same_sentences(variant):
    """fp32, training mode without dropout: the logits of every real target token, the
    summed label-smoothed loss and every parameter's gradient agree to 1e-5; rows hold
    several pairs each, the last row ends in padding."""
    torch.manual_seed(0)
    model = Transformer(replace(TINY, **VARIANTS[variant]), vocab_size=V).train()
    samples = _samples()
    padded = collate(samples)
    packed = collate_packed(samples, rows=4, length=20)
    assert packed.src_tokens.shape == (4, 20)
    assert int(packed.src_segments.max()) >= 2  # several pairs share a row
    assert packed.ntokens == padded.ntokens

    keep = padded.tgt_out.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)
    ref = model(padded.src_tokens, padded.tgt_in, keep)  # (N, V)
    ref_loss, ref_grads = _loss_and_grads(model, ref, padded.tgt_out.reshape(-1)[keep], None)

    logits = model(packed.src_tokens, packed.tgt_in, None, packed.src_segments,
                   packed.src_positions, packed.tgt_segments, packed.tgt_positions)
    assert logits.shape == (4, 20, V)
    flat, target = logits.reshape(-1, V), packed.tgt_out.reshape(-1)
    real = target.ne(PAD_ID)  # real positions in row order = the sentences in sample order
    torch.testing.assert_close(flat[real], ref, rtol=1e-5, atol=1e-5)
    loss, grads = _loss_and_grads(model, flat, target, PAD_ID)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_segment_mask_keeps_each_sentence_to_itself():
    """Encoder: own segment; decoder: own segment and causal; cross: target segment k sees
    source segment k; padding queries see every key, real queries never see padding."""
    src = torch.tensor([[1, 1, 2, 2, 2, 0]])
    tgt = torch.tensor([[1, 1, 1, 2, 0, 0]])
    enc = segment_attn_mask(src, src, False)[0, 0]
    assert enc.shape == (6, 6)
    assert enc[0].tolist() == [True, True, False, False, False, False]
    assert enc[3].tolist() == [False, False, True, True, True, False]
    assert enc[5].all()
    dec = segment_attn_mask(tgt, tgt, True)[0, 0]
    assert dec[1].tolist() == [True, True, False, False, False, False]
    assert dec[3].tolist() == [False, False, False, True, False, False]
    cross = segment_attn_mask(tgt, src, False)[0, 0]
    assert cross[0].tolist() == [True, True, False, False, False, False]
    assert cross[3].tolist() == [False, False, True, True, True, False]
    assert cross[4].all()


def _document_batch(b: int = 2, heads: int = 2, length: int = 48, d: int = 8):
    g = torch.Generator().manual_seed(1)
    seg = torch.zeros(b, length, dtype=torch.int32)
    for row in range(b):
        start, k = 0, 1
        while start < length - 6:
            n = int(torch.randint(2, 12, (1,), generator=g))
            seg[row, start:start + n] = k
            start, k = start + n, k + 1
    q, k, v = (torch.randn(b, heads, length, d, generator=g) for _ in range(3))
    return seg, q, k, v


def test_compiled_flex_attention_with_a_document_mask_equals_masked_sdpa():
    """On this CPU: flex attention, compiled, with the causal document block mask of
    :func:`segment_attn_mask` gives the output of SDPA with its dense mask to 1e-6 (forward
    only: torch 2.13 has no flex backward on a CPU, so CPU training uses the dense mask; one
    compilation, about 25 s on two CPU cores)."""
    from torch.nn.attention.flex_attention import flex_attention

    causal = True
    seg, q, k, v = _document_batch()
    block = segment_attn_mask(seg, seg, causal, "flex")
    dense = segment_attn_mask(seg, seg, causal, "dense")
    compiled = torch.compile(flex_attention, dynamic=False)
    out = compiled(q, k, v, block_mask=block)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                               rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_packed_forward_equals_the_dense_one_uncompiled():
    """The model's flex path (block masks for the three attentions, eager flex attention)
    gives the dense path's logits: the same rule reaches both kernels."""
    torch.manual_seed(0)
    model = Transformer(TINY, vocab_size=V).eval()
    packed = collate_packed(_samples(), rows=4, length=20)
    args = (packed.src_tokens, packed.tgt_in, None, packed.src_segments, packed.src_positions,
            packed.tgt_segments, packed.tgt_positions)
    with torch.no_grad():
        dense = model(*args)
        model.set_packed_attention("flex")
        flex = model(*args)
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attention dropout"):
        Transformer(replace(TINY, attention_dropout=0.1), vocab_size=V).set_packed_attention(
            "flex")

