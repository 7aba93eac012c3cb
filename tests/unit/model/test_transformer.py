"""The Transformer: cached decoding, masks, positions, weight tying, sizes, and learning."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from transformer_nmt.config import BOS_ID, CONFIG_DIR, PAD_ID, ModelConfig
from transformer_nmt.model.cache import DecoderCache
from transformer_nmt.model.transformer import (
    MultiHeadAttention,
    Transformer,
    causal_attn_mask,
    key_padding_attn_mask,
    sinusoidal_table,
)

V = 23  # tiny vocabulary: ids 4..22 are ordinary tokens
TINY = ModelConfig(
    name="test", encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4,
    dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, max_positions=64,
)
VARIANTS = {
    "post_sinusoidal": {},
    "pre_norm": {"norm": "pre"},
    "learned_positions": {"positions": "learned"},
    "dk_ne_dv": {"d_k": 6, "d_v": 10},
    "untied": {"share_embeddings": "none"},
}


def make_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(replace(TINY, **overrides), vocab_size=V).eval()


def random_batch(lengths: list[int], seed: int, first: int = 4) -> torch.Tensor:
    """(B, max(lengths)) right-padded random token ids."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(first, V, (n,), generator=g)
    return out


def preset(name: str) -> ModelConfig:
    yaml = OmegaConf.load(f"{CONFIG_DIR}/model/{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


# ---- incremental decoding ---------------------------------------------------------------


CACHE_LAYOUTS = {"contiguous": True, "buffers": False}
"""DecoderCache.contiguous: the CPU's layout and the one other devices use."""


def new_cache(model, layout: str = "contiguous") -> DecoderCache:
    cache = model.new_cache()
    cache.contiguous = CACHE_LAYOUTS[layout]
    return cache


@pytest.mark.parametrize("layout", sorted(CACHE_LAYOUTS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decoding_equals_full_forward(variant, layout):
    model = make_model(**VARIANTS[variant])
    src = random_batch([7, 4, 5], seed=1)  # source padding in rows 1 and 2
    tgt = random_batch([6, 6, 6], seed=2)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        memory, src_mask = model.encode(src)
        cache = new_cache(model, layout)
        steps = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache) for i in range(6)]
        # several new positions in one cached call (offset causal mask), then single steps
        cache2 = new_cache(model, layout)
        chunks = [model.decode(tgt[:, :3], memory, src_mask, cache2)]
        chunks += [model.decode(tgt[:, 3:5], memory, src_mask, cache2)]
        chunks += [model.decode(tgt[:, 5:6], memory, src_mask, cache2)]
    assert cache.length == 6 and cache2.length == 6
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", sorted(CACHE_LAYOUTS))
@pytest.mark.parametrize("variant", ["post_sinusoidal", "pre_norm", "learned_positions"])
def test_cache_reorder_matches_reordered_forward(variant, layout):
    model = make_model(**VARIANTS[variant])
    src = random_batch([5, 8, 3, 6], seed=3)
    tgt = random_batch([7, 7, 7, 7], seed=4)
    order = torch.tensor([2, 0, 0, 3])  # permute, repeat row 0, drop row 1
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = new_cache(model, layout)
        for i in range(3):
            model.decode(tgt[:, i : i + 1], memory, src_mask, cache)
        cache.reorder(order, sources=order)
        after = [model.decode(tgt[order, i : i + 1], memory, src_mask, cache) for i in range(3, 7)]
        full = model(src[order], tgt[order])
    torch.testing.assert_close(torch.cat(after, 1), full[:, 3:], atol=1e-5, rtol=0)


def test_cache_layouts_hold_the_same_keys_and_values():
    """Both self-attention layouts return the same K/V, bit for bit, through growth, reorders
    that shrink, repeat and grow the rows, and a switch of layout midway; the CPU layout's are
    contiguous (what its attention matmuls read fastest)."""
    g = torch.Generator().manual_seed(7)
    caches = {name: DecoderCache(2, contiguous=flag) for name, flag in CACHE_LAYOUTS.items()}
    rows = 4
    orders = {3: torch.tensor([1, 1, 3]), 9: torch.tensor([2, 0, 1, 2, 0]), 20: None}
    for step in range(40):
        if step == 25:
            caches["contiguous"].contiguous, caches["buffers"].contiguous = False, True
        order = orders.get(step)
        if order is not None:
            rows = order.numel()
        k, v = torch.randn(rows, 2, 1, 3, generator=g), torch.randn(rows, 2, 1, 5, generator=g)
        got = {}
        for name, cache in caches.items():
            if order is not None:
                cache.reorder(order)
            got[name] = [cache.append_self(layer, k + layer, v - layer) for layer in (0, 1)]
            cache.length += 1
            if cache.contiguous:
                assert all(x.is_contiguous() for pair in got[name] for x in pair)
        for (ka, va), (kb, vb) in zip(got["contiguous"], got["buffers"]):
            assert ka.shape == (rows, 2, step + 1, 3) and vb.shape == (rows, 2, step + 1, 5)
            assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_cached_cross_attention_layout_follows_the_step_that_reads_it(monkeypatch):
    """The CPU step's matmuls get K^T and V contiguous (no copy per step); the SDPA step of
    other devices keeps K's last dimension contiguous, as its fused kernels need."""
    model = make_model()
    src = random_batch([5, 3], seed=5)
    tgt = random_batch([1, 1], seed=6)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        model.decode(tgt, memory, src_mask, cache)
        assert all(k.transpose(-2, -1).is_contiguous() for k in cache.cross_k)
        assert all(v.is_contiguous() for v in cache.cross_v)
        monkeypatch.setattr(MultiHeadAttention, "_cpu_step", lambda self, x: False)
        cache = model.new_cache()
        model.decode(tgt, memory, src_mask, cache)
        assert all(k.stride(-1) == 1 and not k.transpose(-2, -1).is_contiguous()
                   for k in cache.cross_k)


@pytest.mark.parametrize("path", ["matmul", "sdpa"])
@pytest.mark.parametrize("variant", ["post_sinusoidal", "pre_norm", "dk_ne_dv"])
def test_beams_share_cross_attention_rows(variant, path):
    """Two target rows per source row (beam search's layout) equal the full forward pass on
    the repeated source: from the first call, after a reorder within sentences, and after
    a sentence leaves. ``sdpa``: training mode with dropout 0 takes the SDPA branch that
    GPUs use instead of the CPU inference matmuls."""
    model = make_model(**VARIANTS[variant])
    if path == "sdpa":
        no_dropout = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
        model = make_model(**VARIANTS[variant], **no_dropout).train()
    src = random_batch([5, 3], seed=20)
    src2 = src.repeat_interleave(2, 0)  # two beams per sentence: rows 0, 1 | 2, 3
    tgt = random_batch([6, 6, 6, 6], seed=21)
    with torch.no_grad():
        memory, src_mask = model.encode(src)  # (2, S, D): one row per sentence
        cache = model.new_cache()
        first = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache) for i in (0, 1)]
        assert cache.sources == 2 and cache.cross_k[0].size(0) == 2
        torch.testing.assert_close(torch.cat(first, 1), model(src2, tgt)[:, :2], atol=1e-5, rtol=0)

        swap = torch.tensor([1, 1, 3, 2])  # every row stays within its sentence
        cache.reorder(swap)
        after = [model.decode(tgt[swap, i : i + 1], memory, src_mask, cache) for i in (2, 3)]
        full = model(src2[swap], tgt[swap])
        torch.testing.assert_close(torch.cat(after, 1), full[:, 2:4], atol=1e-5, rtol=0)

        cache.reorder(torch.tensor([2, 3]), sources=torch.tensor([1]))  # sentence 0 leaves
        order = swap[2:]
        last = [model.decode(tgt[order, i : i + 1], memory, src_mask, cache) for i in (4, 5)]
        full = model(src2[order], tgt[order])
        torch.testing.assert_close(torch.cat(last, 1), full[:, 4:], atol=1e-5, rtol=0)
        assert cache.sources == 1

        with pytest.raises(ValueError, match="multiple"):
            cache.reorder(torch.tensor([0, 1, 0]), sources=torch.tensor([0, 0]))
        with pytest.raises(ValueError, match="holds 2 target rows"):
            model.decode(tgt[:3, :1], memory, src_mask, cache)
        with pytest.raises(ValueError, match="cannot share"):
            model.decode(tgt[:3, :1], memory, src_mask, model.new_cache())  # 3 rows, 2 sources
        with pytest.raises(ValueError, match="cannot share"):
            model.decode(tgt[:, :1], memory, src_mask)  # no cache: one source row per row


def test_cross_attention_kv_computed_once():
    model = make_model()
    src = random_batch([5, 3], seed=5)
    calls = []
    hook = model.decoder_layers[0].cross_attn.kv_proj.register_forward_hook(
        lambda *args: calls.append(1)
    )
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        tok = torch.full((2, 1), BOS_ID)
        for _ in range(4):
            model.decode(tok, memory, src_mask, cache)
    hook.remove()
    assert len(calls) == 1


# ---- masks ------------------------------------------------------------------------------


def test_source_padding_changes_no_real_output():
    model = make_model()
    lengths = [6, 2, 4]
    src = random_batch(lengths, seed=6)
    tgt = random_batch([5, 3, 4], seed=7)
    extra = torch.cat([src, torch.full((3, 4), PAD_ID)], 1)  # four more pad columns
    with torch.no_grad():
        batched = model(src, tgt)
        padded_more = model(extra, tgt)
        memory, src_mask = model.encode(extra)
        for i, n in enumerate(lengths):
            alone = model(src[i : i + 1, :n], tgt[i : i + 1])
            torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=0)
            mem_alone, _ = model.encode(src[i : i + 1, :n])
            torch.testing.assert_close(memory[i : i + 1, :n], mem_alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded_more, batched, atol=1e-5, rtol=0)
    assert src_mask.sum(1).tolist() == lengths


def test_target_padding_changes_no_real_output():
    model = make_model()
    src = random_batch([5, 5], seed=8)
    tgt = random_batch([6, 3], seed=9)
    with torch.no_grad():
        batched = model(src, tgt)
        short = model(src[1:], tgt[1:, :3])
        more_pad = model(src, torch.cat([tgt, torch.full((2, 5), PAD_ID)], 1))
    torch.testing.assert_close(batched[1:, :3], short, atol=1e-5, rtol=0)
    torch.testing.assert_close(more_pad[:, :6], batched, atol=1e-5, rtol=0)


def test_output_mask_selects_the_same_logits():
    # Training projects only the real target positions; they must equal the full logits.
    model = make_model()
    src = random_batch([5, 3, 4], seed=10)
    tgt = random_batch([6, 2, 4], seed=11)
    keep = tgt.ne(PAD_ID)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        selected = model(src, tgt, keep)  # (N, V)
    assert selected.shape == (int(keep.sum()), model.vocab_size)
    torch.testing.assert_close(selected, full[keep], atol=1e-5, rtol=0)


def test_causal_mask_future_token_changes_no_earlier_logit():
    model = make_model()
    src = random_batch([6, 4], seed=10)
    tgt = random_batch([8, 8], seed=11)
    with torch.no_grad():
        base = model(src, tgt)
        for j in (1, 4, 7):
            changed = tgt.clone()
            changed[:, j] = 4 + (changed[:, j] - 4 + 1) % (V - 4)  # another ordinary token
            out = model(src, changed)
            torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-6, rtol=0)
            assert (out[:, j] - base[:, j]).abs().max() > 1e-3


def test_mask_helpers_polarity():
    real = torch.tensor([[True, True, False], [True, True, True]])
    mask = key_padding_attn_mask(real)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.bool
    assert mask[0, 0, 0].tolist() == [True, True, False]
    assert key_padding_attn_mask(torch.ones(2, 3, dtype=torch.bool)) is None
    causal = causal_attn_mask(2, 3, torch.device("cpu"))
    assert causal.tolist() == [[True] * 4 + [False], [True] * 5]


# ---- attention and positions ------------------------------------------------------------


def test_fused_attention_equals_per_head_formula():
    torch.manual_seed(12)
    d_model, heads, d_k, d_v = 16, 2, 3, 5
    for self_attention in (True, False):
        mha = MultiHeadAttention(d_model, heads, d_k, d_v, 0.0, self_attention).eval()
        mha.reset_parameters()
        x, mem = torch.randn(2, 4, d_model), torch.randn(2, 6, d_model)
        src = x if self_attention else mem
        if self_attention:
            wq, wk, wv = mha.in_proj.weight.split([heads * d_k, heads * d_k, heads * d_v])
        else:
            wq = mha.q_proj.weight
            wk, wv = mha.kv_proj.weight.split([heads * d_k, heads * d_v])
        torch.nn.init.normal_(mha.out_proj.bias)  # biases start at zero; make them count
        heads_out = []
        for h in range(heads):
            q = x @ wq[h * d_k : (h + 1) * d_k].T
            k = src @ wk[h * d_k : (h + 1) * d_k].T
            v = src @ wv[h * d_v : (h + 1) * d_v].T
            heads_out.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d_k), -1) @ v)
        expected = torch.cat(heads_out, -1) @ mha.out_proj.weight.T + mha.out_proj.bias
        with torch.no_grad():
            got = mha(x) if self_attention else mha(x, mem)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("masked", ["padding", "causal", "none"])
def test_attention_weights_times_v_equal_the_sdpa_path(masked):
    """attention_weights (the paper's softmax, written out) @ V == the SDPA path's output."""
    torch.manual_seed(13)
    d_model, heads, d_k, d_v = 16, 2, 3, 5
    x, mem = torch.randn(2, 4, d_model), torch.randn(2, 6, d_model)
    for self_attention in (True, False):
        mha = MultiHeadAttention(d_model, heads, d_k, d_v, 0.0, self_attention).eval()
        mha.reset_parameters()
        src = x if self_attention else mem
        n_keys = src.size(1)
        is_causal = masked == "causal" and self_attention
        mask = None
        if masked == "padding":
            real = torch.ones(2, n_keys, dtype=torch.bool)
            real[1, n_keys - 2 :] = False  # the second row's last two keys are padding
            mask = key_padding_attn_mask(real)
        memory = None if self_attention else mem
        with torch.no_grad():
            probs = mha.attention_weights(x, memory, attn_mask=mask, is_causal=is_causal)
            assert probs.shape == (2, heads, 4, n_keys)
            torch.testing.assert_close(probs.sum(-1), torch.ones(2, heads, 4))
            if masked == "padding":
                assert probs[1, :, :, n_keys - 2 :].eq(0).all()
            if is_causal:
                assert probs[..., 0, 1:].eq(0).all() and probs[..., 2, 3:].eq(0).all()
            if self_attention:
                v = mha._self_projections(x)[2]  # (B, H, S, Dv)
            else:
                v = mha._memory_projections(mem)[1]
            got = mha.out_proj(mha._merge_heads(probs @ v))  # (B, T, D)
            expected = mha(x, memory, attn_mask=mask, is_causal=is_causal)  # t = 4: SDPA path
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_positional_encoding_formula_and_relative_property():
    d = 16
    table = sinusoidal_table(100, d).double()
    for pos in (0, 1, 7, 63, 99):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    dots = table @ table.T  # (P, P)
    for delta in (0, 1, 5, 30):
        diag = torch.diagonal(dots, offset=delta)
        assert (diag - diag[0]).abs().max() < 1e-5
    assert not torch.allclose(torch.diagonal(dots, 1)[:1], torch.diagonal(dots, 5)[:1])


def test_positions_used_and_limits():
    model = make_model()
    assert not any("positions" in k for k in model.state_dict())  # a buffer, not saved
    src = random_batch([70], seed=13)  # beyond max_positions=64: the sinusoid table grows
    with torch.no_grad():
        assert model(src, src[:, :3]).shape == (1, 3, V)
    learned = make_model(positions="learned")
    with pytest.raises(ValueError, match="max_positions=64"):
        learned(src, src[:, :3])


# ---- weight tying, initialisation -------------------------------------------------------


@pytest.mark.parametrize("share", ["all", "decoder", "none"])
def test_weight_tying_storage(share):
    model = make_model(share_embeddings=share)
    src, tgt, out = (m.weight.data_ptr() for m in (
        model.embed_tokens, model.tgt_embed_tokens, model.output_projection
    ))
    assert (src == tgt) == (share == "all")
    assert (tgt == out) == (share != "none")
    distinct = {"all": 1, "decoder": 2, "none": 3}[share]
    untied = make_model(share_embeddings="none").num_parameters()
    assert model.num_parameters() == untied - (3 - distinct) * V * TINY.d_model


def test_tied_weight_gets_gradient_from_each_use(monkeypatch):
    model = make_model()
    model.train()
    weight = model.embed_tokens.weight
    src = random_batch([6, 4], seed=14)
    tgt = random_batch([5, 5], seed=15)
    gold = random_batch([5, 5], seed=16)
    original_embed = model._embed

    def grad_through(use: str) -> torch.Tensor:
        """Gradient of the loss on the shared matrix through ``use`` alone (others detached)."""
        def embed(tokens, table, positions, offset):
            side = "source" if tokens is src else "target"
            if side != use:
                table = lambda ids: F.embedding(ids, weight.detach(), PAD_ID)  # noqa: E731
            return original_embed(tokens, table, positions, offset)

        def project(x):
            return F.linear(x, weight if use == "output" else weight.detach())

        with monkeypatch.context() as m:
            if use != "all":
                m.setattr(model, "_embed", embed)
                m.setattr(model.output_projection, "forward", project)
            torch.manual_seed(0)  # identical dropout masks in every pass
            model.zero_grad()
            loss = F.cross_entropy(model(src, tgt).reshape(-1, V), gold.reshape(-1))
            loss.backward()
        return weight.grad.clone()

    total = grad_through("all")
    parts = {use: grad_through(use) for use in ("source", "target", "output")}
    for use, g in parts.items():
        assert g.abs().sum() > 0, f"no gradient through the {use} use"
    torch.testing.assert_close(sum(parts.values()), total, atol=1e-6, rtol=1e-5)
    assert parts["source"][PAD_ID].abs().sum() == 0  # padding row receives nothing from lookups


def test_initialisation():
    torch.manual_seed(17)
    model = Transformer(replace(TINY, d_model=64, share_embeddings="none"), vocab_size=500)
    for emb in (model.embed_tokens, model.tgt_embed_tokens):
        assert emb.weight[PAD_ID].abs().sum() == 0
        assert emb.weight[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
    w = model.encoder_layers[0].self_attn.in_proj.weight[:64]  # W^Q as its own (D, H*Dk) matrix
    assert w.abs().max().item() <= math.sqrt(6 / (64 + 64)) + 1e-6
    assert w.std().item() == pytest.approx(math.sqrt(2 / (64 + 64)), rel=0.1)
    biases = [p for n, p in model.named_parameters() if n.endswith("proj.bias") or ".w_" in n
              and n.endswith("bias")]
    assert biases and all(b.abs().sum() == 0 for b in biases)


def test_initialisation_fairseq():
    """init=fairseq: W^Q/W^K/W^V Xavier with gain 1/sqrt(2), qkv and feed-forward as nn.Linear's
    default."""
    torch.manual_seed(17)
    d, f = 64, 256
    model = Transformer(replace(TINY, d_model=d, d_ff=f, init="fairseq"), vocab_size=500)
    attn = model.encoder_layers[0].self_attn
    xavier_bound, xavier_std = math.sqrt(6 / (d + d)), math.sqrt(2 / (d + d))
    for block in attn.in_proj.weight.split(d, dim=0):  # W^Q, W^K, W^V
        assert block.abs().max().item() <= xavier_bound / math.sqrt(2) + 1e-6
        assert block.std().item() == pytest.approx(xavier_std / math.sqrt(2), rel=0.1)
    bias = attn.in_proj.bias
    assert bias.abs().max().item() <= d**-0.5 and bias.std().item() == pytest.approx(
        d**-0.5 / math.sqrt(3), rel=0.15)
    assert attn.out_proj.bias.abs().sum() == 0
    assert attn.out_proj.weight.std().item() == pytest.approx(xavier_std, rel=0.1)
    ffn = model.encoder_layers[0].ffn
    for linear, fan_in in ((ffn.w_1, d), (ffn.w_2, f)):
        assert linear.weight.abs().max().item() <= fan_in**-0.5
        assert linear.weight.std().item() == pytest.approx(fan_in**-0.5 / math.sqrt(3), rel=0.1)
        assert linear.bias.abs().sum() > 0
    cross = model.decoder_layers[0].cross_attn
    for block in (cross.q_proj.weight, *cross.kv_proj.weight.split(d, dim=0)):
        assert block.std().item() == pytest.approx(xavier_std / math.sqrt(2), rel=0.1)


# ---- sizes and validation ---------------------------------------------------------------


@pytest.mark.parametrize("name, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_count_near_paper(name, paper_millions):
    cfg = preset(name)
    with torch.device("meta"):
        model = Transformer(cfg, vocab_size=37000)
    n = model.num_parameters()
    d, f, layers_e, layers_d = cfg.d_model, cfg.d_ff, cfg.encoder_layers, cfg.decoder_layers
    attn, ffn, norm = 4 * d * d + 4 * d, 2 * d * f + f + d, 2 * d
    assert n == (37000 * d + layers_e * (attn + ffn + 2 * norm)
                 + layers_d * (2 * attn + ffn + 3 * norm))
    assert abs(n / (paper_millions * 1e6) - 1) < 0.05, f"{name}: {n:,} parameters"


@pytest.mark.parametrize(
    "overrides, paper_millions",
    [({"d_k": 16}, 58), ({"d_k": 32}, 60), ({"encoder_layers": 4, "decoder_layers": 4}, 50),
     ({"encoder_layers": 8, "decoder_layers": 8}, 80), ({"d_model": 256, "d_k": 32, "d_v": 32}, 28),
     ({"d_model": 1024, "d_k": 128, "d_v": 128}, 168), ({"d_ff": 1024}, 53), ({"d_ff": 4096}, 90)],
)
def test_table3_variants_are_config_overrides(overrides, paper_millions):
    with torch.device("meta"):
        model = Transformer(replace(preset("base"), **overrides), vocab_size=37000)
    # The paper's counts sit about 2M above ours at d_model 512 (see docs/model.md).
    assert abs(model.num_parameters() / (paper_millions * 1e6) - 1) < 0.06


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"d_model": 30, "heads": 4}, ["model.d_model=30", "model.heads=4"]),
        ({"heads": 0}, ["model.heads=0"]),
        ({"d_ff": -1}, ["model.d_ff=-1"]),
        ({"dropout": 1.0}, ["model.dropout=1.0"]),
        ({"attention_dropout": -0.1}, ["model.attention_dropout=-0.1"]),
        ({"d_k": 0}, ["model.d_k=0"]),
        ({"norm": "middle"}, ["model.norm='middle'", "post"]),
        ({"positions": "rope", "encoder_layers": 0},
         ["model.positions='rope'", "encoder_layers=0"]),
    ],
)
def test_config_validation_names_key_and_value(overrides, expected):
    with pytest.raises(ValueError) as err:
        Transformer(replace(TINY, **overrides), vocab_size=V)
    for text in expected:
        assert text in str(err.value)


def test_explicit_head_sizes_allow_indivisible_d_model():
    model = make_model(d_model=30, heads=4, d_k=8, d_v=5)
    with torch.no_grad():
        assert model(random_batch([3], 18), random_batch([2], 19)).shape == (1, 2, V)


def test_parameter_count_logged(caplog):
    with caplog.at_level("INFO", logger="transformer_nmt.model.transformer"):
        model = make_model()
    assert f"{model.num_parameters():,} parameters" in caplog.text


# ---- learning ---------------------------------------------------------------------------


def test_tiny_model_learns_reversal():
    """Reverse sequences of 1-8 tokens over a 20-token vocabulary: loss < 0.25 in 300 steps.

    Adam at a constant 3e-3, batches of 64 (about 20 s on one CPU core); the loss is near 0.1
    at step 300 for several seeds.
    """
    torch.manual_seed(0)
    vocab = 20
    cfg = replace(TINY, d_model=64, d_ff=128, heads=4, dropout=0.0, attention_dropout=0.0,
                  activation_dropout=0.0)
    model = Transformer(cfg, vocab_size=vocab)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    eos = 3

    def batch(n: int):
        lengths = torch.randint(1, 9, (n,))
        src = torch.full((n, 9), PAD_ID)
        tgt_in = torch.full((n, 9), PAD_ID)
        tgt_out = torch.full((n, 9), PAD_ID)
        for i, k in enumerate(lengths.tolist()):
            seq = torch.randint(4, vocab, (k,))
            src[i, :k], src[i, k] = seq, eos
            tgt_in[i, 0], tgt_in[i, 1 : k + 1] = BOS_ID, seq.flip(0)
            tgt_out[i, :k], tgt_out[i, k] = seq.flip(0), eos
        return src, tgt_in, tgt_out

    losses = []
    for _ in range(300):
        src, tgt_in, tgt_out = batch(64)
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, vocab), tgt_out.reshape(-1),
                               ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.25, losses[::25]

    # greedy decoding through the cache reproduces the reversed source
    model.eval()
    src, _, tgt_out = batch(32)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        token = torch.full((32, 1), BOS_ID)
        outputs = []
        for _ in range(9):
            token = model.decode(token, memory, src_mask, cache)[:, -1].argmax(-1, keepdim=True)
            outputs.append(token)
    hyp = torch.cat(outputs, 1)
    real = tgt_out != PAD_ID
    assert (hyp[real] == tgt_out[real]).float().mean() > 0.9
