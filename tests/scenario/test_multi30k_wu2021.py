"""experiment=multi30k_wu2021 (Wu et al. 2021's text-only Transformer-tiny) and the data options
it needs: data.lowercase and data.pretokenize=moses (lowercased, Moses-tokenized text before
BPE, translations Moses-detokenized)."""

from __future__ import annotations

import json
import math

import pytest

from transformer_nmt.config import compose
from transformer_nmt.data import moses
from transformer_nmt.data.bpe import load_tokenizer, spm_params
from transformer_nmt.data.clean import clean_params, preprocess_pair
from transformer_nmt.evaluate.bleu import PAPER_LABELS, SACREBLEU_LABEL, SACREBLEU_LC_LABEL
from transformer_nmt.evaluate.report import build_report, load_results
from transformer_nmt.fileio import raw_path
from transformer_nmt.train.optim import inverse_sqrt_lr


def test_the_preset_composes_validates_and_has_their_settings():
    """The notes' settings (docs/multi30k_wu2021.md), read from the composed config."""
    cfg = compose(["experiment=multi30k_wu2021"])
    m, t, d = cfg.model, cfg.trainer, cfg.decode
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.heads) == (4, 4, 128, 256, 4)
    assert (m.dropout, m.attention_dropout, m.activation_dropout) == (0.3, 0.0, 0.0)
    assert m.share_embeddings == "all" and m.norm == "post"
    assert list(t.adam_betas) == [0.9, 0.98] and t.adam_eps == 1e-8 and t.clip_norm == 25.0
    assert t.label_smoothing == 0.1 and t.max_steps == 8000 and t.patience == 10
    assert (t.max_tokens, t.update_freq) == (4096, 2)
    assert t.validate_every_epochs == 1 and t.validate_every_steps is None
    assert t.save_every_epochs == 1 and cfg.average.last == 10 and t.keep_last >= 10
    assert (d.beam_size, d.lenpen, d.lenpen_form) == (5, 1.0, "fairseq")
    assert cfg.data.lowercase and cfg.data.pretokenize == "moses"
    assert cfg.data.name != compose([]).data.name  # its own data folder


def test_the_preset_schedule_is_fairseqs_inverse_sqrt_with_peak_0005():
    """fairseq's inverse_sqrt with --lr 0.005 --warmup-updates 2000: linear warm-up to 0.005
    at update 2000, then 0.005 * sqrt(2000 / step)."""
    t, m = compose(["experiment=multi30k_wu2021"]).trainer, compose(
        ["experiment=multi30k_wu2021"]).model

    def lr(step):
        return inverse_sqrt_lr(step, m.d_model, t.warmup_steps, t.lr_multiplier)

    assert t.warmup_steps == 2000
    assert lr(2000) == pytest.approx(0.005, rel=1e-12)
    assert lr(1000) == pytest.approx(0.0025, rel=1e-12)
    for step in (2001, 4000, 8000):
        assert lr(step) == pytest.approx(0.005 * math.sqrt(2000 / step), rel=1e-12)
    assert max(lr(s) for s in range(1, 8001)) == pytest.approx(0.005, rel=1e-12)


LINES = [
    ("A man's \u201cbig\u201d dog \u2013 in N.Y. \u2013 runs & jumps...",
     "Ein \u201eGro\u00dfer\u201c Hund \u2013 \u00c4RGER \u2013 rennt & springt..."),
    ("Two kids (5 and 7) play with a 10\u00a0000-piece puzzle.",
     "Zwei Kinder (5 und 7) spielen mit einem 10\u00a0000-teiligen Puzzle."),
    ("It's 3:30 p.m.; \"Go!\" she said.", "Es ist 15:30 Uhr; \u201eLos!\u201c, sagte sie."),
]


def test_lowercase_and_pretokenize_round_trip():
    """The data stage's text steps equal the Moses pipeline (lowercase.perl,
    normalize-punctuation.perl, tokenizer.perl); detokenizing and tokenizing again gives the
    same tokens; each option works alone."""
    cfg = compose(["experiment=multi30k_wu2021"]).data
    for src, tgt in LINES:
        s, t = preprocess_pair(src, tgt, cfg)
        assert s == moses.tokenize([moses.normalize_punctuation(src.lower(), "en")], "en")[0]
        assert t == moses.tokenize([moses.normalize_punctuation(moses.lowercase(tgt), "de")],
                                   "de")[0]
        assert s == s.lower() and t == t.lower()
        for side, lang in ((s, "en"), (t, "de")):
            text = moses.detokenize([side], lang)[0]
            assert "&quot;" not in text and "&amp;" not in text and "&apos;" not in text
            assert moses.preprocess([text], lang, lower=True, moses=True) == [side]
    only_lower = compose(["experiment=multi30k_wu2021", "data.pretokenize=none"]).data
    assert preprocess_pair("A Dog's ball.", "Ein Ball.", only_lower) == (
        "a dog's ball.", "ein ball.")
    only_tok = compose(["experiment=multi30k_wu2021", "data.lowercase=false"]).data
    assert preprocess_pair("A Dog's ball.", "Ein Ball.", only_tok) == (
        "A Dog &apos;s ball .", "Ein Ball .")
    plain = compose([]).data
    assert preprocess_pair("A Dog's ball.", "Ein Ball.", plain) == ("A Dog's ball.", "Ein Ball.")
    # data prepared without the options keeps its stamps: their parameters are unchanged
    assert not {"lowercase", "pretokenize"} & (set(clean_params(plain)) | set(spm_params(plain)))
    assert spm_params(cfg)["pretokenize"] == "moses" and clean_params(cfg)["lowercase"] is True


def test_a_bad_pretokenize_value_is_refused():
    with pytest.raises(Exception, match="pretokenize"):
        compose(["experiment=multi30k_wu2021", "data.pretokenize=spacy"])


def test_tiny_end_to_end_run_with_the_options(tmp_path, multi30k_mirror, tiny_model, capsys):
    """prepare -> train (a few steps) -> evaluate -> translate with the preset's data options on
    a slice of Multi30k: the prepared text is lowercased and tokenized, the references are kept
    as distributed, the translations are detokenized, and results.json has the mmt form."""
    from transformer_nmt.checkpoint import average_run
    from transformer_nmt.data.prepare import prepare
    from transformer_nmt.decode.translate import translate
    from transformer_nmt.evaluate.evaluate import evaluate
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    overrides = [
        "experiment=multi30k_wu2021", f"data.mirror={multi30k_mirror}",
        f"data.root={tmp_path / 'data'}", "data.max_train_pairs=300", "data.vocab_size=400",
        "data.num_workers=1", "data.test_splits=[test_2016_flickr]", f"run_dir={run_dir}",
        *tiny_model, "trainer.max_tokens=512", "trainer.max_steps=4", "trainer.update_freq=1",
        "trainer.warmup_steps=2", "trainer.save_every_epochs=null", "trainer.save_every_steps=2",
        "trainer.validate_every_epochs=null", "trainer.validate_every_steps=2",
        "average.last=2", "decode.beam_size=2", "decode.max_len_b=8",
    ]
    cfg = compose(overrides)
    summary = prepare(cfg)
    assert summary["pairs"]["train"]["kept"] == 300
    train_de = raw_path(cfg.data, "train", "de").read_text(encoding="utf-8").splitlines()
    assert train_de[0] == "zwei junge weiße männer sind im freien in der nähe vieler büsche ."
    assert all(line == line.lower() for line in train_de)
    tokenizer = load_tokenizer(cfg.data)
    assert (tokenizer.lowercase, tokenizer.pretokenize) == (True, "moses")
    assert tokenizer.detokenize(["ein hund &apos;s ball ."]) == ["ein hund 's ball."]
    assert tokenizer.preprocess(["A Dog's ball."]) == ["a dog &apos;s ball ."]

    train(cfg)
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 4
    average_run(cfg)
    results = evaluate(cfg)
    printed = capsys.readouterr().out  # the nmt-evaluate printout
    assert f"  {PAPER_LABELS['mmt']}: " in printed
    bleu = results["test_sets"]["test_2016_flickr"]["bleu"]
    # Lowercased data: the headline sacreBLEU is lowercased (case:lc), the cased one beside it,
    # both labelled, printed and in the table.
    assert "|case:lc|" in bleu["sacrebleu"]["signature"]
    assert bleu["sacrebleu"]["label"] == SACREBLEU_LC_LABEL
    assert "|case:mixed|" in bleu["sacrebleu:cased"]["signature"]
    assert bleu["sacrebleu:cased"]["label"] == SACREBLEU_LABEL
    assert f"  {SACREBLEU_LC_LABEL}: {bleu['sacrebleu']['score']:.2f}  (" in printed
    assert f"  {SACREBLEU_LABEL}: {bleu['sacrebleu:cased']['score']:.2f}  (" in printed
    report = build_report(load_results(str(run_dir / "results.json")))
    assert (f"| {bleu['sacrebleu']['score']:.2f} (lowercased; mixed case "
            f"{bleu['sacrebleu:cased']['score']:.2f}) |") in report
    assert bleu["paper_bleu:mmt"]["form"] == "mmt"
    assert 0.0 <= bleu["paper_bleu:mmt"]["score"] <= 100.0
    hyps = (run_dir / "translations" / "test_2016_flickr.de").read_text(encoding="utf-8")
    assert "&apos;" not in hyps and "&quot;" not in hyps and "&amp;" not in hyps
    assert not any(line.endswith(" .") for line in hyps.splitlines())  # detokenized
    assert hyps == hyps.lower()

    src = tmp_path / "in.en"
    src.write_text("A DOG RUNS.\n\nTwo men play.\n", encoding="utf-8")
    out = tmp_path / "out.de"
    translate(compose([*overrides, f"translate.input={src}", f"translate.output={out}"]))
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and lines[1] == ""
    # the input was lowercased and tokenized as the training data: the same output as the
    # prepared form of the input
    src.write_text("a dog runs .\n\ntwo men play .\n", encoding="utf-8")
    out2 = tmp_path / "out2.de"
    translate(compose([*overrides, f"translate.input={src}", f"translate.output={out2}"]))
    assert out2.read_text(encoding="utf-8").splitlines() == lines


def test_translations_of_every_engine_are_detokenized():
    """decode.engine=ctranslate2 decodes outside our beam search: its output is detokenized
    the same way (best and n-best)."""
    from types import SimpleNamespace

    from transformer_nmt.decode.translate import translate_lines

    class Engine:
        is_ctranslate2 = True

        def translate_lines(self, tokenizer, lines, decode_cfg, return_hypotheses=False):
            if return_hypotheses:
                return [[("ein hund &apos;s ball .", -1.0), ("ein ball .", -2.0)]], {"n": 1}
            return ["ein hund &apos;s ball .", ""], {"n": 2}

    tokenizer = SimpleNamespace(detokenize=lambda lines: moses.detokenize(lines, "de"))
    out, stats = translate_lines(Engine(), tokenizer, ["a", ""], None)
    assert out == ["ein hund 's ball.", ""] and stats == {"n": 2}
    nbest, _ = translate_lines(Engine(), tokenizer, ["a"], None, return_hypotheses=True)
    assert nbest == [[("ein hund 's ball.", -1.0), ("ein ball.", -2.0)]]
