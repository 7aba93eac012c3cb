"""The Multi30k papers' BLEU (form ``mmt``): lowercase.perl, normalize-punctuation.perl and
tokenizer.perl on both sides, multi-bleu.perl -lc; checked against the Perl scripts' own
output (tests/data/paper_bleu, scripts/golden/paper_bleu_goldens.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from transformer_nmt.data import moses
from transformer_nmt.evaluate.bleu import (
    PAPER_LABELS,
    multi_bleu_line,
    paper_bleu,
    paper_tokenize,
    score_all,
)

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "paper_bleu"


def _steps() -> dict:
    return json.loads((GOLDEN / "handmade.json").read_text(encoding="utf-8"))["steps"]


def test_lowercase_equals_lowercase_perl():
    """Perl's lc, one character at a time: capitals beyond ASCII, a capital sharp s, a
    dotted capital I, and a final capital sigma that stays a medial sigma."""
    steps = _steps()
    ours = [moses.lowercase(line) for line in steps["lines"]]
    diff = [(i, o, p) for i, (o, p) in enumerate(zip(ours, steps["lowercase"])) if o != p]
    assert len(ours) == len(steps["lowercase"]) and not diff
    assert "\u03c3\u03bf\u03c3" in ours[
        steps["lines"].index("\u039f\u0394\u039f\u03a3 \u03a3\u039f\u03a3")]


@pytest.mark.parametrize("lang", ["de", "fr", "en", "cs"])
def test_normalize_punctuation_equals_the_perl_script(lang):
    """Every rule of normalize-punctuation.perl (59bad94) with the language's branch: quotes
    after or before commas and full stops, digits around a no-break space, French quotes."""
    steps = _steps()
    perl = steps["normalize_punctuation"][lang]
    ours = [moses.normalize_punctuation(line, lang) for line in steps["lines"]]
    diff = [(i, o, p) for i, (o, p) in enumerate(zip(ours, perl)) if o != p]
    assert len(ours) == len(perl) and not diff, f"(line, ours, perl): {diff}"


def test_the_languages_branches_differ():
    """The goldens tell the branches apart, so a rule applied to the wrong language fails."""
    norm = _steps()["normalize_punctuation"]
    assert norm["de"] != norm["en"] != norm["cs"]
    assert moses.normalize_punctuation("10\u00a0000", "de") == "10,000"
    assert moses.normalize_punctuation("10\u00a0000", "en") == "10.000"
    assert moses.normalize_punctuation('Er sagte "gut."', "de") == 'Er sagte "gut".'
    assert moses.normalize_punctuation('He said "good".', "en") == 'He said "good."'


def test_mmt_form_is_lowercased_normalized_and_labelled():
    """Case, typographic quotes and dashes do not count; the label and signature say how it
    was computed; sacreBLEU's signature is that of multi-bleu.perl -lc."""
    hyp = ["Ein Mann sagt \u201eHallo\u201c \u2013 und geht."]
    ref = ['ein mann sagt "hallo" - und geht .']
    result = paper_bleu(hyp, ref, "de", "mmt")
    assert result["score"] == pytest.approx(100.0)
    assert result["label"] == PAPER_LABELS["mmt"] and result["form"] == "mmt"
    sig = result["signature"]
    assert "recipe:moses-multi-bleu-lc|form:mmt|hyp:lc+norm-punct-de+tok-de|" in sig
    assert "case:lc" in sig and "tok:none" in sig and "smooth:none" in sig
    assert paper_bleu(hyp, ref, "de", "moses")["score"] < 50  # case-sensitive, no normalization
    assert paper_bleu(hyp, ref, "fr", "mmt")["form"] == "mmt"  # any target language


def test_score_all_records_the_mmt_form_for_every_language():
    for lang in ("de", "fr", "en", "cs"):
        scores = score_all(["A dog runs."], ["A dog runs fast."], lang)
        assert scores["paper_bleu:mmt"]["form"] == "mmt"
        assert list(scores)[-2:] == ["paper_bleu:mmt", "chrf"]


def test_mmt_reference_length_is_the_published_one(multi30k_mirror):
    """Wu et al. (2021) report reflen=12103 for test2016 EN-DE (README-baseline.md of
    LividWo/Revisit-MMT): our mmt tokenization of the official reference has that many tokens,
    as the Perl pipeline's (tests/data/paper_bleu/multi30k.json)."""
    path = multi30k_mirror / "test_2016_flickr.de.gz"
    refs = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]
    result = paper_bleu(refs, refs, "de", "mmt")
    assert result["ref_len"] == 12103 and result["score"] == pytest.approx(100.0)
    golden = json.loads((GOLDEN / "multi30k.json").read_text(encoding="utf-8"))
    assert "ref_len=12103)" in golden["sets"]["test_2016_flickr"]["de"]["forms"]["mmt"]["bleu"]


@pytest.mark.parametrize("lang", ["de", "fr", "en"])
def test_detokenized_output_scores_as_the_tokenized_output(multi30k_mirror, lang):
    """A model trained with data.lowercase and data.pretokenize=moses writes lowercased Moses
    tokens, which translation detokenizes; the mmt form tokenizes them again. On the test
    references, as the model would write them, that round trip gives back every token: the
    mmt score of the detokenized output is the score of the tokens."""
    refs = []
    for name in ("test_2016_flickr", "test_2017_flickr"):
        path = multi30k_mirror / f"{name}.{lang}.gz"
        refs += gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]
    tokens = moses.preprocess(refs, lang, lower=True, moses=True)
    text = moses.detokenize(tokens, lang)
    assert text != tokens  # detokenized: "hund ." -> "hund."
    again, ref_tok = paper_tokenize(text, refs, lang, "mmt")
    assert ref_tok == tokens
    assert again == tokens
    assert paper_bleu(text, refs, lang, "mmt")["score"] == pytest.approx(100.0)


def test_mmt_golden_lines_match_on_handmade_text():
    """The mmt form on the hand-made lines of every language: same lines, same multi-bleu line
    as the Perl pipeline (also covered form by form in test_evaluate_bleu.py)."""
    data = json.loads((GOLDEN / "handmade.json").read_text(encoding="utf-8"))
    for lang, forms in data["forms"].items():
        golden, inputs = forms["mmt"], data["inputs"][lang]
        hyp_tok, ref_tok = paper_tokenize(inputs["hyp"], inputs["ref"], lang, "mmt")
        assert hyp_tok == golden["hyp_tok"] and ref_tok == golden["ref_tok"]
        assert multi_bleu_line(
            paper_bleu(inputs["hyp"], inputs["ref"], lang, "mmt")) == golden["bleu"]


def test_nmt_table_shows_the_mmt_form_in_its_own_column(tmp_path):
    """A results.json with ``paper_bleu:mmt`` (as nmt-evaluate writes it): nmt-table puts the
    score under the column named for the form, and lists its label and signature."""
    from transformer_nmt.config import compose
    from transformer_nmt.evaluate.report import write_report

    hyps = ["Ein Hund läuft schnell über die grüne Wiese."]
    refs = ["ein Hund läuft schnell über die grüne Wiese ."]  # mmt: 100, paper BLEU: less
    scores = score_all(hyps, refs, "de")
    result = {
        "experiment": "wu", "steps": 8000, "num_checkpoints_averaged": 10,
        "data": {"name": "multi30k_en_de_wu2021", "corpus": "multi30k", "src_lang": "en",
                 "tgt_lang": "de", "max_train_pairs": None},
        "model": {"name": "tiny_wu2021", "params": 2_605_056, "config": None},
        "test_sets": {"test_2016_flickr": {
            "bleu": {k: v for k, v in scores.items() if k != "chrf"}, "chrf": scores["chrf"]}},
    }
    path = tmp_path / "runs" / "wu" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result), encoding="utf-8")
    cfg = compose([f"table.results_glob={tmp_path}/runs/*/results.json",
                   f"table.output={tmp_path}/results.md"])
    text = write_report(cfg).read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if "| Multi30k BLEU (mmt) |" in line)
    row = next(line for line in text.splitlines() if line.startswith("| wu |"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["Multi30k BLEU (mmt)"] == f"{scores['paper_bleu:mmt']['score']:.2f}"
    assert cells["sacreBLEU"] == f"{scores['sacrebleu']['score']:.2f}"
    assert cells["Multi30k BLEU (mmt)"] != cells["paper BLEU"]
    assert f"- {PAPER_LABELS['mmt']}: `{scores['paper_bleu:mmt']['signature']}`" in text
