"""sacreBLEU, chrF and the paper's tokenized (multi-bleu) BLEU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from transformer_nmt.evaluate.bleu import (
    CHRF_LABEL,
    PAPER_DE_LABEL,
    PAPER_LABEL,
    SACREBLEU_LABEL,
    TOKENIZED_LABEL,
    TOKENIZED_SPLIT_LABEL,
    format_score,
    moses_tokenize,
    multi_bleu,
    normalize_german_quotes,
    paper_bleu,
    read_text_lines,
    replace_unicode_punctuation,
    sacrebleu_score,
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
    assert results["paper_bleu"]["label"] == PAPER_DE_LABEL
    assert "tok:13a" in results["sacrebleu"]["signature"]
    assert "case:mixed" in results["sacrebleu"]["signature"]
    assert "tok:none" in results["paper_bleu"]["signature"]
    assert "smooth:none" in results["paper_bleu"]["signature"]
    assert "recipe:t2t-get_ende_bleu" in results["paper_bleu"]["signature"]
    assert score_all(HYPS, REFS, lang="fr")["paper_bleu"]["label"] == PAPER_LABEL
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


# ---------------------------------------------------------------- the paper's pipeline, step by step


def test_replace_unicode_punctuation_as_the_perl_script():
    # replace-unicode-punctuation.perl: “ ” -> ", ’ -> ', … -> ..., full-width -> ASCII;
    # the German opening quote „ (and ‘ « ») are not in its table.
    assert replace_unicode_punctuation("„Das ist gut“, sagte er…") == '„Das ist gut", sagte er...'
    assert replace_unicode_punctuation("Er’s ist «so» ‘ja’") == "Er's ist «so» ‘ja'"
    assert replace_unicode_punctuation("２０ ％ （ｘ） ？！") == '20 % (ｘ) ?!'
    # The script maps the full-width one to a quote (sacremoses maps it to 1).
    assert replace_unicode_punctuation("１０") == '"0'
    # 。 and ． take the spaces after them, not a tab.
    assert replace_unicode_punctuation("a。  b．c。\td") == "a. b. c. \td"


def test_german_quotes_become_ascii_quotes_in_the_reference():
    assert normalize_german_quotes("„Ja“, «nein» und ”so” ‚x‘") == '"Ja", "nein" und "so" ‚x‘'


def test_moses_tokenizer_escaping_ellipsis_and_hyphens():
    # tokenizer.perl -l de: special characters split off and HTML-escaped.
    assert moses_tokenize(["A&B | <x> [y] 'z'"], "de") == [
        "A &amp; B &#124; &lt; x &gt; &#91; y &#93; &apos; z &apos;"
    ]
    assert moses_tokenize(['Er sagte: "Gut."'], "de") == ["Er sagte : &quot; Gut . &quot;"]
    assert moses_tokenize(["Warte... dann …"], "de") == ["Warte ... dann …"]
    # Hyphens stay inside tokens (no -a); the ##AT## split then cuts between any two
    # non-space characters: digits and letters alike.
    assert moses_tokenize(["Ein 3-stöckiges Haus, 20-30 Jahre."], "de") == [
        "Ein 3-stöckiges Haus , 20-30 Jahre ."
    ]
    assert moses_tokenize(["Ein 3-stöckiges Haus, 20-30 Jahre."], "de", compound_split=True) == [
        "Ein 3 ##AT##-##AT## stöckiges Haus , 20 ##AT##-##AT## 30 Jahre ."
    ]
    # French: contractions split to the left, no compound split in the paper's EN-FR score.
    assert moses_tokenize(["L'homme dit « oui »... C'est un porte-monnaie."], "fr") == [
        "L&apos; homme dit « oui » ... C&apos; est un porte-monnaie ."
    ]


def test_paper_bleu_german_by_hand():
    """get_ende_bleu.sh on one sentence, n-grams counted by hand.

    hypothesis „Das 3-stöckige Haus“ … sagte er.  -> punct -> tok -> atat:
        „ Das 3 ##AT##-##AT## stöckige Haus &quot; ... sagte er .        (11 tokens)
    reference (same text) -> quotes -> tok -> atat:
        &quot; Das 3 ##AT##-##AT## stöckige Haus &quot; … sagte er .   (11 tokens)
    matches: 1-grams 9/11 (all but „ and ...), 2-grams 7/10, 3-grams 5/9, 4-grams 3/8; BP 1.
    """
    text = "„Das 3-stöckige Haus“ … sagte er."
    result = paper_bleu([text], [text], "de")
    expected = 100 * math.exp((math.log(9 / 11) + math.log(7 / 10) + math.log(5 / 9)
                               + math.log(3 / 8)) / 4)
    assert result["score"] == pytest.approx(expected, abs=1e-9)
    assert (result["sys_len"], result["ref_len"]) == (11, 11)
    assert result["label"] == PAPER_DE_LABEL == "paper BLEU (t2t get_ende_bleu.sh)"
    # ASCII quotes or “ ” in the hypothesis match the reference's &quot;; „ never does.
    ref = "„Das 3-stöckige Haus“, sagte er."
    for hyp in ('"Das 3-stöckige Haus", sagte er.', "“Das 3-stöckige Haus”, sagte er."):
        assert paper_bleu([hyp], [ref], "de")["score"] == pytest.approx(100.0)
    assert paper_bleu([ref], [ref], "de")["precisions"][0] == pytest.approx(100 * 10 / 11)
    # French: tokenizer and multi-bleu only; the ellipsis and « » stay as they are.
    fr = paper_bleu(["« Oui »… dit-il."], ["« Oui »… dit-il."], "fr")
    assert fr["score"] == pytest.approx(100.0) and fr["label"] == PAPER_LABEL
    assert fr["sys_len"] == 6  # « Oui » … dit-il .


OFFICIAL_REF = [
    "Er zahlte 1\u00a0000 Euro \u2026 f\u00fcr die \u201eSuper\u00adsache\u201c.",
    "Im Jahr \uff12\uff10\uff11\uff14 kamen 2\u00b2 G\u00e4ste\u2026",
    "\u201eGut\u201c, sagte sie \u2013 und ging.",
]
HYP = [
    "Er zahlte 1 000 Euro ... für die \"Supersache\".",
    "Im Jahr 2014 kamen 22 Gäste...",
    "„Gut“, sagte sie – und ging.",
]


def test_sacrebleu_equals_the_command_line_on_the_official_bytes(tmp_path):
    """The reference is scored as distributed: NFKC would turn … into ..., NBSP into a space,
    full-width digits into ASCII and drop the soft hyphen, flattering the hypothesis."""
    ref_file, hyp_file = tmp_path / "ref.de", tmp_path / "hyp.de"
    ref_file.write_bytes(("\n".join(OFFICIAL_REF) + "\n").encode("utf-8"))
    hyp_file.write_text("\n".join(HYP) + "\n", encoding="utf-8")
    refs = read_text_lines(ref_file)
    assert refs == OFFICIAL_REF  # byte for byte, nothing normalised
    ours = sacrebleu_score(read_text_lines(hyp_file), refs)
    cli = Path(sys.executable).parent / "sacrebleu"
    proc = subprocess.run([str(cli), str(ref_file), "-i", str(hyp_file), "-f", "json", "-w", "6"],
                          capture_output=True, text=True, check=True)
    printed = json.loads(proc.stdout)
    assert ours["score"] == pytest.approx(float(printed["score"]), abs=1e-6)
    assert ours["signature"] == printed["signature"]
    nfkc = [unicodedata.normalize("NFKC", r).replace("\u00ad", "") for r in OFFICIAL_REF]
    assert sacrebleu_score(HYP, nfkc)["score"] > ours["score"] + 5  # what cleaning would hide
