"""What the Unicode normalisation of the training text (``data.unicode_form``, NFKC by default,
applied to both sides before SentencePiece) costs against the raw references: a system that
outputs each reference exactly as the normalised targets let it, scored by sacreBLEU against
the reference as distributed. docs/wmt14.md quotes these figures."""

from __future__ import annotations

import gzip

import pytest

from transformer_nmt.data.clean import normalize
from transformer_nmt.evaluate.bleu import sacrebleu_score


def _lines(path) -> list[str]:
    text = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")
    return text[:-1] if text[-1] == "" else text


def ceiling(references: list[str], form: str) -> float:
    """sacreBLEU of the references normalised with ``form`` against the raw references."""
    return sacrebleu_score([normalize(r, form) for r in references], references)["score"]


@pytest.mark.parametrize("name", ["test_2016_flickr", "test_2017_flickr"])
@pytest.mark.parametrize("lang", ["de", "fr"])
def test_nfkc_costs_nothing_on_the_multi30k_references(multi30k_mirror, name, lang):
    refs = _lines(multi30k_mirror / f"{name}.{lang}.gz")
    # no line changes beyond the whitespace every form collapses
    assert sum(normalize(r, "NFKC") != normalize(r, "none") for r in refs) == 0
    assert ceiling(refs, "NFKC") == pytest.approx(100.0)
    assert ceiling(refs, "NFC") == pytest.approx(100.0)


def test_nfkc_costs_bleu_where_the_reference_has_compatibility_characters():
    """Lines as newstest references have them ("…", "²", "½", a ligature): NFKC rewrites the
    characters a model trained on NFKC targets could produce, and the raw reference does not
    match; NFC keeps them."""
    refs = ["Die Preise stiegen um 5 % auf 20 m² …",
            "Er trank ½ Liter und ging – dann kam der Finanzminister.",
            "Das Angebot gilt bis 31. März … und nicht länger.",
            "Das Haus hat 120 m² Wohnfläche."]
    assert ceiling(refs, "NFKC") < 90.0
    assert ceiling(refs, "NFC") == pytest.approx(100.0)
