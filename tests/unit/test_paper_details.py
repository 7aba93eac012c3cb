"""The paper's details, each pinned by a small case computed by hand from its formula.

Every test here compares against numbers written out from "Attention Is All You Need"
(Vaswani et al., 2017) or GNMT (Wu et al., 2016), never against the implementation's own
output, so that changing one detail (the sqrt(d_model) embedding scale, the positional
base 10000, the post-norm order, a residual dropout, the label-smoothing mass, the
warm-up exponent, the GNMT length penalty) makes a test fail. Only public names are used:
Transformer / encode / decode / forward, sinusoidal_table, the layer classes found by
type through forward hooks, label_smoothed_nll_loss, inverse_sqrt_lr / build_scheduler,
length_penalty / beam_search.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from transformer_nmt.config import EOS_ID, PAD_ID, DecodeConfig, ModelConfig, TrainerConfig
from transformer_nmt.decode.beam_search import beam_search, length_penalty
from transformer_nmt.model.transformer import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    PositionwiseFeedForward,
    Transformer,
    sinusoidal_table,
)
from transformer_nmt.train.loss import label_smoothed_nll_loss
from transformer_nmt.train.optim import build_optimizer, build_scheduler, inverse_sqrt_lr

V = 19
CFG = ModelConfig(name="paper-details", encoder_layers=1, decoder_layers=1, d_model=16,
                  d_ff=32, heads=2, dropout=0.0, max_positions=64)
SRC = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, 11, EOS_ID, PAD_ID]])
TGT = torch.tensor([[2, 12, 13, 14], [2, 15, 16, PAD_ID]])


def model_with(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(replace(CFG, **overrides), vocab_size=V).eval()


def paper_pe(pos: int, d_model: int) -> list[float]:
    """Section 3.5 written out: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
    out = []
    for j in range(d_model):
        angle = pos / 10000 ** ((j - j % 2) / d_model)
        out.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
    return out


# ---------------------------------------------------------------- section 3.5: positions


def test_positional_encoding_values_by_hand():
    # d_model 4: channel pairs (0, 1) turn at 1 rad per position, (2, 3) at 1/10000^(2/4) = 0.01.
    table = sinusoidal_table(3, 4).double()
    expected = torch.tensor([
        [0.0, 1.0, 0.0, 1.0],
        [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
        [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
    ], dtype=torch.float64)
    torch.testing.assert_close(table, expected, atol=1e-6, rtol=0)
    # d_model 8: the third pair turns at 10000^(-4/8) = 0.01 rad, the last at 10000^(-6/8).
    row = sinusoidal_table(101, 8)[100].double()
    assert row[4].item() == pytest.approx(math.sin(1.0), abs=1e-6)
    assert row[6].item() == pytest.approx(math.sin(100 * 10000 ** -0.75), abs=1e-6)
    assert row[7].item() == pytest.approx(math.cos(100 * 10000 ** -0.75), abs=1e-6)


# ---------------------------------------------------------------- section 3.4: embeddings


def _first_layer_input(model: Transformer, layer: nn.Module, run) -> torch.Tensor:
    seen = []
    handle = layer.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return seen[0]


def test_embeddings_are_scaled_by_sqrt_d_model_and_added_to_positions():
    """Input of the first layer = Embedding(tokens) * sqrt(d_model) + PE (sections 3.4, 3.5)."""
    model = model_with()
    d = CFG.d_model
    emb = model.embed_tokens.weight.detach().double()
    pe = torch.tensor([paper_pe(p, d) for p in range(SRC.size(1))], dtype=torch.float64)
    x = _first_layer_input(model, model.encoder_layers[0], lambda: model.encode(SRC))
    expected = emb[SRC] * 4.0 + pe  # sqrt(16) = 4
    torch.testing.assert_close(x.double(), expected, atol=1e-5, rtol=1e-5)
    # The decoder side: target embedding (tied) scaled the same way, positions from 0.
    memory, src_mask = model.encode(SRC)
    y = _first_layer_input(model, model.decoder_layers[0],
                           lambda: model.decode(TGT, memory, src_mask))
    pe_t = torch.tensor([paper_pe(p, d) for p in range(TGT.size(1))], dtype=torch.float64)
    torch.testing.assert_close(y.double(), emb[TGT] * 4.0 + pe_t, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- section 3.1: post-norm order


def _trace_layer(layer: nn.Module) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], list]:
    """Record (kind, input, output) of every attention, feed-forward and LayerNorm call in
    ``layer``, in call order, plus the layer's own (input, output)."""
    calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    io: list = []
    handles = []
    for module in layer.modules():
        if isinstance(module, (MultiHeadAttention, PositionwiseFeedForward)):
            kind = "sublayer"
        elif isinstance(module, nn.LayerNorm):
            kind = "norm"
        else:
            continue
        handles.append(module.register_forward_hook(
            lambda mod, args, out, kind=kind: calls.append((kind, args[0].detach(), out.detach()))
        ))
    handles.append(layer.register_forward_hook(
        lambda mod, args, out: io.append((args[0].detach(), out.detach()))
    ))
    return calls, io, handles


def _check_post_norm(calls, layer_in, layer_out, sublayers: int, dropout: float = 0.0):
    """LayerNorm(x + Dropout(Sublayer(x))) for each sub-layer in turn (section 3.1, 5.4)."""
    assert [k for k, _, _ in calls] == ["sublayer", "norm"] * sublayers
    x = layer_in
    for i in range(sublayers):
        (_, s_in, s_out), (_, n_in, n_out) = calls[2 * i], calls[2 * i + 1]
        torch.testing.assert_close(s_in, x)  # the sub-layer reads the residual stream
        residual = n_in - x  # what was added to the stream: Dropout(Sublayer(x))
        if dropout == 0.0:
            torch.testing.assert_close(residual, s_out, atol=1e-5, rtol=1e-5)
        else:
            kept = (residual - s_out / (1 - dropout)).abs() <= 1e-4 * (1 + s_out.abs())
            dropped = residual.abs() <= 1e-5
            assert bool((kept | dropped).all()), "residual is not Dropout(Sublayer(x))"
            frac = dropped[s_out.abs() > 1e-3].float().mean().item()
            assert 0.25 < frac < 0.75, f"residual dropout p={dropout} zeroed {frac:.0%}"
        x = n_out
    torch.testing.assert_close(layer_out, x)  # the layer ends with the last LayerNorm


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_post_norm_order(side):
    model = model_with()
    layer = model.encoder_layers[0] if side == "encoder" else model.decoder_layers[0]
    assert isinstance(layer, EncoderLayer if side == "encoder" else DecoderLayer)
    calls, io, handles = _trace_layer(layer)
    try:
        with torch.no_grad():
            model(SRC, TGT)
    finally:
        for h in handles:
            h.remove()
    (layer_in, layer_out), = io
    _check_post_norm(calls, layer_in, layer_out, 2 if side == "encoder" else 3)
    # Each LayerNorm output has mean 0 and variance 1 per position (initial gain 1, bias 0).
    out = layer_out.double()
    torch.testing.assert_close(out.mean(-1), torch.zeros_like(out[..., 0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones_like(out[..., 0]),
                               atol=1e-3, rtol=0)


# ---------------------------------------------------------------- section 5.4: residual dropout


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_residual_dropout_on_every_sublayer_output(side):
    p = 0.5
    model = model_with(dropout=p).train()
    layer = model.encoder_layers[0] if side == "encoder" else model.decoder_layers[0]
    calls, io, handles = _trace_layer(layer)
    torch.manual_seed(3)
    try:
        with torch.no_grad():
            model(SRC, TGT)
    finally:
        for h in handles:
            h.remove()
    (layer_in, layer_out), = io
    _check_post_norm(calls, layer_in, layer_out, 2 if side == "encoder" else 3, dropout=p)


def test_dropout_on_embedding_plus_position_sums():
    p = 0.5
    model = model_with(dropout=p).train()
    d = CFG.d_model
    emb = model.embed_tokens.weight.detach().double()
    pe = torch.tensor([paper_pe(i, d) for i in range(SRC.size(1))], dtype=torch.float64)
    clean = emb[SRC] * math.sqrt(d) + pe
    torch.manual_seed(4)
    x = _first_layer_input(model, model.encoder_layers[0], lambda: model(SRC, TGT)).double()
    kept = (x - clean / (1 - p)).abs() <= 1e-4 * (1 + clean.abs())
    dropped = x.abs() <= 1e-6
    assert bool((kept | dropped).all())
    assert 0.25 < dropped.float().mean().item() < 0.75


# ---------------------------------------------------------------- section 5.4: label smoothing


def test_label_smoothing_mass_by_hand():
    """eps_ls = 0.1 spread over all V classes: q = 0.9 * onehot + 0.1 / V.

    p = (1/2, 1/4, 1/8, 1/8), target class 0, V = 4:
    loss = 0.9 * ln 2 + 0.025 * (ln 2 + 2 ln 2 + 3 ln 2 + 3 ln 2) = 1.125 ln 2; nll = ln 2;
    d loss / d logits = p - q = (0.5 - 0.925, 0.25 - 0.025, 0.125 - 0.025, 0.125 - 0.025).
    """
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log().requires_grad_(True)
    loss, nll = label_smoothed_nll_loss(logits, torch.tensor([0]), 0.1, ignore_index=None)
    assert loss.item() == pytest.approx(1.125 * math.log(2), rel=1e-6)
    assert nll.item() == pytest.approx(math.log(2), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.425, 0.225, 0.1, 0.1]]),
                               atol=1e-6, rtol=0)
    assert TrainerConfig().label_smoothing == 0.1  # the paper's eps_ls


# ---------------------------------------------------------------- section 5.3: learning rate


def test_warmup_schedule_by_hand():
    """lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5), d = 512, warmup = 4000."""
    peak = inverse_sqrt_lr(4000, 512, 4000)
    assert peak == pytest.approx(1 / math.sqrt(512 * 4000), rel=1e-12)  # 6.99e-4 (section 5.3)
    assert peak == pytest.approx(6.99e-4, abs=5e-7)
    # Linear warm-up: a quarter of the way up gives a quarter of the peak; step 1 gives 1/4000.
    assert inverse_sqrt_lr(1000, 512, 4000) == pytest.approx(peak / 4, rel=1e-12)
    assert inverse_sqrt_lr(1, 512, 4000) == pytest.approx(peak / 4000, rel=1e-12)
    # Inverse square root decay: 4x the steps, half the rate.
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(peak / 2, rel=1e-12)
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(3.4939e-4, rel=1e-4)
    # The scheduler drives the optimizer with exactly that rate from the first update on.
    model = nn.Linear(2, 2)
    trainer = replace(TrainerConfig(), warmup_steps=4)
    opt = build_optimizer(model, trainer)
    sched = build_scheduler(opt, 64, trainer)
    rates = []
    for _ in range(8):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # d = 64, warmup 4: step * 4^-1.5 / 8 = step / 64 up to step 4, then 1 / (8 sqrt(step)).
    expected = [1 / 64, 2 / 64, 3 / 64, 4 / 64, 1 / (8 * math.sqrt(5)), 1 / (8 * math.sqrt(6)),
                1 / (8 * math.sqrt(7)), 1 / (8 * math.sqrt(8))]
    assert rates == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------- section 6.1: length penalty


def test_gnmt_length_penalty_by_hand():
    """lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14), alpha = 0.6 in the paper."""
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    assert length_penalty(19, 0.5) == pytest.approx(2.0)
    assert length_penalty(5, 0.6) == pytest.approx((10 / 6) ** 0.6)  # 1.3587
    assert length_penalty(5, 0.6) == pytest.approx(1.35866, abs=1e-5)
    assert length_penalty(torch.tensor([7.0]), 1.0).item() == pytest.approx(2.0)
    decode = DecodeConfig()
    assert (decode.beam_size, decode.lenpen, decode.lenpen_form) == (4, 0.6, "gnmt")


def test_beam_search_ranks_by_gnmt_normalised_log_probability():
    model = model_with()
    hyps = beam_search(model, SRC, beam_size=3, nbest=3, lenpen=0.6, max_len_a=0, max_len_b=6)
    for sentence in hyps:
        for h in sentence:
            n = len(h.tokens) + 1  # |Y| counts the final eos
            assert h.score == pytest.approx(h.log_prob / ((5 + n) / 6) ** 0.6, rel=1e-5)
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
