"""decode.weight_prepack (transformer_nmt.decode.prepack): fp32 linear layers with their weights
packed once by oneDNN for decoding on a CPU: the same products to float32 rounding, each row
independent of its batch, the same translations as the plain model, and packed only where
decoding_model should pack."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import new_model, run_with_averaged_model, sentences
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_nmt.config import EOS_ID, DecodeConfig
from transformer_nmt.decode import prepack
from transformer_nmt.decode.beam_search import beam_search
from transformer_nmt.decode.prepack import PackedLinear, is_prepacked, prepack_linears
from transformer_nmt.decode.quantize import decoding_model
from transformer_nmt.decode.translate import translate
from transformer_nmt.evaluate.evaluate import evaluate

needs_onednn = pytest.mark.skipif(not prepack.prepack_supported(),
                                  reason="this PyTorch build packs no weights with oneDNN")


def _linear(k: int, n: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias).eval()


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_packed_linear_equals_linear_for_every_input_layout(bias, relu):
    lin = _linear(48, 80, bias, 0)
    packed = PackedLinear(lin, relu=relu)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 48, generator=g)
    inputs = [x, x[0], x[:, 2:5], x.transpose(0, 1), x[:, :1], x[:0]]  # 3-D, 2-D, strided, empty
    with torch.no_grad():
        for z in inputs:
            want = F.linear(z, lin.weight, lin.bias)
            if relu:
                want = want.relu()
            got = packed(z)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "relu=" + str(relu) in repr(packed)


@needs_onednn
def test_packed_rows_do_not_depend_on_their_batch():
    """A row's product is bit for bit the same whether its batch holds 1 row or 300 (the plain
    MKL product picks other kernels for a few rows)."""
    lin = _linear(64, 96, True, 2)
    packed = PackedLinear(lin)
    x = torch.randn(300, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = packed(x)
        for rows in (1, 2, 3, 7, 12, 100):
            assert torch.equal(packed(x[:rows]), full[:rows]), rows


def test_packed_row_counts_are_few_and_pad_at_most_an_eighth():
    sizes = {prepack.packed_rows(m) for m in range(1, 4097)}
    assert len(sizes) == 80 and max(sizes) == 4096
    for m in range(1, 5000):
        padded = prepack.packed_rows(m)
        assert m <= padded <= m * 9 / 8 and prepack.packed_rows(padded) == padded
        assert padded == m or m > prepack.EXACT_ROWS


class _KernelRows(TorchDispatchMode):
    """The row counts the packed product is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_linear_pointwise":
            self.rows.add(args[0].size(0))
        return func(*args, **(kwargs or {}))


@needs_onednn
def test_the_packed_product_meets_few_row_counts_with_the_same_results():
    """Any row count is computed in a padded batch of packed_rows rows, whose extra rows change
    nothing: bit for bit the products of the exact batch."""
    lin = _linear(64, 200, True, 4)
    packed = PackedLinear(lin, relu=True)
    x = torch.randn(700, 64, generator=torch.Generator().manual_seed(5))
    seen = _KernelRows()
    with torch.no_grad():
        for m in range(1, 701, 3):
            with seen:
                got = packed(x[:m].view(m, 1, 64))  # (M, 1, K): a decoder step's rows
            exact = torch.ops.mkldnn._linear_pointwise(x[:m], packed.packed_weight, packed.bias,
                                                       "relu", [], "")
            assert got.shape == (m, 1, 200) and torch.equal(got.view(m, 200), exact), m
    assert seen.rows == {prepack.packed_rows(m) for m in range(1, 701, 3)}
    assert len(seen.rows) < 50  # of 234 row counts asked


def _cfg(**kw) -> DecodeConfig:
    return DecodeConfig(**kw)


@needs_onednn
def test_decoding_model_packs_every_linear_layer_for_fp32_on_a_cpu(workspace, tokenizer):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, 1)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    embed = model.tgt_embed_tokens.weight.detach().clone()
    packed = decoding_model(model, _cfg(), "cpu")
    assert packed is model and is_prepacked(model)
    assert all(isinstance(model.get_submodule(n), PackedLinear) for n in names)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    ffns = [m for m in model.modules() if hasattr(m, "relu_in_w_1")]
    assert len(ffns) == cfg.model.encoder_layers + cfg.model.decoder_layers
    assert all(m.relu_in_w_1 and m.w_1.relu and not m.w_2.relu for m in ffns)
    # the embedding table stays a float32 parameter (the lookups); the projection has its copy
    assert torch.equal(model.tgt_embed_tokens.weight, embed)
    assert isinstance(model.output_projection, PackedLinear)
    # nothing opaque in the state dict: the packed copies live outside it
    assert all(not t.is_mkldnn for t in model.state_dict().values())


@pytest.mark.parametrize("kw,device", [
    ({"weight_prepack": False}, "cpu"),
    ({"precision": "bf16"}, "cpu"),
    ({"compile": "true"}, "cpu"),
    ({"engine": "ctranslate2"}, "cpu"),
    ({}, "cuda"),  # a decision only: nothing runs on the device
])
def test_decoding_model_leaves_the_model_plain_elsewhere(workspace, tokenizer, kw, device):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, 1)
    assert decoding_model(model, _cfg(**kw), device) is model
    assert not is_prepacked(model)


def test_a_model_with_non_finite_weights_is_not_packed(workspace, tokenizer):
    """The search's error then names the parameters (non_finite_scores_named reads the state
    dict, which would not hold packed weights)."""
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, 1)
    with torch.no_grad():
        model.decoder_layers[0].ffn.w_2.weight[0, 0] = float("nan")
    decoding_model(model, _cfg(), "cpu")
    assert not is_prepacked(model)


def test_without_onednn_the_model_stays_plain(workspace, tokenizer, monkeypatch):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, 1)
    monkeypatch.setattr(prepack, "prepack_supported", lambda: False)
    assert prepack_linears(model) is model and not is_prepacked(model)


@needs_onednn
def test_packed_beam_search_gives_the_plain_models_translations(workspace, tokenizer):
    """The same tokens, scores within float32 rounding, for 16 sentences of several lengths;
    and a packed model's cached steps equal its full forward pass."""
    _, cfg = workspace
    plain = new_model(cfg, tokenizer.vocab_size, 2)
    packed = prepack_linears(copy.deepcopy(plain))
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, tokenizer.vocab_size, (16, 10), generator=g)
    src[:, -1] = EOS_ID
    src[8:, 6:] = 0
    src[8:, 5] = EOS_ID  # shorter, padded sources
    with torch.no_grad():
        want = [h[0] for h in beam_search(plain, src, beam_size=4, max_len_b=8)]
        got = [h[0] for h in beam_search(packed, src, beam_size=4, max_len_b=8)]
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(got, want))

    tgt = torch.tensor([[1] + h.tokens[:5] + [EOS_ID] * (5 - len(h.tokens[:5])) for h in got])
    with torch.no_grad():
        full = packed(src, tgt)  # (B, T, V)
        memory, src_mask = packed.encode(src)
        cache = packed.new_cache()
        steps = [packed.decode(tgt[:, i:i + 1], memory, src_mask, cache)[:, -1]
                 for i in range(tgt.size(1))]
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_nmt_evaluate_and_translate_decode_packed_and_record_it(workspace, tokenizer, tmp_path,
                                                                capsys):
    cfg = run_with_averaged_model(workspace[1], tmp_path / "runs" / "tiny",
                                  tokenizer.vocab_size, 3)
    evaluate(cfg)
    saved = json.loads((Path(cfg.run_dir) / "results.json").read_text())
    test = saved["test_sets"]["test_2016_flickr"]
    assert test["speed"]["weight_prepack"] is True and "weight_prepack" not in test["decode"]
    packed_hyps = Path(test["translations"]).read_text(encoding="utf-8").splitlines()

    src = tmp_path / "in.en"
    src.write_text("\n".join(sentences(12, 1)) + "\n", encoding="utf-8")
    for name, on in (("packed", True), ("plain", False)):
        cfg.decode.weight_prepack = on
        cfg.translate.input, cfg.translate.output = str(src), str(tmp_path / f"{name}.de")
        translate(cfg)
    plain = (tmp_path / "plain.de").read_text(encoding="utf-8").splitlines()
    packed = (tmp_path / "packed.de").read_text(encoding="utf-8").splitlines()
    assert plain == packed == packed_hyps
    capsys.readouterr()
