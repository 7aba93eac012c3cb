"""Golden outputs of the paper's BLEU pipelines, computed by the original Perl scripts.

Writes ``tests/data/paper_bleu/handmade.json`` and ``tests/data/paper_bleu/multi30k.json``:
what Moses ``tokenizer.perl`` / ``replace-unicode-punctuation.perl`` / ``multi-bleu.perl`` and
tensor2tensor's ``get_ende_bleu.sh`` print for every form of
:func:`transformer_nmt.evaluate.bleu.paper_bleu` (``t2t-2017``, ``t2t-2018``, ``moses``,
``moses-a``, ``mmt``), and what ``lowercase.perl`` and ``normalize-punctuation.perl`` print for
the lines of :data:`STEP_LINES`. tests/unit/evaluate/test_bleu.py and
tests/unit/evaluate/test_mmt_bleu.py check that ours gives the same lines
and the same BLEU line. The scripts are not part of this repository:
check them out at the commits named in tests/data/paper_bleu/README.md and pass their paths::

    python scripts/golden/paper_bleu_goldens.py --moses /tmp/perl-scripts/moses-2017 \\
        --t2t-2017 /tmp/perl-scripts/t2t/get_ende_bleu.bca81bee.sh \\
        --t2t-2018 /tmp/perl-scripts/t2t/get_ende_bleu.fc9335c0.sh \\
        --multi30k ../shared/data/multi30k

(``--moses`` is a folder with mosesdecoder's ``scripts/``.) ``--forms mmt`` recomputes only the
``mmt`` form and the step lines, keeping the other forms of the JSON files as they are (the
tensor2tensor scripts are then not needed). Per form and per pair of hypothesis
and reference files it runs, in a scratch folder:

* ``t2t-2017`` / ``t2t-2018`` (German only): the reference is made the way tensor2tensor's
  ``newstest2014.tok.de`` was, ``perl -CSD -pe 's/[\\x{201E}\\x{201C}\\x{201D}\\x{AB}\\x{BB}]/"/g'``
  then ``tokenizer.perl -l de``, saved as ``newstest2013.tok.de`` (the name the script reads);
  then ``HOME=<scratch> bash get_ende_bleu.sh hyp`` with ``<scratch>/mosesdecoder`` linked to
  ``--moses``. The script does the rest: [``replace-unicode-punctuation.perl -l de``,]
  ``tokenizer.perl -l de``, the ``##AT##`` split of both sides, ``multi-bleu.perl``; the golden
  lines are its ``hyp.tok.atat`` and ``newstest2013.tok.de.atat``.
* ``moses`` / ``moses-a``: ``tokenizer.perl -l <lang> [-a]`` on both sides, then
  ``multi-bleu.perl ref.tok < hyp.tok``.
* ``mmt``: ``lowercase.perl | normalize-punctuation.perl -l <lang> | tokenizer.perl -l <lang>``
  on both sides, then ``multi-bleu.perl -lc ref.tok < hyp.tok``.
* ``ott2018`` (German only, written to ``tests/data/paper_bleu/ott2018.json``):
  ``tokenizer.perl -l de`` on both sides (a model trained on Google's tokenized WMT16 data
  writes tokenized text, and its reference ``newstest2014.tok.de`` is tokenized so), the
  lines written as ``fairseq-generate`` prints them (``T-<i>\t<ref>``, ``H-<i>\t<score>\t<hyp>``,
  a last ``BLEU`` line), then fairseq's ``bash compound_split_bleu.sh gen.out``
  (``--compound-split``)
  with a ``fairseq-score`` on ``PATH`` that runs ``multi-bleu.perl --ref < --sys``. Golden
  lines: its ``gen.out.sys`` and ``gen.out.ref``. ``--ott2018-only`` writes only this file
  (no tensor2tensor scripts needed).

Inputs: the hand-made lines below (every kind of quote, dash, apostrophe, ellipsis, compound,
escaped character, full-width punctuation, number format, URL; one empty hypothesis per
language), and the Multi30k test sets (``test_2016_flickr``, ``test_2017_flickr``; German,
French and English references) against hypotheses made from the reference by
:func:`synthetic_hypothesis`. The Multi30k text itself is not stored: the golden keeps the
BLEU line over all lines, a SHA-256 of each whole tokenized file and the first
``--keep`` tokenized lines.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "paper_bleu"
MULTI30K_SETS = ("test_2016_flickr", "test_2017_flickr")
LANGS = ("de", "fr", "en")
T2T_FORMS = ("t2t-2017", "t2t-2018")
MOSES_FORMS = ("moses", "moses-a")
MMT_FORM = "mmt"
ALL_FORMS = (*T2T_FORMS, *MOSES_FORMS, MMT_FORM)

# ----------------------------------------------------------------------------- inputs

QUOTES = {"de": ("\u201e", "\u201c"), "fr": ("\u00ab", "\u00bb"), "en": ("\u201c", "\u201d")}
"""The typographic double quotes of each language: „ “, « », “ ”."""


def synthetic_hypothesis(reference: str, index: int, lang: str) -> str:
    """A deterministic stand-in for a translation of line ``index`` (0-based) of a test set.

    From the reference, in this order:

    1. words (split on spaces) number k = 0, 1, ...; word k is dropped when
       ``(index + k) % 7 == 6``, the last word never;
    2. ASCII double quotes become the language's quotes (:data:`QUOTES`), opening and
       closing in turn;
    3. when ``index % 4 == 1`` the second word is put in the language's quotes, when
       ``index % 4 == 3`` in ASCII ``"``;
    4. when ``index`` is even every ASCII apostrophe becomes ``’``;
    5. when ``index % 3 == 0`` every ASCII hyphen becomes an en dash ``–``;
    6. when ``index % 10 == 5`` a final ``.`` becomes ``…``.
    """
    words = reference.split(" ")
    words = [w for k, w in enumerate(words) if (index + k) % 7 != 6 or k == len(words) - 1]
    opening, closing = QUOTES[lang]
    text, out, is_open = " ".join(words), [], False
    for ch in text:
        if ch == '"':
            ch = closing if is_open else opening
            is_open = not is_open
        out.append(ch)
    words = "".join(out).split(" ")
    if len(words) > 2 and index % 4 in (1, 3):
        left, right = (opening, closing) if index % 4 == 1 else ('"', '"')
        words[1] = f"{left}{words[1]}{right}"
    text = " ".join(words)
    if index % 2 == 0:
        text = text.replace("'", "\u2019")
    if index % 3 == 0:
        text = text.replace("-", "\u2013")
    if index % 10 == 5 and text.endswith("."):
        text = text[:-1] + "\u2026"
    return text


# (reference, hypothesis) pairs written by hand. Escapes: \u00a0 no-break space, \u202f narrow
# no-break space, \u00ad soft hyphen, \u2212 minus sign, \u2011 non-breaking hyphen, \x1f a
# control character; CJK ideographs, Hangul, a Devanagari virama (\u094d), a combining
# small e (\u0364) and a pharyngeal \u0295 test the tokenizer's character classes.
HANDMADE: dict[str, list[tuple[str, str]]] = {
    "de": [
        ("\u201eDas ist gut\u201c, sagte er.", '"Das ist gut", sagte er.'),
        ("Er sagte: \u201eIch komme morgen.\u201c", "Er sagte: \u201cIch komme morgen.\u201d"),
        ("\u00bbWer?\u00ab fragte sie \u2013 und ging.",
         "\u00abWer?\u00bb fragte sie \u2014 und ging."),
        ("Sie nannte es \u201aklein\u2018 und \u203afein\u2039.",
         "Sie nannte es \u2018klein\u2019 und \u2039fein\u203a."),
        ("Das E-Mail-Konto von Max' Vater ist neu.",
         "Das E-Mail Konto von Max\u2019 Vater ist neu."),
        ("Der 3-4-j\u00e4hrige Junge spielt Ping-Pong.",
         "Der 3\u20134-j\u00e4hrige Junge spielt Ping\u2011Pong."),
        ("Warte... dann kam er.", "Warte\u2026 dann kam er."),
        ("Preis: 1.234,56 Euro (ca. 20 % mehr).",
         "Preis\uff1a\uff11.\uff12\uff13\uff14,\uff15\uff16 Euro \uff08ca. 20 \uff05 mehr\uff09."),
        ("Siehe https://www.example.de/a-b?x=1&y=2 f\u00fcr mehr.",
         "Siehe https://www.example.de/a-b?x=1&y=2 fuer mehr."),
        ("M\u00fcller & S\u00f6hne GmbH: <Preise> [neu] | billig",
         "M\u00fcller & S\u00f6hne GmbH: <Preise> [neu] | g\u00fcnstig"),
        ("Er wohnt in der Hauptstr. 5.", "Er wohnt in der Hauptstra\u00dfe 5."),
        ("Das gilt z.B. f\u00fcr Nr. 7 usw.", "Das gilt z. B. f\u00fcr Nr. 7 usw."),
        ("Am 3. Oktober 1990 \u2013 dem Tag der Einheit \u2013 feierten viele.",
         "Am 3. Oktober 1990 - dem Tag der Einheit - feierten viele."),
        ("Ein schwarz-wei\u00df-gestreifter Hund l\u00e4uft \u00fcber die Stra\u00dfe.",
         "Ein schwarz-wei\u00df gestreifter Hund l\u00e4uft \u00fcber die Stra\u00dfe."),
        ("Sie fragte: \u201eWarum?\u201c", "Sie fragte\uff1a\u201cWarum\uff1f\u201d"),
        ("Die Temperatur liegt bei -5 bis +3 Grad.",
         "Die Temperatur liegt bei \u22125 bis +3 Grad."),
        ("\u201eJa\u201c, \u201eNein\u201c oder \u201eWer\u201c \u2013 das ist die Frage\u2026",
         "\u201eJa\u201d, \u201eNein\u201d oder \u201eWer\u201d \u2013 das ist die Frage..."),
        ("Er ist 1,80 m gro\u00df und wiegt 75.5 kg.",
         "Er ist 1,80m gro\u00df und wiegt 75.5kg."),
        ("Das Kind spielt im Garten.", ""),
        ("Das Auto kostet 10.000 \u20ac, sagt er \U0001f600.",
         "Das Auto kostet 10\u00a0000 \u20ac, sagt er \U0001f600."),
        ("Er sagte \"Hallo\" und 'Tsch\u00fcss'.",
         "Er sagte \u201eHallo\u201c und \u201aTsch\u00fcss\u2018."),
        ("Die Stra\u00dfen\u00adbahn f\u00e4hrt um 10:30 Uhr ab -- p\u00fcnktlich.",
         "Die Stra\u00dfenbahn f\u00e4hrt um 10:30 Uhr ab--p\u00fcnktlich."),
        ("\u300cTokio\u300d und \u300aPeking\u300b sind gro\u00df\u3002  Danach kam nichts\uff0e",
         '"Tokio" und "Peking" sind gro\u00df. Danach kam nichts.'),
        ("Die Schreibung \u00bbMa\u0364dchen\u00ab ist alt.",
         "Die Schreibung \u201eM\u00e4dchen\u201c ist alt."),
        ("Er a\u00df Sushi (\u5bff\u53f8) in \uc11c\uc6b8.",
         "Er a\u00df Sushi (\u5bff\u53f8) in Seoul."),
    ],
    "en": [
        ('"That\'s fine," he said.', "\u201cThat\u2019s fine,\u201d he said."),
        ("She said, 'I don't know.'", "She said, \u2018I don\u2019t know.\u2019"),
        ("It was the 1990's -- a rock 'n' roll era.",
         "It was the 1990\u2019s \u2014 a rock \u2019n\u2019 roll era."),
        ("Send an e-mail to info@example.com or visit http://example.com/a-b-c.",
         "Send an email to info@example.com or visit http://example.com/a-b-c."),
        ("The 3-4 year-old boy plays ping-pong.", "The 3\u20134 year old boy plays ping-pong."),
        ("Wait... then he came.", "Wait\u2026 then he came."),
        ("It costs $1,234.56 (about 20% more).",
         "It costs \uff041,234.56 \uff08about 20\uff05 more\uff09."),
        ("Smith & Sons Ltd. sells <cheap> [new] | items.",
         "Smith & Sons Ltd. sells <cheap> [new] items."),
        ("He met Mr. Smith at 5 p.m. in the U.S.", "He met Mr Smith at 5 pm in the U.S."),
        ("A man in a black-and-white shirt.", "A man in a black and white shirt."),
        ('The so-called "experts" \u2013 as usual \u2013 disagreed.',
         "The so-called \u00abexperts\u00bb \u2014 as usual \u2014 disagreed."),
        ("It's 9:30 a.m. on the 2nd of May.", "It\u2019s 9:30 a.m. on the 2nd of May."),
        ("The kids' toys were everywhere.", "The kids\u2019 toys were everywhere."),
        ("Is it \u2039ok\u203a? Yes!", "Is it 'ok'\uff1f Yes\uff01"),
        ("The temperature is -5 \u00b0C.", "The temperature is \u22125\u00a0\u00b0C."),
        ('He shouted: "Stop!"', "He shouted\uff1a \u201eStop!\u201c"),
        ("Version 2.0.1 was released in 2017.",
         "Version 2.0.1 was released in \uff12\uff10\uff11\uff17."),
        ("Prices rose 5.5% in Q1, i.e. 3,000 units, see No. 12.",
         "Prices rose 5.5 % in Q1, i.e. 3.000 units, see No 12."),
        ("The end.'", "The end.\u2019"),
        ('"Well," she said, "maybe."', "\u201cWell,\u201d she said, \u201cmaybe.\u201d"),
        ("He paid Rs. 500 for the tickets.", "He paid Rs. 500 for tickets."),
        ("The IPA sign. \u0295ayn follows.", "The IPA sign \u0295ayn follows."),
        ("The file was saved.", "The\x1ffile was saved."),
        ("A dog runs in the park.", "   "),
    ],
    "fr": [
        ("\u00ab C'est bon \u00bb, dit-il.", '"C\'est bon", dit-il.'),
        ("Il a dit : \u00ab Je viens demain. \u00bb", "Il a dit : \u201cJe viens demain.\u201d"),
        ("L'homme porte un porte-monnaie.", "L\u2019homme porte un porte-monnaie."),
        ("Aujourd'hui, c'est-\u00e0-dire le 3-4 mai...",
         "Aujourd\u2019hui, c\u2019est-\u00e0-dire le 3\u20134 mai\u2026"),
        ("Envoyez un e-mail \u00e0 info@exemple.fr ou voyez https://exemple.fr/a-b?x=1&y=2.",
         "Envoyez un courriel \u00e0 info@exemple.fr ou voyez https://exemple.fr/a-b?x=1&y=2."),
        ("Le prix\u202f: 1\u00a0234,56 \u20ac (environ 20 % de plus).",
         "Le prix\uff1a1 234,56 \u20ac \uff08environ 20 \uff05 de plus\uff09."),
        ("Dupont & Fils : <prix> [nouveau] | pas cher",
         "Dupont et Fils : <prix> [nouveau] | pas cher"),
        ("Des gens admirent une \u0153uvre d'art.", "Des gens admirent une \u0153uvre d\u2019art."),
        ("M. Dupont est arriv\u00e9 \u00e0 10 h 30, etc.",
         "M. Dupont est arriv\u00e9 \u00e0 10h30 etc."),
        ("Un chien noir et blanc court sur l'herbe verte.",
         "Un chien noir-et-blanc court sur l\u2019herbe verte."),
        ("Il fait -5 \u00b0C \u2014 brrr !", "Il fait \u22125 \u00b0C \u2013 brrr\uff01"),
        ("\u00ab Oui \u00bb, \u00ab non \u00bb ou \u00ab peut-\u00eatre \u00bb\u2026",
         "\u2039 Oui \u203a, \u2039 non \u203a ou \u2039 peut-\u00eatre \u203a..."),
        ("Qu'est-ce que c'est ?", "Qu\u2019est-ce que c\u2019est\uff1f"),
        ("Il a dit \"bonjour\" et 'au revoir'.",
         "Il a dit \u00ab bonjour \u00bb et \u2018au revoir\u2019."),
        ("La version 2.0.1 est sortie en 2017.",
         "La version 2.0.1 est sortie en \uff12\uff10\uff11\uff17."),
        ("Une femme lit un livre.", ""),
        ("Le chat-huant et le porc-\u00e9pic-l\u00e0 dorment.",
         "Le chat huant et le porc\u2011\u00e9pic-l\u00e0 dorment."),
        ("C'est l'\u00e9t\u00e9 ; il fait beau.",
         "C\u2019est l\u2019\u00e9t\u00e9 ; il fait beau\u3002"),
        ("Le \u00ab New York Times \u00bb l'a \u00e9crit en 1999-2000.",
         "Le \u201cNew York Times\u201d l\u2019a \u00e9crit en 1999\u20132000."),
        ("Voir p. 12, chap. 3.", "Voir page 12, chapitre 3."),
        ("Jean-Pierre a dit : \u00ab Allons-y ! \u00bb",
         "Jean-Pierre a dit : \u00abAllons-y!\u00bb"),
        ("Il les salue d'un \u00ab \u0928\u092e\u0938\u094d\u0924\u0947 \u00bb.",
         "Il les salue d\u2019un namast\u00e9."),
    ],
}


# Lines for lowercase.perl and normalize-punctuation.perl alone (every rule of the latter:
# brackets and the spaces around them, "%", ":", ";", backticks and '' quotes, typographic
# quotes and dashes, ’ between letters, no-break spaces before punctuation and between digits,
# quote and full stop at the end of a line, capital letters beyond ASCII, a final sigma).
STEP_LINES = [
    "Ein Mann ( links ) , eine Frau (rechts ) .", "Er sagt: ``Hallo'' und `ja'.",
    'Sie sagte "gut." Dann ging sie.', 'Er sagte "gut."', 'Sie sagte "ja", dann "nein".',
    "Das kostet 10\u00a0000 Euro, also 20 % mehr ; oder 30\u00a0% ?",
    "\u00ab\u00a0Oui\u00a0\u00bb, dit-il\u00a0! Pourquoi\u00a0? Voil\u00e0\u00a0; fini\u00a0: bon",
    "\u00abNon\u00bb et \u00ab non \u00bb, n\u00ba\u00a012, 5\u00a0\u00baC, 3\u00a0cm,\u00a0fin",
    ("Don\u2019t \u2018quote\u2019 \u201aso\u2018 \u201eso\u201c "
     "\u201cso\u201d \u00b4x\u00b4 x\u00b4\u00b4"),
    "A \u2013 B \u2014 C\u2014D \u2026 E\u2026",
    "\u00c4RGER \u00dcBER \u00c9T\u00c9 \u0130STANBUL \u1e9e",
    "\u039f\u0394\u039f\u03a3 \u03a3\u039f\u03a3", "Tab\there  two  spaces", "",
    "He said \"Stop\", then \"go\".", "1\u00a02\u00a03 and 4\u00a05",
]
"""Lines that exercise ``lowercase.perl`` and every rule of ``normalize-punctuation.perl``."""

# ----------------------------------------------------------------------------- Perl


def _write(path: Path, lines: list[str]) -> None:
    path.write_bytes("".join(f"{line}\n" for line in lines).encode("utf-8"))


def _read(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _perl(args: list[str], stdin: Path, stdout: Path, cwd: Path, env=None) -> None:
    with open(stdin, "rb") as fin, open(stdout, "wb") as fout:
        subprocess.run(args, stdin=fin, stdout=fout, stderr=subprocess.DEVNULL, cwd=cwd,
                       env=env, check=True)


def run_form(form: str, hyps: list[str], refs: list[str], lang: str, args) -> dict:
    """The Perl pipeline of ``form`` on one pair of files: tokenized lines and BLEU line."""
    moses = Path(args.moses).resolve()
    tokenizer = str(moses / "scripts" / "tokenizer" / "tokenizer.perl")
    lowercase = str(moses / "scripts" / "tokenizer" / "lowercase.perl")
    normalize = str(moses / "scripts" / "tokenizer" / "normalize-punctuation.perl")
    multi_bleu = str(moses / "scripts" / "generic" / "multi-bleu.perl")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write(d / "hyp", hyps)
        _write(d / "ref", refs)
        if form in T2T_FORMS:
            script = Path(args.t2t_2017 if form == "t2t-2017" else args.t2t_2018).resolve()
            (d / "home").mkdir()
            (d / "home" / "mosesdecoder").symlink_to(moses)
            _perl(["perl", "-CSD", "-pe", r's/[\x{201E}\x{201C}\x{201D}\x{AB}\x{BB}]/"/g'],
                  d / "ref", d / "ref.quotes", d)
            _perl(["perl", tokenizer, "-l", "de"], d / "ref.quotes", d / "newstest2013.tok.de", d)
            env = {**os.environ, "HOME": str(d / "home")}
            proc = subprocess.run(["bash", str(script), "hyp"], cwd=d, env=env, check=True,
                                  capture_output=True, text=True)
            hyp_tok, ref_tok = _read(d / "hyp.tok.atat"), _read(d / "newstest2013.tok.de.atat")
        elif form == MMT_FORM:
            for side in ("hyp", "ref"):
                _perl(["perl", lowercase], d / side, d / f"{side}.lc", d)
                _perl(["perl", normalize, "-l", lang], d / f"{side}.lc", d / f"{side}.norm", d)
                _perl(["perl", tokenizer, "-l", lang], d / f"{side}.norm", d / f"{side}.tok", d)
            with open(d / "hyp.tok", "rb") as fin:
                proc = subprocess.run(["perl", multi_bleu, "-lc", str(d / "ref.tok")], stdin=fin,
                                      cwd=d, check=True, capture_output=True, text=True)
            hyp_tok, ref_tok = _read(d / "hyp.tok"), _read(d / "ref.tok")
        elif form == "ott2018":
            _perl(["perl", tokenizer, "-l", "de"], d / "hyp", d / "hyp.tok", d)
            _perl(["perl", tokenizer, "-l", "de"], d / "ref", d / "ref.tok", d)
            gen = [line for i, (h, r) in enumerate(zip(_read(d / "hyp.tok"),
                                                       _read(d / "ref.tok"), strict=True))
                   for line in (f"T-{i}\t{r}", f"H-{i}\t-0.5\t{h}")]
            _write(d / "gen.out", [*gen, "Generate test with beam=4: BLEU4 = 0.00"])
            (d / "bin").mkdir()
            (d / "bin" / "fairseq-score").write_text(
                '#!/bin/bash\n# stand-in: fairseq-score --sys SYS --ref REF, scored by multi-bleu\n'
                f'perl {multi_bleu} "$4" < "$2"\n')
            (d / "bin" / "fairseq-score").chmod(0o755)
            env = {**os.environ, "PATH": f"{d / 'bin'}:{os.environ['PATH']}"}
            proc = subprocess.run(["bash", str(Path(args.compound_split).resolve()), "gen.out"],
                                  cwd=d, env=env, check=True, capture_output=True, text=True)
            hyp_tok, ref_tok = _read(d / "gen.out.sys"), _read(d / "gen.out.ref")
        else:
            flags = ["-a"] if form == "moses-a" else []
            _perl(["perl", tokenizer, "-l", lang, *flags], d / "hyp", d / "hyp.tok", d)
            _perl(["perl", tokenizer, "-l", lang, *flags], d / "ref", d / "ref.tok", d)
            with open(d / "hyp.tok", "rb") as fin:
                proc = subprocess.run(["perl", multi_bleu, str(d / "ref.tok")], stdin=fin,
                                      cwd=d, check=True, capture_output=True, text=True)
            hyp_tok, ref_tok = _read(d / "hyp.tok"), _read(d / "ref.tok")
    bleu = [line for line in proc.stdout.splitlines() if line.startswith("BLEU = ")]
    assert len(bleu) == 1, proc.stdout
    return {"bleu": bleu[0], "hyp_tok": hyp_tok, "ref_tok": ref_tok}


def forms_of(lang: str, wanted: tuple[str, ...] = ALL_FORMS) -> tuple[str, ...]:
    forms = (*T2T_FORMS, *MOSES_FORMS, MMT_FORM) if lang == "de" else (*MOSES_FORMS, MMT_FORM)
    return tuple(f for f in forms if f in wanted)


def steps(args) -> dict:
    """``lowercase.perl`` and ``normalize-punctuation.perl -l <lang>`` on :data:`STEP_LINES`."""
    scripts = Path(args.moses).resolve() / "scripts" / "tokenizer"
    out = {"lines": STEP_LINES, "lowercase": None, "normalize_punctuation": {}}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write(d / "in", STEP_LINES)
        _perl(["perl", str(scripts / "lowercase.perl")], d / "in", d / "lc", d)
        out["lowercase"] = _read(d / "lc")
        for lang in (*LANGS, "cs"):
            _perl(["perl", str(scripts / "normalize-punctuation.perl"), "-l", lang], d / "in",
                  d / f"norm.{lang}", d)
            out["normalize_punctuation"][lang] = _read(d / f"norm.{lang}")
    return out


def _sha256(lines: list[str]) -> str:
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode("utf-8")).hexdigest()


def handmade(args, old: dict, forms_of=forms_of, langs=LANGS, with_steps: bool = True) -> dict:
    out = {"inputs": {}, "forms": {}}
    for lang, pairs in HANDMADE.items():
        if lang not in langs:
            continue
        refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
        out["inputs"][lang] = {"ref": refs, "hyp": hyps}
        out["forms"][lang] = dict(old.get("forms", {}).get(lang, {}))
        out["forms"][lang].update({form: run_form(form, hyps, refs, lang, args)
                                   for form in forms_of(lang, args.forms)})
    if old and old.get("inputs") != out["inputs"]:
        raise SystemExit("the hand-made lines changed: regenerate every form (no --forms)")
    if with_steps:
        out["steps"] = steps(args)
    return out


def multi30k(args, old: dict, forms_of=forms_of, langs=LANGS) -> dict:
    out = {"keep": args.keep, "sets": {}}
    for name in MULTI30K_SETS:
        out["sets"][name] = {}
        for lang in langs:
            path = Path(args.multi30k) / f"{name}.{lang}.gz"
            refs = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")
            refs = refs[:-1] if refs[-1] == "" else refs
            hyps = [synthetic_hypothesis(r, i, lang) for i, r in enumerate(refs)]
            kept = old.get("sets", {}).get(name, {}).get(lang, {}).get("forms", {})
            entry = {"lines": len(refs), "forms": dict(kept)}
            for form in forms_of(lang, args.forms):
                full = run_form(form, hyps, refs, lang, args)
                head = run_form(form, hyps[: args.keep], refs[: args.keep], lang, args)
                entry["forms"][form] = {
                    "bleu": full["bleu"],
                    "hyp_sha256": _sha256(full["hyp_tok"]),
                    "ref_sha256": _sha256(full["ref_tok"]),
                    "head_bleu": head["bleu"],
                    "hyp_tok_head": full["hyp_tok"][: args.keep],
                    "ref_tok_head": full["ref_tok"][: args.keep],
                }
                print(f"{name}.{lang} {form}: {full['bleu']}")
            out["sets"][name][lang] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moses", required=True, help="mosesdecoder checkout (has scripts/)")
    parser.add_argument("--t2t-2017", help="get_ende_bleu.sh without the "
                        "unicode step (tensor2tensor bca81bee); needed for form t2t-2017")
    parser.add_argument("--t2t-2018", help="get_ende_bleu.sh with it "
                        "(tensor2tensor fc9335c0); needed for form t2t-2018")
    parser.add_argument("--forms", nargs="+", choices=ALL_FORMS, default=list(ALL_FORMS),
                        help="forms to compute; the others are kept from the existing files")
    parser.add_argument("--compound-split", help="fairseq's scripts/compound_split_bleu.sh "
                        "(form ott2018, written to ott2018.json)")
    parser.add_argument("--ott2018-only", action="store_true",
                        help="write only ott2018.json")
    parser.add_argument("--multi30k", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--keep", type=int, default=50,
                        help="tokenized Multi30k lines kept verbatim per file")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    args.forms = tuple(args.forms)
    if args.ott2018_only and not args.compound_split:
        parser.error("--ott2018-only needs --compound-split")
    for form in T2T_FORMS:
        missing = not getattr(args, form.replace("-", "_"))
        if not args.ott2018_only and form in args.forms and missing:
            parser.error(f"form {form} needs --{form}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    every = set(args.forms) == set(ALL_FORMS)
    files = []
    builds = () if args.ott2018_only else (("handmade", handmade), ("multi30k", multi30k))
    for name, build in builds:
        path = out / f"{name}.json"
        old = {} if every or not path.is_file() else json.loads(path.read_text(encoding="utf-8"))
        files.append((name, lambda build=build, old=old: build(args, old)))
    if args.compound_split:
        def ott(lang, wanted=ALL_FORMS):
            return ("ott2018",)
        files.append(("ott2018", lambda: {
            "handmade": handmade(args, {}, ott, ("de",), with_steps=False),
            "multi30k": multi30k(args, {}, ott, ("de",))}))
    for name, make in files:
        text = json.dumps(make(), ensure_ascii=False, indent=1) + "\n"
        (out / f"{name}.json").write_text(text, encoding="utf-8")
        print(f"wrote {out / name}.json ({len(text.encode()):,} bytes)")


if __name__ == "__main__":
    main()
