"""BLEU the modern way (sacreBLEU) and the way the paper computed it (tokenized BLEU).

Two different numbers, never to be mixed up; every result carries its ``label`` and
``signature``:

* **sacreBLEU** (Post 2018), the headline: detokenized hypotheses against the official
  reference text exactly as distributed, sacreBLEU's ``13a`` tokenizer, mixed case.
  :func:`read_text_lines` reads a file the way the ``sacrebleu`` command line does, so the
  number equals ``sacrebleu REF -i HYP`` on the same two files. chrF (Popović 2015) is
  reported beside it.
* **paper BLEU** (the paper's Table 2, section 6.1), :func:`paper_bleu`:

  - EN-DE follows tensor2tensor's ``get_ende_bleu.sh``: the hypothesis goes through Moses
    ``replace-unicode-punctuation.perl`` then ``tokenizer.perl -l de`` (HTML escaping on, no
    ``-a``); the reference is the pre-tokenized newstest file in which every German double
    quote (``„ “ ” « »``) was first turned into ``"`` (which the tokenizer escapes to
    ``&quot;``); both sides get the ``##AT##`` compound split
    (``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``); ``multi-bleu.perl`` scores them.
    ``replace-unicode-punctuation.perl`` leaves ``„`` alone (it only maps ``“ ”``), so a
    German opening quote in the hypothesis never matches the reference's ``&quot;``: the
    recipe's asymmetry, kept on purpose.
  - Every other target language (EN-FR): ``tokenizer.perl -l <lang>`` on both sides and
    ``multi-bleu.perl``, no compound split.

  ``multi-bleu.perl`` is case-sensitive over whitespace-separated tokens, unsmoothed (an
  n-gram order with zero matches gives BLEU 0), brevity penalty exp(1 - r/c) when c < r;
  ``sacrebleu`` with ``tokenize='none'``, ``smooth_method='none'``, ``force=True`` computes
  exactly that on pre-tokenized text (tests/test_evaluate_bleu.py checks it against hand counts).
  The Moses scripts are reproduced with ``sacremoses`` (its punctuation table corrected
  where the Perl script differs, see :func:`replace_unicode_punctuation`).

:func:`tokenized_bleu` (both sides Moses-tokenized the same way) is kept for comparisons
with tools that score that way; it is not the paper's number. Scores are on the 0-100 scale.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

SACREBLEU_LABEL = "sacreBLEU (detokenized, 13a, mixed case)"
CHRF_LABEL = "chrF (detokenized, sacreBLEU)"
TOKENIZED_LABEL = "tokenized BLEU (Moses tokenizer, multi-bleu)"
TOKENIZED_SPLIT_LABEL = "tokenized BLEU (Moses tokenizer, compound-split, multi-bleu)"
PAPER_DE_LABEL = "paper BLEU (t2t get_ende_bleu.sh)"
PAPER_LABEL = "paper BLEU (Moses tokenizer, multi-bleu)"

GERMAN_QUOTES = "\u201e\u201c\u201d\u00ab\u00bb"  # „ “ ” « »
"""Double quotes the tensor2tensor EN-DE reference had turned into ``"`` before tokenizing."""
_GERMAN_QUOTES_TABLE = str.maketrans(dict.fromkeys(GERMAN_QUOTES, '"'))

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# (non-overlapping, left to right, as Perl's s///g: "a-b-c" -> "a ##AT##-##AT## b-c").
_COMPOUND_RE = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """Split hyphenated compounds the tensor2tensor way: ``a-b`` -> ``a ##AT##-##AT## b``."""
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def replace_unicode_punctuation(line: str) -> str:
    """Moses ``replace-unicode-punctuation.perl`` on one line (the ``-l`` flag is ignored there).

    Full-width and CJK punctuation to ASCII (``，`` -> ``,``, ``？`` -> ``?``, ``％`` -> ``%``,
    ``０``-``９`` -> digits ...), ``“ ”`` -> ``"``, ``’`` -> ``'``, ``…`` -> ``...``;
    ``„``, ``‘``, ``«`` and ``»`` are left alone. sacremoses' table, with the Perl script's
    behaviour where they differ: ``１`` becomes ``"`` (a long-standing line of the script),
    and ``。``/``．`` absorb following spaces only (``" *"``), not any whitespace.
    """
    return _punct_normalizer().replace_unicode_punct(line)


# Where sacremoses' table differs from replace-unicode-punctuation.perl (pattern -> Perl's).
_PERL_FULLWIDTH_ONE = ("\uff11", '"')
_PERL_SPACES_ONLY = {"\u3002\\s*": "\u3002 *", "\uff0e\\s*": "\uff0e *"}


@functools.lru_cache(maxsize=1)
def _punct_normalizer():
    from sacremoses import MosesPunctNormalizer

    norm = MosesPunctNormalizer(lang="de")
    table = []
    for pattern, sub in norm.REPLACE_UNICODE_PUNCTUATION:
        if pattern == _PERL_FULLWIDTH_ONE[0]:
            sub = _PERL_FULLWIDTH_ONE[1]
        table.append((_PERL_SPACES_ONLY.get(pattern, pattern), sub))
    norm.REPLACE_UNICODE_PUNCTUATION = table  # this instance only
    return norm


def normalize_german_quotes(line: str) -> str:
    """Every German double quote (``„ “ ” « »``) -> ``"``, as in tensor2tensor's tokenized
    newstest2014 reference (tensor2tensor issue 317)."""
    return line.translate(_GERMAN_QUOTES_TABLE)


def read_text_lines(path) -> list[str]:
    """Lines of a UTF-8 file as the ``sacrebleu`` command line reads ``REF`` and ``-i HYP``:
    split on ``\\n`` only, trailing whitespace stripped (``str.rstrip``), nothing else changed.

    Raises:
        FileNotFoundError: naming the file.
        ValueError: naming the file and line of invalid UTF-8.
    """
    lines = []
    with open(path, encoding="utf-8", newline="\n") as f:
        try:
            for line in f:
                lines.append(line.rstrip())
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}, line {len(lines) + 1}: invalid UTF-8 ({e.reason})") from e
    return lines


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "the translation and the reference file must have the same number of lines"
        )


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """sacreBLEU on detokenized text (13a tokenizer, mixed case, one reference).

    Args:
        hypotheses: detokenized translations, one per line.
        references: the raw reference lines, same count.

    Returns:
        ``{"type": "sacrebleu", "label", "score", "signature", "precisions" (1-4-gram, %),
        "bp", "sys_len", "ref_len"}``.

    Raises:
        ValueError: when the line counts differ.
    """
    _check_lengths(hypotheses, references)
    metric = BLEU(tokenize="13a", lowercase=False)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return _bleu_dict("sacrebleu", SACREBLEU_LABEL, result, str(metric.get_signature()))


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


def moses_tokenize(lines: Sequence[str], lang: str, compound_split: bool = False) -> list[str]:
    """Moses-tokenize lines as ``tokenizer.perl -l <lang>`` does (escaping on, no ``-a``).

    Args:
        lines: detokenized text.
        lang: language code for the tokenizer's rules (``de``, ``fr``, ``en``, ...).
        compound_split: also apply :func:`split_compounds` (EN-DE recipe).

    Returns:
        Tokenized lines, tokens separated by single spaces.
    """
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    out = [tok.tokenize(line, return_str=True, escape=True) for line in lines]
    if compound_split:
        out = [split_compounds(line) for line in out]
    return out


def multi_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """BLEU on already tokenized text, as ``multi-bleu.perl`` (case-sensitive, one reference).

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
    metric = BLEU(tokenize="none", smooth_method="none", lowercase=False, force=True)
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
        ``tok:moses-<lang>|compound-split:<yes|no>|moses:sacremoses-<version>|`` followed by
        sacreBLEU's signature of the ``tokenize='none'`` scoring.

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
        f"moses:sacremoses-{version('sacremoses')}|{result['signature']}"
    )
    result["compound_split"] = compound_split
    return result


def paper_bleu(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> dict[str, Any]:
    """BLEU the way the paper's Table 2 numbers were computed (section 6.1).

    German (``lang='de'``), tensor2tensor's ``get_ende_bleu.sh``:
    hypothesis -> :func:`replace_unicode_punctuation` -> Moses tokenizer (``de``, escaping)
    -> :func:`split_compounds`; reference -> :func:`normalize_german_quotes` -> Moses
    tokenizer (``de``, escaping) -> :func:`split_compounds`; then :func:`multi_bleu`.
    Any other language: the Moses tokenizer of that language on both sides, then
    :func:`multi_bleu` (no punctuation replacement, no compound split).

    Args:
        hypotheses: detokenized translations.
        references: the official reference lines (raw text, see :func:`read_text_lines`).
        lang: target language code.

    Returns:
        ``{"type": "paper_bleu", "label", "score", "signature", "precisions", "bp",
        "sys_len", "ref_len", "recipe"}``; ``label`` is :data:`PAPER_DE_LABEL` or
        :data:`PAPER_LABEL`, the signature names each step and the sacremoses version.

    Raises:
        ValueError: when the line counts differ.
    """
    _check_lengths(hypotheses, references)
    moses = f"sacremoses-{version('sacremoses')}"
    if lang == "de":
        hyp = [replace_unicode_punctuation(h) for h in hypotheses]
        ref = [normalize_german_quotes(r) for r in references]
        hyp_tok = moses_tokenize(hyp, "de", compound_split=True)
        ref_tok = moses_tokenize(ref, "de", compound_split=True)
        label, recipe = PAPER_DE_LABEL, "t2t-get_ende_bleu"
        steps = ("hyp:replace-unicode-punctuation+tok-de+atat|"
                 "ref:german-quotes+tok-de+atat")
    else:
        hyp_tok = moses_tokenize(hypotheses, lang)
        ref_tok = moses_tokenize(references, lang)
        label, recipe = PAPER_LABEL, "moses-multi-bleu"
        steps = f"hyp:tok-{lang}|ref:tok-{lang}"
    result = multi_bleu(hyp_tok, ref_tok)
    result["type"] = "paper_bleu"
    result["label"] = label
    result["recipe"] = recipe
    result["signature"] = f"recipe:{recipe}|{steps}|moses:{moses}|{result['signature']}"
    return result


def score_all(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> dict[str, dict[str, Any]]:
    """sacreBLEU (the headline), the paper's BLEU and chrF of one test set.

    Args:
        hypotheses: detokenized translations.
        references: the official reference lines, unnormalised.
        lang: target language.

    Returns:
        ``{"sacrebleu": ..., "paper_bleu": ..., "chrf": ...}`` (see the functions above).
    """
    return {
        "sacrebleu": sacrebleu_score(hypotheses, references),
        "paper_bleu": paper_bleu(hypotheses, references, lang),
        "chrf": chrf_score(hypotheses, references),
    }


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
