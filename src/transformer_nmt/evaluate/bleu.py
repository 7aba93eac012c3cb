"""BLEU the modern way (sacreBLEU) and the way the paper computed it (tokenized BLEU).

Two different numbers, never to be mixed up; every result carries its ``label`` and
``signature``:

* **sacreBLEU** (Post 2018), the headline: detokenized hypotheses against the official
  reference text exactly as distributed, sacreBLEU's ``13a`` tokenizer, mixed case.
  :func:`read_text_lines` reads a file the way the ``sacrebleu`` command line does, so the
  number equals ``sacrebleu REF -i HYP`` on the same two files. chrF (Popović 2015) is
  reported beside it. A model of lowercased data (``data.lowercase``) writes lowercased text,
  which a cased reference scores far below its quality: its headline is sacreBLEU with
  ``lowercase=True`` (``sacrebleu REF -i HYP -lc``, signature ``case:lc``), its mixed-case
  score beside it (``sacrebleu:cased``), each labelled.
* **paper BLEU** (the paper's Table 2, section 6.1), :func:`paper_bleu`, in one of the
  historical forms of :data:`PAPER_LABELS` (docs/paper_bleu.md has the evidence for each):

  - EN-DE follows tensor2tensor's ``get_ende_bleu.sh``. The hypothesis goes through Moses
    ``tokenizer.perl -l de`` (HTML escaping on, no ``-a``); the reference is the tokenized
    newstest file in which every German double quote (``„ “ ” « »``) was first turned into
    ``"`` (which the tokenizer escapes to ``&quot;``); both sides get the ``##AT##`` compound
    split (``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``); ``multi-bleu.perl`` scores
    them. Form ``t2t-2017`` (the default, the script as published on 2017-06-29, after the
    paper) has no other step; form ``t2t-2018`` (the script from 2018-04-05 on, tensor2tensor
    commit fc9335c0 "Add forgotten unicode punctuation normalization") first runs Moses
    ``replace-unicode-punctuation.perl`` on the hypothesis. That script leaves ``„`` alone (it
    only maps ``“ ”``), so a German opening quote in the hypothesis never matches the
    reference's ``&quot;``: the recipe's asymmetry, kept on purpose.
  - Every target language: ``tokenizer.perl -l <lang>`` on both sides and ``multi-bleu.perl``,
    without (form ``moses``, the default for EN-FR) or with ``-a`` (form ``moses-a``,
    aggressive hyphen splitting ``a-b`` -> ``a @-@ b``); no compound split.
  - Form ``mmt``, the BLEU of the Multi30k papers (Elliott et al. 2016; Wu et al. 2021), any
    target language: both sides through ``lowercase.perl``, ``normalize-punctuation.perl -l
    <lang>`` and ``tokenizer.perl -l <lang>`` (no ``-a``), scored by ``multi-bleu.perl -lc``
    (what fairseq's BLEU4 gives on the same tokenized, lowercased files).
  - Ott et al. 2018 (form ``ott2018``, German): fairseq's ``scripts/compound_split_bleu.sh``
    on the output of ``fairseq-generate`` for a model trained on Google's tokenized WMT16
    data: the hypothesis and the reference ``newstest2014.tok.de`` tokenized by
    ``tokenizer.perl -l de`` (no quote change), the ``##AT##`` split on both sides, BLEU as
    ``multi-bleu.perl`` computes it.

  ``multi-bleu.perl`` is case-sensitive over whitespace-separated tokens, unsmoothed (an
  n-gram order with zero matches gives BLEU 0), brevity penalty exp(1 - r/c) when c < r;
  ``sacrebleu`` with ``tokenize='none'``, ``smooth_method='none'``, ``force=True`` computes
  exactly that on pre-tokenized text (tests/unit/evaluate/test_bleu.py checks it against hand
  counts). The Moses scripts are those of mosesdecoder commit 59bad94 (2017-05-29, the last before
  the paper), reproduced with ``sacremoses``, its character classes and tables corrected where
  the Perl scripts differ (:func:`moses_tokenize`, :func:`replace_unicode_punctuation`).
  tests/data/paper_bleu holds what the Perl scripts print for every form on hand-made and
  Multi30k text; ours gives the same tokenized lines and BLEU.

:func:`tokenized_bleu` (both sides Moses-tokenized the same way) is kept for comparisons
with tools that score that way; it is not the paper's number. Scores are on the 0-100 scale.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from transformer_nmt.data import moses
from transformer_nmt.data.moses import MOSES_COMMIT
from transformer_nmt.fileio import iter_lines

SACREBLEU_LABEL = "sacreBLEU (detokenized, 13a, mixed case)"
SACREBLEU_LC_LABEL = ("sacreBLEU (detokenized, 13a, lowercased: the run's data is lowercased, "
                      "so is the reference)")
"""The headline of a run on lowercased data (``data.lowercase``): sacreBLEU with
``lowercase=True`` (signature ``case:lc``); its mixed-case score is ``sacrebleu:cased``."""
CASED_KIND = "sacrebleu:cased"
"""results.json key of a lowercased run's mixed-case sacreBLEU, beside its headline."""
CHRF_LABEL = "chrF (detokenized, sacreBLEU)"
TOKENIZED_LABEL = "tokenized BLEU (Moses tokenizer, multi-bleu)"
TOKENIZED_SPLIT_LABEL = "tokenized BLEU (Moses tokenizer, compound-split, multi-bleu)"

PAPER_LABELS = {
    "t2t-2017": "paper BLEU (t2t get_ende_bleu.sh, 2017 form)",
    "t2t-2018": "paper BLEU (t2t get_ende_bleu.sh, 2018 form: + replace-unicode-punctuation)",
    "moses": "paper BLEU (Moses tokenizer, multi-bleu)",
    "moses-a": "paper BLEU (Moses tokenizer -a, multi-bleu)",
    "mmt": "paper BLEU (Multi30k papers: lowercased, Moses normalize-punctuation + tokenizer, "
           "multi-bleu -lc)",
    "ott2018": "paper BLEU (fairseq compound_split_bleu.sh, Ott et al. 2018)",
}
"""The label of each form of :func:`paper_bleu`."""
PAPER_DE_LABEL = PAPER_LABELS["t2t-2017"]
PAPER_LABEL = PAPER_LABELS["moses"]

T2T_FORMS = ("t2t-2017", "t2t-2018")
MOSES_FORMS = ("moses", "moses-a")
MMT_FORM = "mmt"
"""The Multi30k papers' form: any target language, scored beside the defaults by
:func:`score_all`."""
GERMAN_ONLY_FORMS = (*T2T_FORMS, "ott2018")
"""Forms of EN-DE scripts, German targets only."""


def paper_forms(lang: str) -> tuple[str, ...]:
    """The forms the paper's number may have had for target ``lang``, the default first:
    ``("t2t-2017", "t2t-2018")`` for German, ``("moses", "moses-a")`` otherwise. ``moses``
    and ``moses-a`` are accepted for German too, the ``t2t-*`` forms and ``ott2018`` for
    German only (:data:`MMT_FORM`, the Multi30k papers' form, for any language, is not among
    them)."""
    return T2T_FORMS if lang == "de" else MOSES_FORMS


GERMAN_QUOTES = "\u201e\u201c\u201d\u00ab\u00bb"  # „ “ ” « »
"""Double quotes the tensor2tensor EN-DE reference had turned into ``"`` before tokenizing."""
_GERMAN_QUOTES_TABLE = str.maketrans(dict.fromkeys(GERMAN_QUOTES, '"'))

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# (non-overlapping, left to right, as Perl's s///g: "a-b-c" -> "a ##AT##-##AT## b-c").
_COMPOUND_RE = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """Split hyphenated compounds the tensor2tensor way: ``a-b`` -> ``a ##AT##-##AT## b``."""
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


# replace-unicode-punctuation.perl at mosesdecoder 59bad94 (unchanged from 2015 to 2018-11),
# rule by rule and in its order. The script reads bytes, so " *" takes ASCII spaces only;
# "１" becoming '"' is in the script. sacremoses follows a later, different version.
_UNICODE_PUNCTUATION = tuple((re.compile(pattern), sub) for pattern, sub in (
    ("\uff0c", ","), ("\u3002 *", ". "), ("\u3001", ","), ("\u201d", '"'), ("\u201c", '"'),
    ("\u2236", ":"), ("\uff1a", ":"), ("\uff1f", "?"), ("\u300a", '"'), ("\u300b", '"'),
    ("\uff09", ")"), ("\uff01", "!"), ("\uff08", "("), ("\uff1b", ";"), ("\uff11", '"'),
    ("\u300d", '"'), ("\u300c", '"'), ("\uff10", "0"), ("\uff13", "3"), ("\uff12", "2"),
    ("\uff15", "5"), ("\uff16", "6"), ("\uff19", "9"), ("\uff17", "7"), ("\uff18", "8"),
    ("\uff14", "4"), ("\uff0e *", ". "), ("\uff5e", "~"), ("\u2019", "'"), ("\u2026", "..."),
    ("\u2501", "-"), ("\u3008", "<"), ("\u3009", ">"), ("\u3010", "["), ("\u3011", "]"),
    ("\uff05", "%"),
))


def replace_unicode_punctuation(line: str) -> str:
    """Moses ``replace-unicode-punctuation.perl`` (commit 59bad94) on one line; its ``-l`` flag
    is ignored there.

    Full-width and CJK punctuation to ASCII (``，`` -> ``,``, ``？`` -> ``?``, ``％`` -> ``%``,
    ``０``-``９`` -> digits but ``１`` -> ``"``, ``。``/``．`` and the spaces after them ->
    ``". "``), ``“ ”`` -> ``"``, ``’`` -> ``'``, ``…`` -> ``...``; ``„``, ``‘``, ``«`` and ``»``
    are left alone.
    """
    for pattern, sub in _UNICODE_PUNCTUATION:
        line = pattern.sub(sub, line)
    return line


def normalize_german_quotes(line: str) -> str:
    """Every German double quote (``„ “ ” « »``) -> ``"``, as in tensor2tensor's tokenized
    newstest2014 reference (tensor2tensor issue 317)."""
    return line.translate(_GERMAN_QUOTES_TABLE)


def read_text_lines(path, encoding_errors: str = "strict", hint: str | None = None) -> list[str]:
    """Lines of a UTF-8 file as the ``sacrebleu`` command line reads ``REF`` and ``-i HYP``:
    split on ``\\n`` only, trailing whitespace stripped (``str.rstrip``), nothing else changed.

    Each line is decoded on its own (:func:`transformer_nmt.fileio.iter_lines`), so invalid
    UTF-8 is named by the line that holds it. ``encoding_errors="replace"`` substitutes U+FFFD
    for each bad byte instead (the first such line is logged as a warning); ``hint`` ends the
    error message (how to get past it).

    Raises:
        FileNotFoundError: naming the file.
        DataError (a ValueError): naming the file, the 1-based line and the bytes of invalid
            UTF-8 (under ``strict``), or a UTF-16 file.
    """
    with open(path, "rb") as f:
        return [line.rstrip() for line in iter_lines(f, str(path), encoding_errors, hint=hint)]


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "the translation and the reference file must have the same number of lines"
        )


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str],
                    lowercase: bool = False) -> dict[str, Any]:
    """sacreBLEU on detokenized text (13a tokenizer, mixed case, one reference).

    Args:
        hypotheses: detokenized translations, one per line.
        references: the raw reference lines, same count.
        lowercase: both sides lowercased (sacreBLEU's ``lowercase=True``, signature
            ``case:lc``, label :data:`SACREBLEU_LC_LABEL`), for a model of lowercased data.

    Returns:
        ``{"type": "sacrebleu", "label", "score", "signature", "precisions" (1-4-gram, %),
        "bp", "sys_len", "ref_len"}``.

    Raises:
        ValueError: when the line counts differ.
    """
    _check_lengths(hypotheses, references)
    metric = BLEU(tokenize="13a", lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return _bleu_dict("sacrebleu", SACREBLEU_LC_LABEL if lowercase else SACREBLEU_LABEL, result,
                      str(metric.get_signature()))


def chrf_score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """chrF (character 6-grams, beta 2, sacreBLEU's defaults) on detokenized text.

    Returns:
        ``{"type": "chrf", "label", "score", "signature"}``.

    Raises:
        ValueError: when the line counts differ.
    """
    _check_lengths(hypotheses, references)
    metric = CHRF()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "type": "chrf",
        "label": CHRF_LABEL,
        "score": float(result.score),
        "signature": str(metric.get_signature()),
    }


def moses_tokenize(
    lines: Sequence[str], lang: str, compound_split: bool = False, aggressive: bool = False
) -> list[str]:
    """Moses-tokenize lines exactly as ``tokenizer.perl -l <lang>`` of mosesdecoder 59bad94
    (escaping on; ``-a`` when ``aggressive``): :func:`transformer_nmt.data.moses.tokenize`,
    then :func:`split_compounds` when ``compound_split`` (EN-DE recipe).

    Returns:
        Tokenized lines, tokens separated by single spaces.
    """
    out = moses.tokenize(lines, lang, aggressive=aggressive)
    if compound_split:
        out = [split_compounds(line) for line in out]
    return out


def multi_bleu_line(result: dict[str, Any]) -> str:
    """The line ``multi-bleu.perl`` prints for a result of :func:`multi_bleu` (or any function
    built on it): ``BLEU = 27.31, 60.1/33.2/20.0/12.3 (BP=1.000, ratio=1.010, hyp_len=...,
    ref_len=...)``."""
    p1, p2, p3, p4 = result["precisions"]
    ratio = result["sys_len"] / result["ref_len"]
    return (f"BLEU = {result['score']:.2f}, {p1:.1f}/{p2:.1f}/{p3:.1f}/{p4:.1f} "
            f"(BP={result['bp']:.3f}, ratio={ratio:.3f}, hyp_len={result['sys_len']}, "
            f"ref_len={result['ref_len']})")


def _moses_version() -> str:
    return f"{MOSES_COMMIT}+sacremoses-{version('sacremoses')}"


def multi_bleu(
    hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False
) -> dict[str, Any]:
    """BLEU on already tokenized text, as ``multi-bleu.perl`` (case-sensitive, one reference;
    ``multi-bleu.perl -lc`` when ``lowercase``).

    Modified n-gram precisions p_1..p_4 over the corpus, geometric mean with equal weights,
    no smoothing (0 when some p_n is 0), brevity penalty exp(1 - r/c) if c < r else 1, with
    c and r the hypothesis and reference token counts.

    Returns:
        ``{"type": "multi_bleu", "label", "score", "signature", "precisions", "bp",
        "sys_len", "ref_len"}``.

    Raises:
        ValueError: when the line counts differ.
    """
    _check_lengths(hypotheses, references)
    metric = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase, force=True)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return _bleu_dict(
        "multi_bleu", "BLEU (pre-tokenized, multi-bleu)", result, str(metric.get_signature())
    )


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    lang: str,
    compound_split: bool | None = None,
) -> dict[str, Any]:
    """The paper's tokenized BLEU (section 6.1, Table 2).

    Args:
        hypotheses: detokenized translations.
        references: raw reference lines.
        lang: target language (Moses rules).
        compound_split: split hyphenated compounds; None = only for German (the
            tensor2tensor EN-DE recipe; EN-FR is scored without it).

    Returns:
        ``{"type": "tokenized_bleu", "label", "score", "signature", "precisions", "bp",
        "sys_len", "ref_len", "compound_split"}``; the signature is
        ``tok:moses-<lang>|compound-split:<yes|no>|moses:59bad94+sacremoses-<version>|``
        followed by sacreBLEU's signature of the ``tokenize='none'`` scoring.

    Raises:
        ValueError: when the line counts differ.
    """
    if compound_split is None:
        compound_split = lang == "de"
    _check_lengths(hypotheses, references)
    hyp_tok = moses_tokenize(hypotheses, lang, compound_split)
    ref_tok = moses_tokenize(references, lang, compound_split)
    result = multi_bleu(hyp_tok, ref_tok)
    result["type"] = "tokenized_bleu"
    result["label"] = TOKENIZED_SPLIT_LABEL if compound_split else TOKENIZED_LABEL
    result["signature"] = (
        f"tok:moses-{lang}|compound-split:{'yes' if compound_split else 'no'}|"
        f"moses:{_moses_version()}|{result['signature']}"
    )
    result["compound_split"] = compound_split
    return result


def _check_form(lang: str, form: str | None) -> str:
    if form is None:
        return paper_forms(lang)[0]
    if form not in PAPER_LABELS:
        raise ValueError(f"unknown paper BLEU form {form!r}; one of {', '.join(PAPER_LABELS)}")
    if form == MMT_FORM:
        return form
    if form in GERMAN_ONLY_FORMS and lang != "de":
        raise ValueError(f"form {form!r} is an EN-DE script's: German targets only, "
                         f"not {lang!r} (use one of {', '.join(MOSES_FORMS)})")
    return form


def check_form(lang: str, form: str | None) -> str:
    """``form`` for target ``lang``; None gives the default of ``lang``.

    Raises:
        ValueError: an unknown form, or a German-only form for another target (named).
    """
    return _check_form(lang, form)


def paper_tokenize(
    hypotheses: Sequence[str], references: Sequence[str], lang: str, form: str | None = None
) -> tuple[list[str], list[str]]:
    """Both sides as the paper's pipeline of ``form`` hands them to ``multi-bleu.perl``.

    ``t2t-2017``: hypothesis -> Moses tokenizer (``de``, escaping) -> :func:`split_compounds`;
    ``t2t-2018``: the same after :func:`replace_unicode_punctuation`; both: reference ->
    :func:`normalize_german_quotes` -> Moses tokenizer (``de``) -> :func:`split_compounds`.
    ``moses`` / ``moses-a``: the Moses tokenizer of ``lang`` (``-a`` for ``moses-a``) on both
    sides, nothing else. ``mmt``: Moses ``lowercase.perl``, ``normalize-punctuation.perl -l
    <lang>`` and ``tokenizer.perl -l <lang>`` on both sides
    (:func:`transformer_nmt.data.moses.preprocess`). ``ott2018``: Moses tokenizer (``de``) ->
    :func:`split_compounds` on both sides (fairseq's ``compound_split_bleu.sh``; no quote change
    of the reference).

    Args:
        hypotheses: detokenized translations.
        references: the official reference lines.
        lang: target language code.
        form: one of :data:`PAPER_LABELS`' keys; None = ``paper_forms(lang)[0]``.

    Returns:
        ``(hypothesis lines, reference lines)``, tokenized.

    Raises:
        ValueError: for an unknown form, a ``t2t-*`` form with a non-German target, or line
            counts that differ.
    """
    form = _check_form(lang, form)
    _check_lengths(hypotheses, references)
    if form == MMT_FORM:
        return (moses.preprocess(hypotheses, lang, lower=True, moses=True),
                moses.preprocess(references, lang, lower=True, moses=True))
    if form in T2T_FORMS:
        hyp = list(hypotheses)
        if form == "t2t-2018":
            hyp = [replace_unicode_punctuation(h) for h in hyp]
        ref = [normalize_german_quotes(r) for r in references]
        return (moses_tokenize(hyp, "de", compound_split=True),
                moses_tokenize(ref, "de", compound_split=True))
    if form == "ott2018":
        return (moses_tokenize(hypotheses, "de", compound_split=True),
                moses_tokenize(references, "de", compound_split=True))
    aggressive = form == "moses-a"
    return (moses_tokenize(hypotheses, lang, aggressive=aggressive),
            moses_tokenize(references, lang, aggressive=aggressive))


def paper_bleu(
    hypotheses: Sequence[str], references: Sequence[str], lang: str, form: str | None = None
) -> dict[str, Any]:
    """BLEU the way the paper's Table 2 numbers were computed (section 6.1), in one form.

    The forms (:func:`paper_tokenize` has the steps, docs/paper_bleu.md the evidence):
    ``t2t-2017`` (German default: tensor2tensor's ``get_ende_bleu.sh`` as first published,
    2017-06-29 to 2018-04-05), ``t2t-2018`` (the same script from 2018-04-05 on:
    ``replace-unicode-punctuation.perl`` on the hypothesis first), ``moses`` (default for any
    other language: ``tokenizer.perl`` and ``multi-bleu.perl``), ``moses-a`` (the tokenizer
    with ``-a``), ``mmt`` (the Multi30k papers': lowercased, ``normalize-punctuation.perl``,
    ``tokenizer.perl``, ``multi-bleu.perl -lc``) and ``ott2018`` (German: fairseq's
    ``compound_split_bleu.sh``, Ott et al. 2018). Each form's tokenized lines and BLEU equal the
    Perl scripts' (tests/data/paper_bleu).

    Args:
        hypotheses: detokenized translations.
        references: the official reference lines (raw text, see :func:`read_text_lines`).
        lang: target language code.
        form: the form; None = the default of ``lang`` (``paper_forms(lang)[0]``).

    Returns:
        ``{"type": "paper_bleu", "label", "score", "signature", "precisions", "bp",
        "sys_len", "ref_len", "recipe", "form"}``; ``label`` is ``PAPER_LABELS[form]``, the
        signature names the form, each step and the Moses scripts' commit.

    Raises:
        ValueError: for an unknown form, a ``t2t-*`` form with a non-German target, or line
            counts that differ.
    """
    form = _check_form(lang, form)
    hyp_tok, ref_tok = paper_tokenize(hypotheses, references, lang, form)
    if form == MMT_FORM:
        recipe = "moses-multi-bleu-lc"
        steps = f"hyp:lc+norm-punct-{lang}+tok-{lang}|ref:lc+norm-punct-{lang}+tok-{lang}"
    elif form in T2T_FORMS:
        recipe = "t2t-get_ende_bleu"
        punct = "replace-unicode-punctuation+" if form == "t2t-2018" else ""
        steps = f"hyp:{punct}tok-de+atat|ref:german-quotes+tok-de+atat"
    elif form == "ott2018":
        recipe = "fairseq-compound_split_bleu"
        steps = "hyp:tok-de+atat|ref:tok-de+atat"
    else:
        recipe = "moses-multi-bleu"
        flag = "-a" if form == "moses-a" else ""
        steps = f"hyp:tok-{lang}{flag}|ref:tok-{lang}{flag}"
    result = multi_bleu(hyp_tok, ref_tok, lowercase=form == MMT_FORM)
    result["type"] = "paper_bleu"
    result["label"] = PAPER_LABELS[form]
    result["recipe"] = recipe
    result["form"] = form
    result["signature"] = (f"recipe:{recipe}|form:{form}|{steps}|moses:{_moses_version()}|"
                           f"{result['signature']}")
    return result


def score_all(
    hypotheses: Sequence[str], references: Sequence[str], lang: str, form: str | None = None,
    lowercase: bool = False,
) -> dict[str, dict[str, Any]]:
    """sacreBLEU (the headline), the paper's BLEU in every form, the Multi30k papers' BLEU
    (form ``mmt``) and chrF of one test set.

    Args:
        hypotheses: detokenized translations.
        references: the official reference lines, unnormalised.
        lang: target language.
        form: the form under ``paper_bleu`` (an experiment scored another paper's way, e.g.
            ``ott2018``); None = the default of ``lang``. The forms of :func:`paper_forms`
            are then beside it.
        lowercase: the run's data is lowercased (``data.lowercase``): the headline
            ``sacrebleu`` is then scored lowercased (``case:lc``), and its mixed-case score
            against the cased reference goes beside it as ``sacrebleu:cased``
            (:data:`CASED_KIND`), so that neither is read for the other.

    Returns:
        ``{"sacrebleu": ..., "paper_bleu": ..., "paper_bleu:<form>": ..., "chrf": ...}``:
        ``paper_bleu`` in the default form of ``lang``, then one ``paper_bleu:<form>`` per
        other form of :func:`paper_forms` (``paper_bleu:t2t-2018`` for German,
        ``paper_bleu:moses-a`` otherwise) and ``paper_bleu:mmt``, to be listed beside it.
    """
    default = check_form(lang, form)
    others = [f for f in paper_forms(lang) if f != default]
    scores = {"sacrebleu": sacrebleu_score(hypotheses, references, lowercase)}
    if lowercase:
        scores[CASED_KIND] = sacrebleu_score(hypotheses, references)
    scores["paper_bleu"] = paper_bleu(hypotheses, references, lang, default)
    for other in (*others, MMT_FORM):
        if other != default:
            scores[f"paper_bleu:{other}"] = paper_bleu(hypotheses, references, lang, other)
    scores["chrf"] = chrf_score(hypotheses, references)
    return scores


def format_score(result: dict[str, Any]) -> str:
    """One printable line: ``<label>: <score>  (<signature>)``."""
    return f"{result['label']}: {result['score']:.2f}  ({result['signature']})"


def _bleu_dict(kind: str, label: str, result: Any, signature: str) -> dict[str, Any]:
    return {
        "type": kind,
        "label": label,
        "score": float(result.score),
        "signature": signature,
        "precisions": [float(p) for p in result.precisions],
        "bp": float(result.bp),
        "sys_len": int(result.sys_len),
        "ref_len": int(result.ref_len),
    }
