"""decode.precision=int8 (transformer_nmt.decode.quantize): the linear layers quantized to int8
with one scale per output channel and one input scale per row, a sentence's translation
independent of its batch, its scores close to fp32's, nmt-translate and nmt-evaluate through it,
results.json and nmt-table labelling it, and its refusals."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from helpers import new_model, run_with_averaged_model, sentences
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_nmt.config import BOS_ID, EOS_ID, DecodeConfig
from transformer_nmt.decode import prepack, quantize
from transformer_nmt.decode.beam_search import beam_search
from transformer_nmt.decode.quantize import (
    Int8Linear,
    check_int8_device,
    decoding_model,
    is_quantized,
    quantize_int8,
)
from transformer_nmt.decode.translate import translate, translate_lines
from transformer_nmt.errors import UserError
from transformer_nmt.evaluate.evaluate import evaluate
from transformer_nmt.evaluate.report import build_report, load_results


def _int8_model(cfg, vocab_size: int, seed: int):
    """(the fp32 model, an int8 copy of it)."""
    model = new_model(cfg, vocab_size, seed)
    return model, quantize_int8(copy.deepcopy(model))


def _random_batch(vocab: int, rows: int, src_len: int, tgt_len: int, seed: int):
    """(src (rows, src_len) ending in eos, tgt_in (rows, tgt_len) starting with bos), random
    content tokens."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (rows, src_len), generator=g)
    src[:, -1] = EOS_ID
    tgt = torch.randint(4, vocab, (rows, tgt_len), generator=g)
    tgt[:, 0] = BOS_ID
    return src, tgt


def test_int8_quantizes_every_linear_layer_per_output_channel(workspace, tokenizer):
    _, cfg = workspace
    model, q = _int8_model(cfg, tokenizer.vocab_size, 1)
    float_linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    # encoder: W^Q|W^K|W^V, W^O, W_1, W_2; decoder: those and cross-attention's W^Q, W^K|W^V,
    # W^O; the pre-softmax map
    assert len(float_linears) == 4 + 7 + 1
    for name, float_linear in float_linears.items():
        layer = q.get_submodule(name)
        assert isinstance(layer, Int8Linear), name
        w = layer.weight()
        assert w.dtype == torch.qint8 and w.qscheme() == torch.per_channel_affine, name
        # one scale per output channel (row of W), each the row's largest |w| / 127.5 or so
        scales = w.q_per_channel_scales()
        assert scales.shape == (float_linear.out_features,), name
        assert torch.allclose(w.dequantize(), float_linear.weight, atol=float(scales.max()))
        if float_linear.bias is None:
            assert layer.bias is None, name
        else:
            assert torch.equal(layer.bias, float_linear.bias), name
    assert is_quantized(q) and not is_quantized(model)
    # embeddings, positions and LayerNorms stay float32; the tied embedding keeps its table
    assert q.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(q.embed_tokens.weight, model.embed_tokens.weight)
    assert not any(isinstance(m, nn.Linear) for m in q.modules())
    # decoding_model quantizes once: a quantized model is returned as it is
    assert decoding_model(q, DecodeConfig(precision="int8"), "cpu") is q
    assert decoding_model(model, DecodeConfig(precision="fp32"), "cpu") is model


def test_int8_first_feed_forward_layer_applies_the_relu(workspace, tokenizer):
    """W_1's int8 layer applies the ReLU (in place) and the feed-forward block skips its own:
    the same values as W_1 without it followed by the ReLU."""
    from transformer_nmt.model.transformer import PositionwiseFeedForward

    _, cfg = workspace
    _, q = _int8_model(cfg, tokenizer.vocab_size, 3)
    ffns = [m for m in q.modules() if isinstance(m, PositionwiseFeedForward)]
    assert len(ffns) == 2 and all(m.relu_in_w_1 and m.w_1.relu and not m.w_2.relu for m in ffns)
    w_1 = ffns[0].w_1
    plain = Int8Linear(w_1.weight(), w_1.bias, relu=False)
    x = torch.randn(3, 5, w_1.in_features, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w_1(x), torch.relu(plain(x)))


def _rows_of_many_magnitudes(k: int) -> torch.Tensor:
    """(7, k): rows of largest magnitude about 1e-3 .. 1e3, one row of zeros."""
    g = torch.Generator().manual_seed(4)
    magnitude = torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.5, 2.0, 0.0])
    return torch.randn(7, k, generator=g) * magnitude[:, None]


@pytest.mark.parametrize("engine,fixed_scale", [("x86", True), ("x86", False), ("qnnpack", False)])
def test_int8_layer_quantizes_each_row_with_its_own_scale(monkeypatch, engine, fixed_scale):
    """Each row's result depends on that row only (bit for bit the row alone) and is as close
    to the float product relative to the row's own size (about 1 %) for rows of 1e-3 and 1e3
    in one batch; a row of zeros gives the bias; a NaN row gives NaN and leaves the others.
    Both forms of the product: a fixed input scale (fbgemm) and the anchor rows (QNNPACK,
    oneDNN)."""
    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"no {engine} engine in this PyTorch build")
    monkeypatch.setattr(torch.backends.quantized, "engine", engine)
    if not fixed_scale:
        monkeypatch.setattr(quantize, "_fixed_scale_product", lambda packed, in_features: False)
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(64, 48)).eval()
    layer = quantize_int8(copy.deepcopy(dense))[0]
    assert isinstance(layer, Int8Linear) and layer.fixed_scale == fixed_scale
    x = _rows_of_many_magnitudes(64)
    with torch.no_grad():
        y, ref = layer(x), dense(x)
        assert torch.equal(y, torch.cat([layer(x[i:i + 1]) for i in range(len(x))]))
        assert torch.equal(layer(x.view(7, 1, 64)), y.view(7, 1, 48))  # any leading shape
        error = (y - ref).abs().amax(1) / x.abs().amax(1).clamp_min(1e-30)  # (7,)
        assert float(error[:-1].max()) < 0.03, error
        assert torch.equal(y[-1], dense[0].bias)
        bad = x.clone()
        bad[2, 5] = float("nan")
        y_bad = layer(bad)
        assert bool(y_bad[2].isnan().all()) and torch.equal(y_bad[[0, 1, 3, 4, 5, 6]],
                                                          y[[0, 1, 3, 4, 5, 6]])
        assert layer(x[:0]).shape == (0, 48)
        # one input feature: each row is -1 or 1 after its scale, both ends of the range
        narrow = nn.Sequential(nn.Linear(1, 3)).eval()
        x1 = torch.tensor([[-2.0], [0.5], [3.0]])
        narrow_int8 = quantize_int8(copy.deepcopy(narrow))[0]
        got = narrow_int8(x1)
        assert torch.allclose(got, narrow(x1), atol=0.03 * 3.0), (got, narrow(x1))
        assert torch.equal(got, torch.cat([narrow_int8(x1[i:i + 1]) for i in range(3)]))


def test_int8_translation_of_a_sentence_does_not_depend_on_its_batch(workspace, tokenizer):
    """Each sentence of a batch decoded alone gives the batch's tokens and score: the input
    scales are per row, so the batch-mates change no rounding (sources of one length, so that
    padding plays no part)."""
    _, cfg = workspace
    _, q = _int8_model(cfg, tokenizer.vocab_size, 2)
    src, _ = _random_batch(tokenizer.vocab_size, 12, 9, 1, seed=3)
    src[::3, :-1] = src[::3, :-1].flip(1)  # a spread of contents
    with torch.no_grad():
        batch = [h[0] for h in beam_search(q, src, beam_size=4, max_len_b=8)]
        alone = [beam_search(q, src[i:i + 1], beam_size=4, max_len_b=8)[0][0]
                 for i in range(len(src))]
    assert [h.tokens for h in alone] == [h.tokens for h in batch]
    assert all(abs(a.score - b.score) < 1e-5 for a, b in zip(alone, batch))


def test_int8_log_probs_and_beam_search_agree_with_fp32(workspace, tokenizer):
    """int8 log-probabilities within a tolerance of fp32's, and int8 beam search giving fp32's
    tokens for at least 12 of 16 sentences, on the tests' untrained tiny model.

    The tolerances come from the arithmetic: each product rounds its weights to 1/254 of their
    row's range and each input row to 1/126 of its own range (7 bits, as x86's reduce_range),
    about 0.5% relative error per layer; through the 1 + 1 layers and the pre-softmax map that
    moves a log-probability by ~0.02 on average and ~0.15 at most (seeds 0-2: 0.022 / 0.156),
    so a best hypothesis found by both scores within 0.15 of itself (18 tokens, length
    penalty ~2.3). The tokens: an untrained model's next-token scores are nearly flat (logits'
    standard deviation ~1), so the best two candidates of a step sometimes lie closer than that
    error and either may win, after which the two searches part; over seeds 0-3, 14 to 16 of
    these 16 sentences kept fp32's tokens (seed 2: 14), hence the threshold of 12 (3/4). A
    trained model's scores are peaked and part far less often (the default model:
    docs/measurements/2026-11-27-int8-decoding-cpu.md).
    """
    _, cfg = workspace
    model, q = _int8_model(cfg, tokenizer.vocab_size, 2)
    src, tgt = _random_batch(tokenizer.vocab_size, 16, 10, 8, seed=0)
    with torch.no_grad():
        ref = model(src, tgt).log_softmax(-1)  # (B, T, V)
        got = q(src, tgt).log_softmax(-1)
    diff = (got - ref).abs()
    assert float(diff.mean()) < 0.05 and float(diff.max()) < 0.5, (float(diff.mean()),
                                                                   float(diff.max()))
    with torch.no_grad():
        best_fp32 = [h[0] for h in beam_search(model, src, beam_size=4, max_len_b=8)]
        best_int8 = [h[0] for h in beam_search(q, src, beam_size=4, max_len_b=8)]
    same = [a for a, b in zip(best_fp32, best_int8) if a.tokens == b.tokens]
    assert len(same) >= 12, f"{len(same)} of 16 sentences decoded as in fp32"
    assert all(abs(a.score - b.score) < 0.15
               for a, b in zip(best_fp32, best_int8) if a.tokens == b.tokens)


def test_int8_translates_and_evaluates_end_to_end(workspace, tokenizer, tmp_path, capsys):
    cfg = run_with_averaged_model(workspace[1], tmp_path / "runs" / "tiny",
                                  tokenizer.vocab_size, 3)
    cfg.decode.precision = "int8"
    results = evaluate(cfg)
    saved = json.loads((Path(cfg.run_dir) / "results.json").read_text())
    assert saved["decode"]["precision"] == "int8"
    test = saved["test_sets"]["test_2016_flickr"]
    assert test["decode"]["precision"] == "int8" and test["speed"]["precision"] == "int8"
    assert results["decode"]["precision"] == "int8"
    hyps = Path(test["translations"]).read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 12

    # nmt-table names the precision beside the test set
    report = build_report(load_results(str(tmp_path / "runs" / "*" / "results.json")))
    assert "| test_2016_flickr (int8) |" in report

    # nmt-translate: the same translations as nmt-evaluate's
    src = tmp_path / "in.en"
    src.write_text("\n".join(sentences(12, 1)) + "\n", encoding="utf-8")
    out = tmp_path / "out.de"
    cfg.translate.input, cfg.translate.output = str(src), str(out)
    stats = translate(cfg)
    assert stats["precision"] == "int8"
    assert out.read_text(encoding="utf-8").splitlines() == hyps
    capsys.readouterr()


def test_int8_on_a_gpu_is_refused(workspace, tokenizer, monkeypatch, tmp_path):
    _, cfg = workspace
    with pytest.raises(UserError) as e:
        check_int8_device(torch.device("cuda", 0))
    assert str(e.value) == (
        "decode.precision=int8 decodes on a CPU, and decode.device resolves to cuda:0; set "
        "decode.device=cpu, or decode on the GPU with decode.precision=bf16 (or fp16)")
    model = new_model(cfg, tokenizer.vocab_size, 1)
    with pytest.raises(UserError, match="decodes on a CPU"):
        decoding_model(model, DecodeConfig(precision="int8"), "cuda")
    assert not is_quantized(model)
    # nmt-evaluate / nmt-translate on a machine with a GPU: refused before the model is read
    from transformer_nmt.decode import translate as translate_module
    from transformer_nmt.evaluate import evaluate as evaluate_module

    cuda = torch.device("cuda")
    cfg = copy.deepcopy(cfg)
    cfg.run_dir = str(tmp_path / "run")
    cfg.decode.precision = "int8"
    for module in (evaluate_module, translate_module):
        monkeypatch.setattr(module, "resolve_device", lambda name, key="decode.device": cuda)
        monkeypatch.setattr(module, "resolve_checkpoint", lambda c: pytest.fail("model read"))
    with pytest.raises(UserError, match="decode.device resolves to cuda"):
        evaluate(cfg)
    with pytest.raises(UserError, match="decode.device resolves to cuda"):
        translate(cfg)


def test_int8_refuses_a_model_it_cannot_quantize(workspace, tokenizer, monkeypatch):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, 1)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.decoder_layers[0].ffn.w_1.weight[0, 0] = float("nan")
    with pytest.raises(UserError) as e:
        quantize_int8(broken, "m.pt")
    assert str(e.value) == (
        "m.pt: cannot quantize it to int8 (decode.precision=int8): 1 of its parameter tensors "
        "hold NaN or inf values (e.g. decoder_layers.0.ffn.w_1.weight); decode with an earlier "
        "checkpoint (decode.checkpoint=...)")
    # a PyTorch build without a quantized engine
    monkeypatch.setattr(type(torch.backends.quantized), "supported_engines",
                        property(lambda self: ["none"]))
    with pytest.raises(UserError) as e:
        quantize_int8(model, "m.pt")
    assert str(e.value).startswith(
        f"decode.precision=int8 needs one of PyTorch's quantized engines {list(quantize.ENGINES)}"
        f", and torch {torch.__version__} here supports ['none']; ")
    assert not is_quantized(model)


def test_translate_lines_refuses_a_precision_its_model_was_not_made_for(workspace, tokenizer):
    _, cfg = workspace
    model, q = _int8_model(cfg, tokenizer.vocab_size, 1)
    lines = sentences(2, 3)
    with pytest.raises(ValueError, match="decode.precision=int8 with a model not quantized"):
        translate_lines(model, tokenizer, lines, DecodeConfig(precision="int8"), "cpu")
    with pytest.raises(ValueError, match="decode.precision=fp32 with a model quantized"):
        translate_lines(q, tokenizer, lines, DecodeConfig(), "cpu")


def test_int8_with_the_ctranslate2_engine_is_refused(workspace, tokenizer):
    from transformer_nmt.errors import ExportError
    from transformer_nmt.interop.ctranslate2 import decode_engine

    _, cfg = workspace
    cfg = copy.deepcopy(cfg)
    cfg.decode.engine, cfg.decode.precision = "ctranslate2", "int8"
    model = new_model(cfg, tokenizer.vocab_size, 1)
    with pytest.raises(ExportError) as e:
        decode_engine(model, "m.pt", cfg, torch.device("cpu"))
    assert str(e.value) == (
        "decode.engine=ctranslate2 decode.precision=int8: decode.precision=int8 quantizes our "
        "engine's model; for CTranslate2's int8 use decode.engine=ctranslate2_int8 (with "
        "decode.precision=fp32)")
    # the model to decode with is CTranslate2's, not a quantized copy of ours
    assert decoding_model(model, cfg.decode, "cpu") is model and not is_quantized(model)


def test_int8_checkpoint_bleu_decodes_each_checkpoint_quantized(tmp_path):
    """nmt-plot's BLEU figure decodes through the same path: each checkpoint quantized once,
    and its scores cached apart from fp32's (the decode settings key the cache)."""
    from transformer_nmt.evaluate import checkpoint_bleu as ebleu
    from unit.plot.test_figures import make_run

    cfg, _ = make_run(tmp_path / "plotrun")
    decode = copy.deepcopy(cfg.decode)
    decode.precision = "int8"
    rows = ebleu.checkpoint_bleu(cfg.run_dir, decode, "cpu", cache_dir=tmp_path)
    assert [r["label"] for r in rows] == ["checkpoint_100.pt", "checkpoint_200.pt", "average of 2"]
    fp32 = ebleu.checkpoint_bleu(cfg.run_dir, cfg.decode, "cpu", cache_dir=tmp_path)
    cache = json.loads((tmp_path / ebleu.BLEU_CACHE_NAME).read_text())
    assert len(fp32) == 3 and len(cache) == 6


class _ProductRows(TorchDispatchMode):
    """The row counts the int8 product is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("linear_with_input_q_dq_qweight_dq_output_fp32",
                                            "linear_dynamic"):
            self.rows.add(args[0].size(0))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fixed_scale", [True, False])
def test_int8_rows_are_computed_in_few_batch_sizes_with_the_same_results(monkeypatch,
                                                                         fixed_scale):
    """Any row count is computed in a padded batch of packed_rows rows (the product's memory
    stays bounded over a long job): bit for bit the results of the exact batch."""
    if not fixed_scale:
        monkeypatch.setattr(quantize, "_fixed_scale_product", lambda packed, in_features: False)
    torch.manual_seed(0)
    layer = quantize_int8(nn.Sequential(nn.Linear(32, 40)).eval())[0]
    assert layer.fixed_scale == fixed_scale
    x = torch.randn(500, 32, generator=torch.Generator().manual_seed(6))
    counts = range(1, 501, 7)
    seen = _ProductRows()
    with torch.no_grad():
        got = {}
        with seen:
            for m in counts:
                got[m] = layer(x[:m].view(m, 1, 32))
        monkeypatch.setattr(quantize, "pad_rows", lambda rows: rows)  # the exact batches
        for m in counts:
            assert got[m].shape == (m, 1, 40) and torch.equal(got[m], layer(x[:m].view(m, 1, 32)))
    anchors = 0 if fixed_scale else 2
    assert seen.rows == {prepack.packed_rows(m) + anchors for m in counts}
    assert len(seen.rows) < len(counts) / 2
