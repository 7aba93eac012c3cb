"""sacreBLEU, chrF and the paper's tokenized (multi-bleu) BLEU."""

from __future__ import annotations

import gzip
import hashlib
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
    PAPER_LABELS,
    SACREBLEU_LABEL,
    SACREBLEU_LC_LABEL,
    TOKENIZED_LABEL,
    TOKENIZED_SPLIT_LABEL,
    format_score,
    moses_tokenize,
    multi_bleu,
    multi_bleu_line,
    normalize_german_quotes,
    paper_bleu,
    paper_forms,
    paper_tokenize,
    read_text_lines,
    replace_unicode_punctuation,
    sacrebleu_score,
    score_all,
    split_compounds,
    tokenized_bleu,
)

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts" / "golden"))
from paper_bleu_goldens import synthetic_hypothesis

GOLDEN = REPO / "tests" / "data" / "paper_bleu"

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
    assert list(results) == ["sacrebleu", "paper_bleu", "paper_bleu:t2t-2018", "paper_bleu:mmt",
                             "chrf"]
    assert results["sacrebleu"]["label"] == SACREBLEU_LABEL
    assert results["chrf"]["label"] == CHRF_LABEL
    assert results["paper_bleu"]["label"] == PAPER_DE_LABEL == PAPER_LABELS["t2t-2017"]
    assert results["paper_bleu"]["form"] == "t2t-2017"
    assert results["paper_bleu:t2t-2018"]["label"] == PAPER_LABELS["t2t-2018"]
    assert "tok:13a" in results["sacrebleu"]["signature"]
    assert "case:mixed" in results["sacrebleu"]["signature"]
    assert "tok:none" in results["paper_bleu"]["signature"]
    assert "smooth:none" in results["paper_bleu"]["signature"]
    assert "recipe:t2t-get_ende_bleu|form:t2t-2017|hyp:tok-de+atat|" in (
        results["paper_bleu"]["signature"])
    assert "|form:t2t-2018|hyp:replace-unicode-punctuation+tok-de+atat|" in (
        results["paper_bleu:t2t-2018"]["signature"])
    fr = score_all(HYPS, REFS, lang="fr")
    assert list(fr) == ["sacrebleu", "paper_bleu", "paper_bleu:moses-a", "paper_bleu:mmt", "chrf"]
    assert fr["paper_bleu"]["label"] == PAPER_LABEL == PAPER_LABELS["moses"]
    assert "|form:moses-a|hyp:tok-fr-a|ref:tok-fr-a|" in fr["paper_bleu:moses-a"]["signature"]
    for r in results.values():
        line = format_score(r)
        assert line.startswith(r["label"]) and r["signature"] in line
        assert 0.0 <= r["score"] <= 100.0
    # Identical text scores 100 on every metric.
    perfect = score_all(REFS, REFS, lang="en")
    assert all(r["score"] == pytest.approx(100.0) for r in perfect.values())


def test_lowercased_data_gets_a_lowercased_headline_with_the_cased_score_beside_it():
    refs = ["Ein Mann fährt Fahrrad in Berlin.", "Zwei Hunde spielen im Schnee am Fluss."]
    hyps = [r.lower() for r in refs]  # a perfect translation by a model of lowercased data
    cased = score_all(hyps, refs, lang="de")
    assert cased["sacrebleu"]["score"] < 50.0  # scored against the cased reference
    results = score_all(hyps, refs, lang="de", lowercase=True)
    assert list(results)[:2] == ["sacrebleu", "sacrebleu:cased"]
    head, beside = results["sacrebleu"], results["sacrebleu:cased"]
    assert head["score"] == pytest.approx(100.0)
    assert head["label"] == SACREBLEU_LC_LABEL and "|case:lc|" in head["signature"]
    assert beside == cased["sacrebleu"]
    assert beside["label"] == SACREBLEU_LABEL and "|case:mixed|" in beside["signature"]
    # The same number as the command line's -lc.
    assert head == sacrebleu_score(hyps, refs, lowercase=True)


def test_line_count_mismatch_raises():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        tokenized_bleu(HYPS[:2], REFS, lang="en")
    with pytest.raises(ValueError, match="hypotheses"):
        score_all(HYPS, REFS[:1], lang="en")


# --------------------------------------------------------------- the paper's pipeline, step by step


def test_replace_unicode_punctuation_as_the_perl_script():
    # replace-unicode-punctuation.perl: “ ” -> ", ’ -> ', … -> ..., full-width -> ASCII;
    # the German opening quote „ (and ‘ « ») are not in its table.
    assert replace_unicode_punctuation("„Das ist gut“, sagte er…") == '„Das ist gut", sagte er...'
    assert replace_unicode_punctuation("Er’s ist «so» ‘ja’") == "Er's ist «so» ‘ja'"
    assert replace_unicode_punctuation("２０ ％ （ｘ） ？！") == '20 % (ｘ) ?!'
    # The script maps the full-width one to a quote.
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

    hypothesis „Das 3-stöckige Haus“ … sagte er.
      2017 form: tok -> atat:      „ Das 3 ##AT##-##AT## stöckige Haus “ … sagte er .
      2018 form: punct -> tok -> atat:
                                   „ Das 3 ##AT##-##AT## stöckige Haus &quot; ... sagte er .
    reference (same text) -> quotes -> tok -> atat:
                                   &quot; Das 3 ##AT##-##AT## stöckige Haus &quot; … sagte er .
    11 tokens each. 2017: all but „ and “ match, 2018: all but „ and ...; either way
    1-grams 9/11, 2-grams 7/10, 3-grams 5/9, 4-grams 3/8; BP 1.
    """
    text = "„Das 3-stöckige Haus“ … sagte er."
    expected = 100 * math.exp((math.log(9 / 11) + math.log(7 / 10) + math.log(5 / 9)
                               + math.log(3 / 8)) / 4)
    for form in ("t2t-2017", "t2t-2018"):
        result = paper_bleu([text], [text], "de", form=form)
        assert result["score"] == pytest.approx(expected, abs=1e-9)
        assert (result["sys_len"], result["ref_len"]) == (11, 11)
        assert result["label"] == PAPER_LABELS[form] and result["form"] == form
    assert paper_bleu([text], [text], "de") == paper_bleu([text], [text], "de", form="t2t-2017")
    # ASCII quotes match the reference's &quot; in both forms, “ ” only in the 2018 form
    # (which maps them to "), „ never.
    ref = "„Das 3-stöckige Haus“, sagte er."
    ascii_hyp, curly_hyp = '"Das 3-stöckige Haus", sagte er.', "“Das 3-stöckige Haus”, sagte er."
    for form in ("t2t-2017", "t2t-2018"):
        assert paper_bleu([ascii_hyp], [ref], "de", form)["score"] == pytest.approx(100.0)
    assert paper_bleu([curly_hyp], [ref], "de", "t2t-2018")["score"] == pytest.approx(100.0)
    assert paper_bleu([curly_hyp], [ref], "de", "t2t-2017")["precisions"][0] == pytest.approx(
        100 * 9 / 11)
    assert paper_bleu([ref], [ref], "de")["precisions"][0] == pytest.approx(100 * 9 / 11)
    assert paper_bleu([ref], [ref], "de", "t2t-2018")["precisions"][0] == pytest.approx(
        100 * 10 / 11)
    # French: tokenizer and multi-bleu only; the ellipsis and « » stay as they are; -a splits
    # the compound.
    fr = paper_bleu(["« Oui »… dit-il."], ["« Oui »… dit-il."], "fr")
    assert fr["score"] == pytest.approx(100.0) and fr["label"] == PAPER_LABEL
    assert fr["sys_len"] == 6  # « Oui » … dit-il .
    assert paper_tokenize(["« Oui »… dit-il."], ["x"], "fr", "moses-a")[0] == [
        "« Oui » … dit @-@ il ."]


def test_paper_bleu_forms_are_checked():
    assert paper_forms("de") == ("t2t-2017", "t2t-2018")
    assert paper_forms("fr") == paper_forms("en") == ("moses", "moses-a")
    with pytest.raises(ValueError, match="unknown paper BLEU form 't2t'"):
        paper_bleu(HYPS, REFS, "de", form="t2t")
    with pytest.raises(ValueError, match="German targets only"):
        paper_bleu(HYPS, REFS, "fr", form="t2t-2018")
    german_moses = paper_bleu(HYPS, REFS, "de", form="moses-a")
    assert german_moses["label"] == PAPER_LABELS["moses-a"]
    assert "|hyp:tok-de-a|" in german_moses["signature"]


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


# ------------------------------------------- the Perl scripts' own outputs (tests/data/paper_bleu)


def _handmade_cases():
    data = json.loads((GOLDEN / "handmade.json").read_text(encoding="utf-8"))
    return [pytest.param(data["inputs"][lang], lang, form, golden, id=f"{lang}-{form}")
            for lang, forms in data["forms"].items() for form, golden in forms.items()]


@pytest.mark.parametrize(("inputs", "lang", "form", "golden"), _handmade_cases())
def test_paper_bleu_equals_perl_on_handmade_lines(inputs, lang, form, golden):
    """Every quote, dash, apostrophe, ellipsis, compound, escaped and full-width character,
    number format and URL of the hand-made lines: ours tokenizes each line as the Perl
    pipeline of the form did and prints the same multi-bleu.perl line."""
    hyp_tok, ref_tok = paper_tokenize(inputs["hyp"], inputs["ref"], lang, form)
    for side, ours, perl in (("hyp", hyp_tok, golden["hyp_tok"]),
                             ("ref", ref_tok, golden["ref_tok"])):
        diff = [(i, o, p) for i, (o, p) in enumerate(zip(ours, perl)) if o != p]
        assert len(ours) == len(perl) and not diff, f"{side} lines differ (ours, perl): {diff}"
    result = paper_bleu(inputs["hyp"], inputs["ref"], lang, form)
    assert multi_bleu_line(result) == golden["bleu"]
    assert multi_bleu_line(multi_bleu(hyp_tok, ref_tok)) == golden["bleu"]


def test_the_goldens_tell_the_two_t2t_forms_apart():
    """The unicode step changes the hand-made German hypotheses and the BLEU by about 11
    points, so a t2t-2018 without it (or a t2t-2017 with it) fails the test above."""
    forms = json.loads((GOLDEN / "handmade.json").read_text(encoding="utf-8"))["forms"]["de"]
    old, new = forms["t2t-2017"], forms["t2t-2018"]
    assert old["ref_tok"] == new["ref_tok"]
    assert sum(a != b for a, b in zip(old["hyp_tok"], new["hyp_tok"])) == 9
    assert old["bleu"].startswith("BLEU = 46.78,") and new["bleu"].startswith("BLEU = 58.06,")


def test_synthetic_hypothesis_is_the_documented_edit():
    ref = 'Ein Mann mit einem "roten" Hut und ein Kind, das ein Eis-Hörnchen isst.'
    assert synthetic_hypothesis(ref, 1, "de") == (
        "Ein „Mann“ mit einem „roten“ und ein Kind, das ein Eis-Hörnchen isst.")
    assert synthetic_hypothesis("L'homme court vite dans la rue.", 0, "fr") == (
        "L\u2019homme court vite dans la rue.")
    assert synthetic_hypothesis("a b-c d e f g h i j.", 15, "en") == (
        'a "b\u2013c" d e f h i j\u2026')


def _sha256(lines: list[str]) -> str:
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode("utf-8")).hexdigest()


def _multi30k_cases():
    data = json.loads((GOLDEN / "multi30k.json").read_text(encoding="utf-8"))
    return [pytest.param(name, lang, entry, data["keep"], id=f"{name}.{lang}")
            for name, langs in data["sets"].items() for lang, entry in langs.items()]


@pytest.mark.parametrize(("name", "lang", "entry", "keep"), _multi30k_cases())
def test_paper_bleu_equals_perl_on_multi30k(multi30k_mirror, name, lang, entry, keep):
    """A Multi30k test set against the documented synthetic hypotheses, in every form: each
    tokenized file equals the Perl pipeline's (SHA-256 of the whole file, the first ``keep``
    lines word for word) and ours prints multi-bleu.perl's line over all lines and over the
    first ``keep``."""
    path = multi30k_mirror / f"{name}.{lang}.gz"
    refs = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")
    refs = refs[:-1] if refs[-1] == "" else refs
    assert len(refs) == entry["lines"]
    hyps = [synthetic_hypothesis(r, i, lang) for i, r in enumerate(refs)]
    failures = []
    for form, golden in entry["forms"].items():
        hyp_tok, ref_tok = paper_tokenize(hyps, refs, lang, form)
        checks = {
            "hyp head": hyp_tok[:keep] == golden["hyp_tok_head"],
            "ref head": ref_tok[:keep] == golden["ref_tok_head"],
            "hyp sha256": _sha256(hyp_tok) == golden["hyp_sha256"],
            "ref sha256": _sha256(ref_tok) == golden["ref_sha256"],
            "bleu": multi_bleu_line(multi_bleu(hyp_tok, ref_tok)) == golden["bleu"],
            "head bleu": (multi_bleu_line(multi_bleu(hyp_tok[:keep], ref_tok[:keep]))
                          == golden["head_bleu"]),
        }
        failures += [f"{form}: {check}" for check, ok in checks.items() if not ok]
    assert not failures
