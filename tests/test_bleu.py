"""sacreBLEU, chrF and the paper's tokenized (multi-bleu) BLEU."""

from __future__ import annotations

import math

import pytest

from transformer_nmt.bleu import (
    CHRF_LABEL,
    SACREBLEU_LABEL,
    TOKENIZED_LABEL,
    TOKENIZED_SPLIT_LABEL,
    format_score,
    moses_tokenize,
    multi_bleu,
    score_all,
    split_compounds,
    tokenized_bleu,
)

# Detokenized fixture; the Moses tokenizer only detaches the final full stops.
HYPS = ["the cat sat on the mat.", "a dog runs.", "the the the."]
REFS = ["the cat is on the mat.", "a dog runs fast.", "the cat sat."]


def expected_multi_bleu() -> float:
    """multi-bleu.perl's formula applied to n-gram counts written out by hand.

    Tokenized: "the cat sat on the mat ." / "the cat is on the mat ."
               "a dog runs ." / "a dog runs fast ."
               "the the the ." / "the cat sat ."
    clipped matches / hypothesis n-grams, per sentence:
      1-grams: 6/7 (the x2, cat, on, mat, .), 4/4, 2/4 ("the" clipped to 1, ".") -> 12/15
      2-grams: 4/6 (the cat, on the, the mat, mat .), 2/3 (a dog, dog runs), 0/3 -> 6/12
      3-grams: 2/5 (on the mat, the mat .), 1/2 (a dog runs), 0/2             -> 3/9
      4-grams: 1/4 (on the mat .), 0/1, 0/1                                     -> 1/6
    lengths: hypothesis c = 7 + 4 + 4 = 15, reference r = 7 + 5 + 4 = 16 -> BP = exp(1 - 16/15)
    """
    precisions = [12 / 15, 6 / 12, 3 / 9, 1 / 6]
    bp = math.exp(1 - 16 / 15)
    return 100 * bp * math.exp(sum(math.log(p) for p in precisions) / 4)


def test_tokenized_bleu_matches_hand_counts():
    result = tokenized_bleu(HYPS, REFS, lang="en")
    assert result["score"] == pytest.approx(expected_multi_bleu(), abs=1e-9)
    assert result["precisions"] == pytest.approx([100 * 12 / 15, 50.0, 100 / 3, 100 / 6])
    assert (result["sys_len"], result["ref_len"]) == (15, 16)
    assert result["bp"] == pytest.approx(math.exp(1 - 16 / 15))
    assert result["label"] == TOKENIZED_LABEL  # English target: no compound splitting


def test_multi_bleu_has_no_smoothing_and_is_case_sensitive():
    # No 4-gram matches at all: multi-bleu.perl gives 0 (log of a zero precision).
    assert multi_bleu(["a b c d"], ["a b c e"])["score"] == 0.0
    assert multi_bleu(["a b c d"], ["a b c d"])["score"] == pytest.approx(100.0)
    cased = multi_bleu(["The cat sat down"], ["the cat sat down"])
    assert cased["precisions"][0] == pytest.approx(75.0)


def test_compound_splitting():
    # Perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: non-overlapping, left to right.
    assert split_compounds("well-known c-d-e x - y") == (
        "well ##AT##-##AT## known c ##AT##-##AT## d-e x - y"
    )
    assert moses_tokenize(["Ein 3-stöckiges Haus."], "de", compound_split=True) == [
        "Ein 3 ##AT##-##AT## stöckiges Haus ."
    ]
    assert moses_tokenize(["Ein 3-stöckiges Haus."], "de") == ["Ein 3-stöckiges Haus ."]
    # The split pieces earn n-gram credit: the hypothesis shares "Haus" with the reference.
    de = tokenized_bleu(["Das Bau-Haus ist alt."], ["Das Haus ist alt."], lang="de")
    assert de["compound_split"] and de["label"] == TOKENIZED_SPLIT_LABEL
    assert "compound-split:yes" in de["signature"]
    assert de["sys_len"] == 7  # Das Bau ##AT##-##AT## Haus ist alt .
    assert de["precisions"][0] == pytest.approx(100 * 5 / 7)  # all but Bau and ##AT##-##AT##
    unsplit = tokenized_bleu(["Das Bau-Haus ist alt."], ["Das Haus ist alt."], lang="de",
                             compound_split=False)
    assert unsplit["sys_len"] == 5  # Das Bau-Haus ist alt .
    assert unsplit["precisions"][0] == pytest.approx(80.0)  # all but Bau-Haus
    fr = tokenized_bleu(["Un porte-monnaie."], ["Un porte-monnaie."], lang="fr")
    assert not fr["compound_split"] and fr["label"] == TOKENIZED_LABEL
    assert "compound-split:no" in fr["signature"] and "tok:moses-fr" in fr["signature"]


def test_every_score_is_labelled_with_signature():
    results = score_all(HYPS, REFS, lang="de")
    assert results["sacrebleu"]["label"] == SACREBLEU_LABEL
    assert results["chrf"]["label"] == CHRF_LABEL
    assert results["tokenized_bleu"]["label"] == TOKENIZED_SPLIT_LABEL
    assert "tok:13a" in results["sacrebleu"]["signature"]
    assert "case:mixed" in results["sacrebleu"]["signature"]
    assert "tok:none" in results["tokenized_bleu"]["signature"]
    assert "smooth:none" in results["tokenized_bleu"]["signature"]
    for r in results.values():
        line = format_score(r)
        assert line.startswith(r["label"]) and r["signature"] in line
        assert 0.0 <= r["score"] <= 100.0
    # Identical text scores 100 on every metric.
    perfect = score_all(REFS, REFS, lang="en")
    assert all(r["score"] == pytest.approx(100.0) for r in perfect.values())


def test_line_count_mismatch_raises():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        tokenized_bleu(HYPS[:2], REFS, lang="en")
    with pytest.raises(ValueError, match="hypotheses"):
        score_all(HYPS, REFS[:1], lang="en")
