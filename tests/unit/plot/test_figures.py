"""nmt-plot: metrics histories of resumed runs, curve and BLEU figures, and attention maps
recomputed from the model's own forward pass (tiny random models, real SentencePiece)."""

from __future__ import annotations

import json
import logging
import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException

from transformer_nmt.checkpoint import average_checkpoints, save_checkpoint
from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    DecodeConfig,
    ModelConfig,
    compose,
    to_plain,
)
from transformer_nmt.data.bpe import SentencePieceTokenizer, train_spm
from transformer_nmt.decode.translate import translate_lines
from transformer_nmt.evaluate import checkpoint_bleu as ebleu
from transformer_nmt.evaluate.bleu import sacrebleu_score
from transformer_nmt.fileio import raw_path, spm_model_path
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.plot import attention as pattn
from transformer_nmt.plot import checkpoint_bleu as pbleu
from transformer_nmt.plot import common as pcommon
from transformer_nmt.plot import curves as pcurves
from transformer_nmt.plot import make as pmake

REPO = Path(__file__).resolve().parents[3]
WORDS = ["a", "dog", "cat", "man", "woman", "runs", "sits", "plays", "on", "in", "the", "red",
         "blue", "big", "street", "park", "water", "ball", "with", "two", "people"]
TINY_MODEL = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=16",
              "model.d_ff=32", "model.heads=2", "model.dropout=0.0", "model.max_positions=128"]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's signature and IHDR chunk; fails on anything else."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def expected_pixels(fig) -> tuple[int, int]:
    w, h = fig.get_size_inches() * fig.dpi
    return round(w), round(h)


# ---------------------------------------------------------------- metrics.jsonl


def train_rec(step: int, loss: float) -> dict:
    return {"split": "train", "step": step, "time": 0.0, "loss": loss, "nll_loss": loss - 0.1,
            "ppl": 2.0 ** loss, "lr": 1e-4 * step, "grad_norm": 1.0, "tokens_per_s": 1000.0,
            "seconds_per_step": 0.1, "skipped_steps": 0, "epoch": step / 1000,
            "tokens_seen": 500 * step}


def valid_rec(step: int, ppl: float) -> dict:
    return {"split": "valid", "step": step, "time": 0.0, "loss": 1.0, "nll_loss": 1.0, "ppl": ppl}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


DEAD = 99.0  # the value written by the interrupted run after its last checkpoint


def resumed_records(dead_until: int, resumed_until: int) -> list[dict]:
    """Steps 10..50 (checkpoint at 50, validated at 50), then an interrupted segment
    51..dead_until whose records must vanish, then the run resumed from step 50."""
    recs = [train_rec(s, 5.0 - s / 100) for s in range(10, 60, 10)] + [valid_rec(50, 40.0)]
    for s in range(60, dead_until + 1, 10):
        recs.append(train_rec(s, DEAD))
        if s % 50 == 0:
            recs.append(valid_rec(s, DEAD))
    for s in range(60, resumed_until + 1, 10):
        recs.append(train_rec(s, 5.0 - s / 100))
        if s % 50 == 0:
            recs.append(valid_rec(s, 40.0 - s / 10))
    return recs


@pytest.mark.parametrize("dead_until,resumed_until", [(70, 100), (60, 100), (150, 100)])
def test_resumed_run_has_no_gap_and_no_duplicate_steps(tmp_path, dead_until, resumed_until):
    path = write_jsonl(tmp_path / "run" / "metrics.jsonl",
                       resumed_records(dead_until, resumed_until))
    hist = pcurves.read_metrics(path)
    train_steps = [r["step"] for r in hist["train"]]
    assert train_steps == list(range(10, resumed_until + 1, 10))
    assert [r["step"] for r in hist["valid"]] == [50, 100]
    assert all(r["loss"] != DEAD for r in hist["train"])
    assert all(r["ppl"] != DEAD for r in hist["valid"])

    fig = pcurves.plot_curves({"run": hist}, tmp_path / "curves.png")
    try:
        assert png_size(tmp_path / "curves.png") == expected_pixels(fig) == (1300, 1000)
        loss_ax, ppl_ax = fig.axes[0], fig.axes[1]
        x = loss_ax.lines[0].get_xdata()
        assert list(x) == train_steps  # strictly increasing, every logged step once
        assert np.all(np.diff(x) == 10)  # no gap
        assert DEAD not in set(loss_ax.lines[0].get_ydata())
        assert list(ppl_ax.lines[0].get_xdata()) == [50, 100]
        assert list(ppl_ax.lines[0].get_ydata()) == [40.0, 30.0]
        # Against tokens seen: the same values, at the steps' token counts.
        tok_ax = fig.axes[3]
        assert list(tok_ax.lines[0].get_xdata()) == [500 * s for s in train_steps]
        assert list(fig.axes[4].lines[0].get_xdata()) == [500 * 50, 500 * 100]
    finally:
        pcommon.close(fig)


def test_valid_after_the_last_train_record_maps_to_later_tokens(tmp_path):
    recs = [train_rec(50, 3.0), train_rec(100, 2.0), valid_rec(100, 9.0), valid_rec(118, 8.0)]
    hist = pcurves.read_metrics(write_jsonl(tmp_path / "metrics.jsonl", recs))
    fig = pcurves.plot_curves({"run": hist}, tmp_path / "curves.png")
    try:
        assert list(fig.axes[4].lines[0].get_xdata()) == [50_000, 59_000]
    finally:
        pcommon.close(fig)


def test_read_metrics_bad_lines(tmp_path, caplog):
    good = [json.dumps(train_rec(s, 1.0)) for s in (10, 20)]
    path = tmp_path / "metrics.jsonl"
    path.write_text(good[0] + "\n{not json\n" + good[1] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not JSON"):
        pcurves.read_metrics(path)
    path.write_text(good[0] + "\n" + json.dumps({"split": "train", "step": "7"}) + "\n")
    with pytest.raises(ValueError, match=r"line 2: 'step' must be an integer, got '7'"):
        pcurves.read_metrics(path)
    # A last line cut short by a kill is dropped with a warning.
    path.write_text(good[0] + "\n" + good[1] + "\n" + good[1][:15], encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.plot"):
        assert [r["step"] for r in pcurves.read_metrics(path)["train"]] == [10, 20]
    assert "line 3: incomplete last line" in caplog.text
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        pcurves.read_metrics(tmp_path / "missing.jsonl")


def test_several_runs_on_one_figure(tmp_path):
    a = pcurves.read_metrics(write_jsonl(tmp_path / "a.jsonl", resumed_records(70, 100)))
    b_recs = [train_rec(s, 4.0 - s / 200) for s in range(10, 210, 10)]
    b = pcurves.read_metrics(write_jsonl(tmp_path / "b.jsonl", b_recs))
    fig = pcurves.plot_curves({"en_de": a, "en_fr": b}, tmp_path / "both.svg")
    try:
        assert (tmp_path / "both.svg").read_text().lstrip().startswith("<?xml")
        lines = fig.axes[0].lines
        assert [ln.get_label() for ln in lines] == ["en_de", "en_fr"]
        assert list(lines[1].get_xdata()) == list(range(10, 210, 10))
        assert lines[0].get_color() != lines[1].get_color()
    finally:
        pcommon.close(fig)
    with pytest.raises(ValueError, match="no train records"):
        pcurves.plot_curves({"empty": {}}, tmp_path / "x.png")


# ---------------------------------------------------------------- attention weights

V = 23
MODEL_VARIANTS = {
    "post": {},
    "pre_dk_ne_dv": {"norm": "pre", "d_k": 6, "d_v": 10},
}


@pytest.mark.parametrize("variant", list(MODEL_VARIANTS))
def test_attention_weights_reproduce_the_modules_output(variant):
    cfg = ModelConfig(name="t", encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64,
                      heads=4, dropout=0.1, attention_dropout=0.1, max_positions=64,
                      **MODEL_VARIANTS[variant])
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=V).eval()
    src = torch.randint(4, V, (3, 7))
    src[1, 5:] = PAD_ID  # one padded source row: the key-padding mask is exercised
    src[:, -1] = torch.tensor([EOS_ID, PAD_ID, EOS_ID])
    src[1, 4] = EOS_ID
    tgt_in = torch.randint(4, V, (3, 6))
    tgt_in[:, 0] = BOS_ID
    with torch.no_grad(), pattn.AttentionCapture(model) as cap:
        logits = model(src, tgt_in)
    # The hooks only observe: the same forward pass without them gives the same logits.
    with torch.no_grad():
        assert torch.equal(model(src, tgt_in), logits)
    names = [c.name for c in cap.calls]
    assert names == ["encoder_layers.0.self_attn", "encoder_layers.1.self_attn",
                     "decoder_layers.0.self_attn", "decoder_layers.0.cross_attn",
                     "decoder_layers.1.self_attn", "decoder_layers.1.cross_attn"]
    for call in cap.calls:
        w = pattn.attention_weights(call)
        decoder_self = call.name.startswith("decoder") and call.name.endswith("self_attn")
        keys = 6 if decoder_self else 7
        assert w.shape == (3, 4, call.x.size(1), keys)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), rtol=0, atol=1e-6)
        if not decoder_self:
            assert torch.all(w[1, :, :, 5:] == 0)  # padded source keys get no weight
        else:
            assert torch.all(w.triu(diagonal=1) == 0)  # causal: nothing from the future
        torch.testing.assert_close(pattn.attention_output(call, w), call.output,
                                   rtol=1e-5, atol=1e-5)
        # A wrong mask would not reproduce the output: the test can fail.
        if decoder_self:
            uniform = torch.full_like(w, 1.0 / w.size(-1))
            assert not torch.allclose(pattn.attention_output(call, uniform), call.output,
                                      atol=1e-3)


# ---------------------------------------------------------------- a tiny real run folder


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))).capitalize() + "."
            for _ in range(n)]


def make_run(root: Path):
    """A run folder under ``root`` with two step checkpoints of a tiny random model, a
    metrics.jsonl, the SentencePiece model and a 12-line validation set: ``(cfg, tokenizer)``."""
    run_dir = root / "runs" / "tiny"
    cfg = compose([f"data.root={root / 'data'}", f"run_dir={run_dir}", "name=tiny",
                   "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6",
                   *TINY_MODEL])
    train_file = raw_path(cfg.data, "train", "en")
    train_file.parent.mkdir(parents=True)
    train_file.write_text("\n".join(sentences(300, 0)) + "\n", encoding="utf-8")
    train_spm(cfg.data, [train_file], spm_model_path(cfg.data))
    for lang, seed in (("en", 1), ("de", 2)):
        raw_path(cfg.data, "valid", lang).write_text(
            "\n".join(sentences(12, seed)) + "\n", encoding="utf-8")
    tok = SentencePieceTokenizer(spm_model_path(cfg.data))
    for step, seed in ((100, 1), (200, 2)):
        torch.manual_seed(seed)
        model = Transformer(cfg.model, vocab_size=tok.vocab_size)
        save_checkpoint(run_dir / "checkpoints" / f"checkpoint_{step}.pt", {
            "model": model.state_dict(), "config": to_plain(cfg),
            "vocab_size": tok.vocab_size, "train_state": {"step": step},  # training layout
        })
    write_jsonl(run_dir / "metrics.jsonl", resumed_records(70, 200))
    return cfg, tok


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """:func:`make_run` in a temporary folder, once per module."""
    return make_run(tmp_path_factory.mktemp("plotrun"))


def test_attention_maps_plot_the_models_weights(run, tmp_path):
    cfg, tok = run
    from transformer_nmt.checkpoint import load_model

    model, _ = load_model(Path(cfg.run_dir) / "checkpoints" / "checkpoint_200.pt")
    sentence = "Two people play with a red ball."
    maps = pattn.attention_maps(model, tok, sentence, cfg.decode)
    src_ids = tok.encode(sentence)
    assert maps["source"] == [tok.sp.id_to_piece(i) for i in src_ids] + ["</s>"]
    s, t = len(maps["source"]), len(maps["target"])
    assert maps["target"][-1] == "</s>" and t >= 1
    assert len(maps["encoder"]) == len(maps["cross"]) == 2
    for w in maps["encoder"]:
        assert w.shape == (2, s, s)
    for w in maps["cross"]:
        assert w.shape == (2, t, s)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, t), rtol=0, atol=1e-6)
    for name, call in maps["calls"].items():
        torch.testing.assert_close(pattn.attention_output(call, maps["weights"][name]),
                                   call.output, rtol=1e-5, atol=1e-5)

    path = tmp_path / "cross.png"
    w = maps["cross"][-1]
    fig = pattn.plot_attention(w, maps["target"], maps["source"], path, "cross")
    try:
        assert png_size(path) == expected_pixels(fig)
        for h in range(2):
            ax = fig.axes[h]
            assert np.array_equal(np.asarray(ax.images[0].get_array()), w[h].numpy())
            assert [lb.get_text() for lb in ax.get_xticklabels()] == maps["source"]
            assert [lb.get_text() for lb in ax.get_yticklabels()] == maps["target"]
        assert np.allclose(np.asarray(fig.axes[2].images[0].get_array()), w.mean(0).numpy())
    finally:
        pcommon.close(fig)
    with pytest.raises(ValueError, match="do not match"):
        pattn.plot_attention(w, maps["source"], maps["source"][:-1], tmp_path / "x.png", "x")


def test_checkpoint_bleu_scores_each_checkpoint_and_caches(run, tmp_path, monkeypatch):
    cfg, tok = run
    run_dir = Path(cfg.run_dir)
    rows = ebleu.checkpoint_bleu(run_dir, cfg.decode, "cpu", cache_dir=tmp_path)
    assert [(r["label"], r["step"]) for r in rows] == [
        ("checkpoint_100.pt", 100), ("checkpoint_200.pt", 200), ("average of 2", 200)]
    assert rows[2]["averaged_from"] == ["checkpoint_100.pt", "checkpoint_200.pt"]
    # The average's score is the BLEU of the averaged parameters' translations.
    model = Transformer(cfg.model, vocab_size=tok.vocab_size)
    model.load_state_dict(average_checkpoints(
        [run_dir / "checkpoints" / f"checkpoint_{s}.pt" for s in (100, 200)]))
    src = raw_path(cfg.data, "valid", "en").read_text().splitlines()
    ref = raw_path(cfg.data, "valid", "de").read_text().splitlines()
    hyps, _ = translate_lines(model.eval(), tok, src, cfg.decode, "cpu")
    assert rows[2]["bleu"] == sacrebleu_score(hyps, ref)["score"]

    # Re-plotting reads the cache and decodes nothing.
    def no_decoding(*a, **k):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr("transformer_nmt.evaluate.checkpoint_bleu.translate_lines", no_decoding)
    assert ebleu.checkpoint_bleu(run_dir, cfg.decode, "cpu", cache_dir=tmp_path) == rows
    fig = pbleu.plot_checkpoint_bleu({"tiny": rows}, tmp_path / "bleu.png")
    try:
        assert png_size(tmp_path / "bleu.png") == expected_pixels(fig) == (800, 500)
        line = fig.axes[0].lines[0]
        assert list(line.get_xdata()) == [100, 200]
        assert list(line.get_ydata()) == [rows[0]["bleu"], rows[1]["bleu"]]
    finally:
        pcommon.close(fig)
    # Another decode setting is another cache entry: it decodes (and so fails here).
    with pytest.raises(AssertionError, match="decoded again"):
        ebleu.checkpoint_bleu(run_dir, DecodeConfig(beam_size=1), "cpu", cache_dir=tmp_path)


def test_checkpoint_bleu_scores_against_references_detokenized_as_the_hypotheses(
        run, tmp_path, monkeypatch):
    """Data prepared with data.pretokenize=moses: the hypotheses come out detokenized, so the
    tokenized validation references are detokenized the same way before scoring. A stand-in
    detokenizer that maps every line to one sentence makes both sides equal (BLEU 100) only
    when the references go through it too."""
    cfg, tok = run
    sentence = "Ein kleiner Hund rennt am Strand entlang ."

    class Detokenizing:
        def __getattr__(self, name):
            return getattr(tok, name)

        def detokenize(self, lines):
            return [sentence for _ in lines]

    monkeypatch.setattr("transformer_nmt.evaluate.checkpoint_bleu.load_tokenizer",
                        lambda data: Detokenizing())
    rows = ebleu.checkpoint_bleu(Path(cfg.run_dir), cfg.decode, "cpu", cache_dir=tmp_path)
    assert [r["bleu"] for r in rows] == pytest.approx([100.0] * len(rows))


def plot_cfg(overrides: list[str]):
    """The composed nmt-plot config (the pipeline's, with its ``plot`` group)."""
    return compose(overrides)


def test_make_plots_several_runs_and_errors(run, tmp_path):
    cfg, _ = run
    run_dir = Path(cfg.run_dir)
    other = tmp_path / "other"
    write_jsonl(other / "metrics.jsonl", [train_rec(s, 3.0) for s in range(10, 110, 10)])
    base = [f"data.root={cfg.data.root}", f"run_dir={run_dir}", "decode.device=cpu",
            f"plot.dir={tmp_path / 'out'}"]
    written = pmake.make_plots(plot_cfg([*base, f"plot.runs=[{run_dir},{other}]",
                                        "plot.kinds=[curves]", "plot.format=svg"]))
    assert written == [tmp_path / "out" / "curves_tiny_vs_other.svg"]
    assert written[0].read_text().lstrip().startswith("<?xml")
    for args, error, message in (
        ([f"plot.runs=[{tmp_path / 'nowhere'}]"], FileNotFoundError, "run folder"),
        ([f"plot.runs=[{tmp_path}]", "plot.kinds=[curves]"], FileNotFoundError, "metrics.jsonl"),
        (["plot.sentence=A dog.", "plot.kinds=[]", "plot.layer=5"], ValueError,
         "plot.layer=5 is out of range: the model has 2 layers"),
    ):
        with pytest.raises(error, match=re.escape(message)):
            pmake.make_plots(plot_cfg([*base, *args]))
    for args, message in ((["plot.kinds=[curves,pictures]"], "Invalid value 'pictures'"),
                          (["plot.format=jpg"], "Invalid value 'jpg'")):
        with pytest.raises(ConfigCompositionException) as e:  # refused when composed
            plot_cfg([*base, *args])
        assert message in str(e.value.__cause__)
