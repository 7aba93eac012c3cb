"""Moses text processing as the mosesdecoder Perl scripts of commit 59bad94 (2017-05-29) do it.

* :func:`tokenize`: ``tokenizer.perl -l <lang> [-a]`` (escaping on), sacremoses with the
  character classes and prefix lists corrected where it differs from the Perl script;
* :func:`normalize_punctuation`: ``normalize-punctuation.perl -l <lang>``, rule by rule;
* :func:`lowercase`: ``lowercase.perl`` (Perl's ``lc``, one character at a time);
* :func:`detokenize`: sacremoses' ``MosesDetokenizer`` (``detokenizer.perl``), unescaping.

tests/data/paper_bleu holds what the Perl scripts print on hand-made and Multi30k lines;
tests/unit/evaluate/test_bleu.py and tests/unit/evaluate/test_mmt_bleu.py check that these functions
give the same lines. The data stage uses them for ``data.lowercase`` and ``data.pretokenize=moses``
(:func:`preprocess`), the BLEU forms of :mod:`transformer_nmt.evaluate.bleu` to score.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import regex

MOSES_COMMIT = "59bad94"
"""mosesdecoder commit whose ``tokenizer.perl``, nonbreaking prefixes,
``replace-unicode-punctuation.perl``, ``normalize-punctuation.perl``, ``lowercase.perl`` and
``multi-bleu.perl`` are reproduced (2017-05-29)."""


# Perl's character classes, as tokenizer.perl uses them: \p{IsAlnum} = Alphabetic or decimal
# digit, \p{IsAlpha} = Alphabetic, \p{IsN} = any number, \p{IsLower} = Lowercase, \s = White_Space,
# with the membership Perl 5.36 gives them (Unicode 14.0) where the regex module's newer
# Unicode data differs: there 38 combining marks are Alphabetic and 6 letters moved in or out
# of Lowercase (found by running tokenizer.perl on every assigned code point,
# docs/paper_bleu.md). Sets in the regex module's V1 syntax.
_ALPHA = (r"[\p{Alphabetic}--[\u0363-\u036f\u0c04\u0f82\u0f83\u1dd3-\u1de6"
          r"\U00011080\U00011081]]")
_ALNUM, _N = rf"\p{{Nd}}{_ALPHA}", r"\p{N}"
_LOWER = r"[[\p{Lowercase}\u0295]--[\u10fc\ua7f2-\ua7f4\uab69]]"


def _perl_re(pattern: str):
    return regex.compile(pattern, flags=regex.V1)


_PERL_LOWER = _perl_re(_LOWER)
_PERL_ALPHA = _perl_re(_ALPHA)
_PERL_BLANK_LINE = regex.compile(r"\p{White_Space}*")

# Nonbreaking prefixes sacremoses ships that the 59bad94 files lack (mosesdecoder 4da86c3,
# 2019-11-05, added "Rs" to nonbreaking_prefix.en).
_LATER_PREFIXES = {"en": ("Rs",)}


@functools.cache
def _perl_moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    class PerlMosesTokenizer(MosesTokenizer):
        r"""sacremoses' tokenizer with the character classes of Perl's regular expressions.

        sacremoses lists the members of each class as an old Perl (Unicode 7.0) printed them,
        without the CJK ideographs and Hangul syllables and with the Indic viramas and nuktas
        added; Python's ``\s`` also takes the control characters U+001C-U+001F, which
        tokenizer.perl deletes. Here every class is the Unicode property Perl uses.
        """

        DEDUPLICATE_SPACE = _perl_re(r"\p{White_Space}+"), " "
        PAD_NOT_ISALNUM = _perl_re(rf"([^{_ALNUM}\p{{White_Space}}\.'`,\-])"), r" \1 "
        AGGRESSIVE_HYPHEN_SPLIT = _perl_re(rf"([{_ALNUM}])\-(?=[{_ALNUM}])"), r"\1 @-@ "
        COMMA_SEPARATE_1 = _perl_re(rf"([^{_N}])[,]"), r"\1 , "
        COMMA_SEPARATE_2 = _perl_re(rf"[,]([^{_N}])"), r" , \1"
        COMMA_SEPARATE_3 = _perl_re(rf"([{_N}])[,]$"), r"\1 , "
        ENGLISH_SPECIFIC_APOSTROPHE = (
            (_perl_re(rf"([^{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([^{_ALPHA}{_N}])[']([{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([{_ALPHA}])[']([{_ALPHA}])"), r"\1 '\2"),
            (_perl_re(rf"([{_N}])[']([s])"), r"\1 '\2"),
        )
        FR_IT_SPECIFIC_APOSTROPHE = (
            (_perl_re(rf"([^{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([^{_ALPHA}])[']([{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
            (_perl_re(rf"([{_ALPHA}])[']([{_ALPHA}])"), r"\1' \2"),
        )

        def __init__(self, lang: str):
            super().__init__(lang=lang)
            for name in ("PAD_NOT_ISALNUM", "AGGRESSIVE_HYPHEN_SPLIT"):
                self.__dict__.pop(name, None)  # sacremoses' own classes for zh/ja/ko
            later = _LATER_PREFIXES.get(lang, ())
            self.NONBREAKING_PREFIXES = [p for p in self.NONBREAKING_PREFIXES if p not in later]

        def islower(self, text: str) -> bool:
            return all(_PERL_LOWER.match(ch) for ch in text)

        def isanyalpha(self, text: str) -> bool:
            return _PERL_ALPHA.search(text) is not None

    return PerlMosesTokenizer(lang)


def tokenize(lines: Sequence[str], lang: str, aggressive: bool = False) -> list[str]:
    """Moses-tokenize lines exactly as ``tokenizer.perl -l <lang>`` of mosesdecoder 59bad94
    (escaping on: ``&`` -> ``&amp;``, ``"`` -> ``&quot;``, ``'`` -> ``&apos;`` ...; ``-a``
    when ``aggressive``).

    As the script, a line that is empty or only whitespace is returned unchanged, and a word
    ending in a full stop keeps it when it is a nonbreaking prefix of the language, even at
    the end of the line (``"Er wohnt in der Hauptstr. 5."`` ->
    ``"Er wohnt in der Hauptstr . 5."``, ``5`` being a German prefix; the script splits every
    final dot only from 2018-11 on).

    Args:
        lines: detokenized text.
        lang: language code for the tokenizer's rules (``de``, ``fr``, ``en``, ...).
        aggressive: the ``-a`` flag: ``a-b`` -> ``a @-@ b`` between letters or digits.

    Returns:
        Tokenized lines, tokens separated by single spaces.
    """
    tok = _perl_moses_tokenizer(lang)
    return [
        line if _PERL_BLANK_LINE.fullmatch(line) else
        tok.tokenize(line, aggressive_dash_splits=aggressive, return_str=True, escape=True)
        for line in lines
    ]


# normalize-punctuation.perl at mosesdecoder 59bad94, rule by rule and in its order (PENN
# off). The script reads bytes: [a-z] with /i, \d and \s are ASCII only (re.ASCII), and the
# "pseudo-spaces" of its French, unit and number rules are U+00A0 (no-break space). $_ ends in the
# line's "\n", which [^<] can match: a final '."' becomes '".' for German and French.
_A = re.ASCII
_PUNCT_START = tuple((re.compile(p, _A), s) for p, s in (
    (r"\r", ""), (r"\(", " ("), (r"\)", ") "), (r" +", " "), (r"\) ([.!:?;,])", r")\1"),
    (r"\( ", "("), (r" \)", ")"), (r"(\d) %", r"\1%"), (r" :", ":"), (r" ;", ";"),
    (r"`", "'"), (r"''", ' " '),
    ("\u201e", '"'), ("\u201c", '"'), ("\u201d", '"'), ("\u2013", "-"), ("\u2014", " - "),
    (r" +", " "), ("\u00b4", "'"), ("(?i)([a-z])\u2018([a-z])", r"\1'\2"),
    ("(?i)([a-z])\u2019([a-z])", r"\1'\2"), ("\u2018", '"'), ("\u201a", '"'), ("\u2019", '"'),
    (r"''", '"'), ("\u00b4\u00b4", '"'), ("\u2026", "..."),
    ("\u00a0\u00ab\u00a0", ' "'), ("\u00ab\u00a0", '"'), ("\u00ab", '"'),
    ("\u00a0\u00bb\u00a0", '" '), ("\u00a0\u00bb", '"'), ("\u00bb", '"'),
    ("\u00a0%", "%"), ("n\u00ba\u00a0", "n\u00ba "), ("\u00a0:", ":"),
    ("\u00a0\u00baC", " \u00baC"), ("\u00a0cm", " cm"), ("\u00a0\\?", "?"),
    ("\u00a0!", "!"), ("\u00a0;", ";"), (",\u00a0", ", "), (r" +", " "),
))
_PUNCT_EN = ((re.compile(r'"([,.]+)', _A), r'\1"'),)
_PUNCT_OTHER = ((re.compile(r',"', _A), '",'), (re.compile(r'(\.+)"(\s*[^<])', _A), r'"\1\2'))
_NUMBER_COMMA = re.compile("(\\d)\u00a0(\\d)", _A)
_COMMA_LANGS = ("de", "es", "cz", "cs", "fr")


def normalize_punctuation(line: str, lang: str) -> str:
    """Moses ``normalize-punctuation.perl -l <lang>`` (commit 59bad94) on one line.

    Spaces around brackets and before ``% : ;`` tidied; typographic quotes ``„ “ ” ‘ ‚ ’ « »``
    and ``''`` -> ``"`` (``’`` between two ASCII letters -> ``'``), ``–`` -> ``-``, ``—`` ->
    `` - ``, ``…`` -> ``...``, no-break spaces before ``% : ? ! ;`` dropped; English moves
    a ``"`` after a following ``,`` or ``.``, other languages before it (``,"`` -> ``",``,
    ``."x`` -> ``".x``, also at the end of the line); digits around a no-break space
    (``1\u00a0000``) -> ``1,000`` for de, es, cs and fr, ``1.000`` otherwise.
    """
    text = line + "\n"
    for pattern, sub in _PUNCT_START:
        text = pattern.sub(sub, text)
    if lang == "en":
        rules = _PUNCT_EN
    elif lang in ("cs", "cz"):
        rules = ()
    else:
        rules = _PUNCT_OTHER
    for pattern, sub in rules:
        text = pattern.sub(sub, text)
    text = _NUMBER_COMMA.sub(r"\1,\2" if lang in _COMMA_LANGS else r"\1.\2", text)
    return text.removesuffix("\n")


def lowercase(line: str) -> str:
    """Moses ``lowercase.perl``: Perl's ``lc`` on UTF-8 text, which maps each character on its
    own (a final capital sigma becomes ``σ``, where Python's ``str.lower`` gives ``ς``)."""
    return "".join(ch.lower() for ch in line)


@functools.cache
def _detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def detokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Undo :func:`tokenize`: sacremoses' ``MosesDetokenizer`` (``detokenizer.perl -l
    <lang>``), which also unescapes ``&amp; &quot; &apos; &lt; &gt; &#91; &#93; &#124;``.
    Blank lines stay as they are."""
    detok = _detokenizer(lang)
    return [detok.detokenize(line.split(), unescape=True) if line.strip() else line
            for line in lines]


def preprocess(lines: Sequence[str], lang: str, lower: bool, moses: bool) -> list[str]:
    """The text steps of ``data.lowercase`` and ``data.pretokenize=moses``, in the order of
    the Multi30k papers' preprocessing: :func:`lowercase` (when ``lower``), then
    :func:`normalize_punctuation` and :func:`tokenize` (when ``moses``)."""
    out = [lowercase(line) for line in lines] if lower else list(lines)
    if moses:
        out = tokenize([normalize_punctuation(line, lang) for line in out], lang)
    return out
