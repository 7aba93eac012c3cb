"""BLEU the modern way (sacreBLEU) and the way the paper reported it (tokenized BLEU).

Two different numbers, never to be mixed up; every result carries its ``label`` and
``signature``:

* **sacreBLEU** (Post 2018): detokenized hypotheses against the raw references, sacreBLEU's
  ``13a`` tokenizer, mixed case, exponential smoothing off for corpus BLEU as sacreBLEU
  defaults. Comparable across papers. chrF (Popović 2015) is reported beside it.
* **tokenized BLEU** (the paper's Table 2, section 6.1): hypothesis and reference are
  Moses-tokenized (``sacremoses``, the target language's rules, with ``tokenizer.perl``'s
  default HTML escaping) and, for EN-DE, hyphenated compounds are split as in the
  tensor2tensor recipe (``a-b`` -> ``a ##AT##-##AT## b``); the result is scored like
  ``multi-bleu.perl``: case-sensitive, whitespace-separated tokens, no smoothing (an
  n-gram order with zero matches gives BLEU 0), brevity penalty exp(1 - r/c) when c < r.
  ``sacrebleu`` with ``tokenize='none'``, ``smooth_method='none'``, ``force=True``
  computes exactly that on pre-tokenized text (tests/test_bleu.py checks it against
  counts written out by hand).

Scores are on the 0-100 scale.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

SACREBLEU_LABEL = "sacreBLEU (detokenized, 13a, mixed case)"
CHRF_LABEL = "chrF (detokenized, sacreBLEU)"
TOKENIZED_LABEL = "tokenized BLEU (Moses tokenizer, multi-bleu)"
TOKENIZED_SPLIT_LABEL = "tokenized BLEU (Moses tokenizer, compound-split, multi-bleu)"

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# (non-overlapping, left to right, as Perl's s///g: "a-b-c" -> "a ##AT##-##AT## b-c").
_COMPOUND_RE = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """Split hyphenated compounds the tensor2tensor way: ``a-b`` -> ``a ##AT##-##AT## b``."""
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


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


def score_all(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> dict[str, dict[str, Any]]:
    """sacreBLEU, tokenized BLEU and chrF of one test set.

    Returns:
        ``{"sacrebleu": ..., "tokenized_bleu": ..., "chrf": ...}`` (see the functions above).
    """
    return {
        "sacrebleu": sacrebleu_score(hypotheses, references),
        "tokenized_bleu": tokenized_bleu(hypotheses, references, lang),
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
