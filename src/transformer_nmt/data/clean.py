"""Cleaning: Unicode normalisation, control-character removal and pair filters.

Every line of every split is normalised (:func:`normalize`), then lowercased and
Moses-tokenized when ``data.lowercase`` / ``data.pretokenize=moses`` say so
(:func:`preprocess_pair`). Only the training split is filtered (on the text as written), by these
rules in this order (a pair is counted under the first rule it breaks):

``empty``      either side is empty after normalisation;
``too_long``   either side has more than ``data.max_len`` whitespace-separated words;
``ratio``      longer / shorter word count exceeds ``data.max_ratio``, for pairs whose longer
               side has at least ``data.ratio_min_len`` words;
``duplicate``  the same (source, target) pair was already kept (``data.dedup``).

Test and valid sets are never filtered, so their lines stay aligned with the official
references. Reading and writing are streamed line by line; memory does not grow with the
corpus, except for de-duplication, which keeps one 64-bit hash per kept pair.

The counts go to the log and to ``<root>/raw/<name>/clean_report.json``.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

from transformer_nmt.config import DataConfig
from transformer_nmt.data import moses
from transformer_nmt.data.corpora import SplitSource
from transformer_nmt.errors import DataError
from transformer_nmt.fileio import atomic_write, raw_path, read_lines, write_json

log = logging.getLogger(__name__)

RULES = ("empty", "too_long", "ratio", "duplicate")
"""Filter rules, in the order they are checked."""

IDENTICAL_PAIRS_WARN = 0.5
"""``nmt-prepare`` warns when more than this fraction of the kept training pairs have a
source identical to their target (after cleaning), as when the target file is a copy of the
source file: a model trained on them learns to copy its input (:func:`copy_warning`)."""

# Invisible characters removed outright: C0/C1 controls that are not whitespace, soft hyphen,
# zero-width space, left-to-right / right-to-left marks and embeddings, word joiner, BOM.
# Whitespace controls (tab, CR, U+001C-U+001F, U+0085 ...) become a single space via split().
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\u00ad\u200b\u200e\u200f\u202a-\u202e\u2060\ufeff]"
)


def report_path(data_cfg: DataConfig) -> Path:
    """``<root>/raw/<name>/clean_report.json``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / "clean_report.json"


def normalize(text: str, form: str = "NFKC") -> str:
    """Normalise one line: drop invisible control/format characters, apply the Unicode
    normalisation ``form`` (``NFC``, ``NFKC``, ``NFD``, ``NFKD`` or ``none``), collapse
    every run of whitespace to one space and strip both ends. Idempotent.
    """
    text = _INVISIBLE.sub("", text)
    if form != "none":
        text = unicodedata.normalize(form, text)
    return " ".join(text.split())


def text_steps(data_cfg: DataConfig) -> dict:
    """The text steps after normalisation that ``data_cfg`` asks for: ``{"lowercase": True}``
    and/or ``{"pretokenize": "moses"}``; ``{}`` when none (so stamps and ``spm.json`` of data
    prepared without them stay as they were)."""
    steps: dict = {}
    if getattr(data_cfg, "lowercase", False):
        steps["lowercase"] = True
    if str(getattr(data_cfg, "pretokenize", "none")) != "none":
        steps["pretokenize"] = str(data_cfg.pretokenize)
    return steps


def preprocess_pair(src: str, tgt: str, data_cfg: DataConfig) -> tuple[str, str]:
    """One normalised pair through :func:`text_steps`: :func:`transformer_nmt.data.moses.lowercase`,
    then Moses ``normalize-punctuation.perl`` and ``tokenizer.perl -l <lang>`` per side
    (:func:`transformer_nmt.data.moses.preprocess`)."""
    steps = text_steps(data_cfg)
    if not steps:
        return src, tgt
    lower, tok = bool(steps.get("lowercase")), steps.get("pretokenize") == "moses"
    (s,) = moses.preprocess([src], data_cfg.src_lang, lower, tok)
    (t,) = moses.preprocess([tgt], data_cfg.tgt_lang, lower, tok)
    return s, t


def n_words(line: str) -> int:
    """Number of space-separated words of a line already passed through :func:`normalize`."""
    return line.count(" ") + 1 if line else 0


class PairFilter:
    """The training-pair rules (see the module docstring), with a count per rule.

    Args:
        max_len: most words allowed on either side.
        max_ratio: most allowed (longer / shorter) word-count ratio.
        ratio_min_len: the ratio rule applies only when the longer side has this many words.
        dedup: drop exact duplicate pairs (keeps a set of 64-bit hashes of kept pairs).
    """

    def __init__(self, max_len: int, max_ratio: float, ratio_min_len: int = 0,
                 dedup: bool = False) -> None:
        self.max_len = max_len
        self.max_ratio = max_ratio
        self.ratio_min_len = ratio_min_len
        self.dedup = dedup
        self.counts = dict.fromkeys(RULES, 0)
        self._seen: set[int] = set()

    def rule(self, src: str, tgt: str) -> str | None:
        """The first rule the normalised pair breaks (and count it), or None to keep it."""
        ns, nt = n_words(src), n_words(tgt)
        if ns == 0 or nt == 0:
            broken = "empty"
        elif ns > self.max_len or nt > self.max_len:
            broken = "too_long"
        elif max(ns, nt) >= self.ratio_min_len and max(ns, nt) > self.max_ratio * min(ns, nt):
            broken = "ratio"
        elif self.dedup:
            key = hash((src, tgt))  # 64-bit; only compared within this process
            broken = "duplicate" if key in self._seen else None
            self._seen.add(key)
        else:
            broken = None
        if broken is not None:
            self.counts[broken] += 1
        return broken


def clean_split(source: SplitSource, data_cfg: DataConfig, pair_filter: PairFilter | None) -> dict:
    """Normalise (and, for training, filter) one split into ``raw_path(split, lang)`` files.

    Args:
        source: the split's original files.
        data_cfg: ``cfg.data`` (``unicode_form``, ``encoding_errors``, ``root``, ``name``).
        pair_filter: the filter for the training split; None writes every pair.

    Returns:
        ``{"read": pairs read, "kept": pairs written, "dropped": {rule: count},
        "invalid_utf8_lines": lines with U+FFFD substitutions, "identical": pairs written
        whose source equals their target}``.

    Raises:
        DataError: the two files have different line counts (names both files and counts),
            invalid UTF-8 under ``encoding_errors=strict``, a missing file, or no pair left.
            Nothing is written for the split in that case.
    """
    form = data_cfg.unicode_form
    stats: dict = {}
    src_lines = read_lines(source.src, data_cfg.encoding_errors, stats)
    tgt_lines = read_lines(source.tgt, data_cfg.encoding_errors, stats)
    before = dict(pair_filter.counts) if pair_filter else {}
    read = kept = identical = 0
    out_src = raw_path(data_cfg, source.split, data_cfg.src_lang)
    out_tgt = raw_path(data_cfg, source.split, data_cfg.tgt_lang)
    with atomic_write(out_src) as fs, atomic_write(out_tgt) as ft:
        for s in src_lines:
            t = next(tgt_lines, None)
            if t is None:
                extra = 1 + sum(1 for _ in src_lines)
                _mismatch(source, read + extra, read)
            read += 1
            s, t = preprocess_pair(normalize(s, form), normalize(t, form), data_cfg)
            if pair_filter is None or pair_filter.rule(s, t) is None:
                fs.write(s + "\n")
                ft.write(t + "\n")
                kept += 1
                identical += s == t
            if source.max_pairs is not None and read >= source.max_pairs:
                break
        else:
            extra = sum(1 for _ in tgt_lines)
            if extra:
                _mismatch(source, read, read + extra)
        if kept == 0:
            dropped = {k: v - before.get(k, 0) for k, v in (pair_filter.counts.items()
                                                            if pair_filter else [])}
            why = "the files are empty" if read == 0 else f"all {read} pairs were dropped {dropped}"
            raise DataError(
                f"split {source.split!r} is empty after cleaning ({source.src}, {source.tgt}): "
                f"{why}; check the files or relax data.max_len / data.max_ratio"
            )
    dropped = {k: pair_filter.counts[k] - before[k] for k in RULES
               if k != "duplicate" or pair_filter.dedup} if pair_filter else {}
    return {"read": read, "kept": kept, "dropped": dropped,
            "invalid_utf8_lines": stats.get("invalid_utf8_lines", 0), "identical": identical}


def copy_warning(source: SplitSource, counts: dict) -> str | None:
    """The warning for a split whose pairs would teach a model to copy its input, or None.

    Args:
        source: the split's original files.
        counts: the split's entry of the cleaning report (:func:`clean_split`: ``read``,
            ``kept``, ``identical``; a report written before ``identical`` was counted has
            none, which counts as 0).

    Returns:
        One line naming both files: when they are one file (the same path, a symlink or a
        hard link to it), for any split; when more than :data:`IDENTICAL_PAIRS_WARN` of the
        kept pairs of the training split have a source equal to their target, with the count
        and the percentage.
    """
    src, tgt = Path(source.src), Path(source.tgt)
    if src.is_file() and tgt.is_file() and src.samefile(tgt):
        consequence = ("a model trained on it would learn to copy its input" if source.is_train
                       else "a score on it would reward copying the input")
        return (f"split {source.split!r}: the source and target are one file ({src} and {tgt}): "
                f"each of its {counts.get('read', 0)} pairs has its source as its target, so "
                f"{consequence}; name the file of the target language")
    kept, same = int(counts.get("kept") or 0), int(counts.get("identical") or 0)
    if source.is_train and kept and same / kept > IDENTICAL_PAIRS_WARN:
        return (f"split {source.split!r}: {same} of {kept} kept pairs ({100 * same / kept:.1f} %) "
                f"have a source identical to their target ({src}, {tgt}), so a model trained "
                "on them would learn to copy its input; check that the target file holds the "
                "translations")
    return None


def _mismatch(source: SplitSource, n_src: int, n_tgt: int) -> None:
    raise DataError(
        f"split {source.split!r}: line counts differ: {source.src} has {n_src} lines but "
        f"{source.tgt} has {n_tgt} lines (parallel files must be aligned line by line)"
    )


def clean_params(data_cfg: DataConfig) -> dict:
    """The config values the cleaned text depends on (a change means cleaning again)."""
    keys = ("corpus", "src_lang", "tgt_lang", "unicode_form", "encoding_errors", "max_len",
            "max_ratio", "ratio_min_len", "dedup", "max_train_pairs")
    return {**{k: getattr(data_cfg, k) for k in keys}, **text_steps(data_cfg)}


def clean_corpus(data_cfg: DataConfig, sources: list[SplitSource]) -> dict:
    """Clean every split and save the report.

    Args:
        data_cfg: ``cfg.data``.
        sources: from :func:`transformer_nmt.data.corpora.fetch`.

    Returns:
        The report: ``{"params": ..., "splits": {split: clean_split(...)}}``, also written
        to :func:`report_path` (last, so its presence means every split was written).

    Raises:
        DataError: see :func:`clean_split`.
    """
    report: dict = {"params": clean_params(data_cfg), "splits": {}}
    for source in sources:
        pair_filter = None
        if source.is_train:
            pair_filter = PairFilter(data_cfg.max_len, data_cfg.max_ratio,
                                     data_cfg.ratio_min_len, data_cfg.dedup)
        r = clean_split(source, data_cfg, pair_filter)
        report["splits"][source.split] = r
        log.info("clean %s: read %d pairs, kept %d%s%s", source.split, r["read"], r["kept"],
                 "".join(f", {k} -{v}" for k, v in r["dropped"].items()),
                 f", {r['invalid_utf8_lines']} lines with invalid UTF-8 replaced"
                 if r["invalid_utf8_lines"] else "")
    write_json(report_path(data_cfg), report)
    return report
