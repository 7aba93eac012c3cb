"""The Ott et al. 2018 form of paper BLEU (fairseq's scripts/compound_split_bleu.sh) equals the
script's own output on the golden lines (tests/data/paper_bleu/ott2018.json), and the Ott
preset's results are scored and labelled in it."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from transformer_nmt.config import compose
from transformer_nmt.evaluate.bleu import (
    GERMAN_QUOTES,
    PAPER_LABELS,
    check_form,
    multi_bleu_line,
    paper_bleu,
    paper_tokenize,
    score_all,
)

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "paper_bleu" / "ott2018.json"
REPO = Path(__file__).resolve().parents[3]


def _golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def _synthetic_hypothesis():
    spec = importlib.util.spec_from_file_location(
        "paper_bleu_goldens", REPO / "scripts" / "golden" / "paper_bleu_goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_hypothesis


def _same_lines(ours: list[str], perl: list[str], side: str) -> None:
    diff = [(i, o, p) for i, (o, p) in enumerate(zip(ours, perl, strict=False)) if o != p]
    assert len(ours) == len(perl) and not diff, f"{side} lines differ (ours, perl): {diff[:5]}"


def test_ott2018_equals_the_script_on_handmade_lines():
    data = _golden()["handmade"]
    inputs, golden = data["inputs"]["de"], data["forms"]["de"]["ott2018"]
    hyp_tok, ref_tok = paper_tokenize(inputs["hyp"], inputs["ref"], "de", "ott2018")
    _same_lines(hyp_tok, golden["hyp_tok"], "hyp")
    _same_lines(ref_tok, golden["ref_tok"], "ref")
    assert multi_bleu_line(paper_bleu(inputs["hyp"], inputs["ref"], "de", "ott2018")) == \
        golden["bleu"]


def test_ott2018_keeps_the_quotes_the_t2t_reference_changes():
    """The forms differ where they should: the reference keeps „ “ (t2t-2017 turns them into
    &quot;), and nothing else of the pipeline differs."""
    inputs = _golden()["handmade"]["inputs"]["de"]
    ott = paper_tokenize(inputs["hyp"], inputs["ref"], "de", "ott2018")
    t2t = paper_tokenize(inputs["hyp"], inputs["ref"], "de", "t2t-2017")
    assert ott[0] == t2t[0]  # the hypotheses alike
    changed = [i for i, (a, b) in enumerate(zip(ott[1], t2t[1], strict=True)) if a != b]
    assert changed
    for i in changed:
        assert "&quot;" in t2t[1][i] and any(q in ott[1][i] for q in GERMAN_QUOTES), i


def test_ott2018_equals_the_script_on_multi30k(multi30k_mirror):
    data = _golden()["multi30k"]
    keep = data["keep"]
    synthetic_hypothesis = _synthetic_hypothesis()
    for name, langs in data["sets"].items():
        entry = langs["de"]
        raw = gzip.decompress((multi30k_mirror / f"{name}.de.gz").read_bytes()).decode("utf-8")
        refs = raw.split("\n")
        refs = refs[:-1] if refs[-1] == "" else refs
        hyps = [synthetic_hypothesis(r, i, "de") for i, r in enumerate(refs)]
        golden = entry["forms"]["ott2018"]
        hyp_tok, ref_tok = paper_tokenize(hyps, refs, "de", "ott2018")

        def digest(lines):
            return hashlib.sha256(
                "".join(f"{x}\n" for x in lines).encode("utf-8")).hexdigest()

        assert digest(hyp_tok) == golden["hyp_sha256"], name
        assert digest(ref_tok) == golden["ref_sha256"], name
        assert hyp_tok[:keep] == golden["hyp_tok_head"] and ref_tok[:keep] == golden["ref_tok_head"]
        assert multi_bleu_line(paper_bleu(hyps, refs, "de", "ott2018")) == golden["bleu"]


def test_ott2018_is_german_only_and_named_in_the_score():
    with pytest.raises(ValueError, match="German targets only"):
        check_form("fr", "ott2018")
    scores = score_all(["Das ist ein Ping-Pong-Spiel ."], ["Das ist ein Ping-Pong-Spiel."], "de",
                       "ott2018")
    assert scores["paper_bleu"]["form"] == "ott2018"
    assert scores["paper_bleu"]["label"] == PAPER_LABELS["ott2018"]
    assert "form:ott2018" in scores["paper_bleu"]["signature"]
    assert scores["paper_bleu:t2t-2017"]["form"] == "t2t-2017"  # the others beside it


def test_the_ott_preset_is_scored_their_way_with_their_adam():
    ott = compose(["experiment=wmt14_en_de_big_ott2018"])
    big = compose(["experiment=wmt14_en_de_big"])
    assert str(ott.decode.paper_bleu_form) == "ott2018"
    assert big.decode.paper_bleu_form is None  # the paper's presets keep the default form
    assert ott.trainer.adam_eps == pytest.approx(1e-8)
    assert ott.trainer.num_workers == big.trainer.num_workers > 0
