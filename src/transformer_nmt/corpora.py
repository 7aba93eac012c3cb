"""Where each corpus comes from: the first stage of the pipeline (download).

Three kinds of source (``data.corpus``):

* ``multi30k``: the official Multi30k task-1 files ``<split>.<lang>.gz`` (Elliott et al.,
  2016), read in place from a local mirror folder (``data.mirror`` or the environment
  variable ``NMT_MULTI30K_MIRROR``) or downloaded from ``data.url`` into
  ``<root>/raw/<name>/orig/``. Official split names ``train``, ``val``,
  ``test_2016_flickr``, ``test_2017_flickr``; ``val`` becomes ``data.valid_split``.
* ``wmt14``: the Hugging Face ``datasets`` library (``data.hf_dataset`` / ``data.hf_config``),
  streamed record by record to ``<root>/raw/<name>/orig/<split>.<lang>``: ``train``,
  ``validation`` (newstest2013) as the valid split, ``test`` (newstest2014, 3003 lines).
  The 2737-line filtered newstest2014 comes from sacreBLEU's test-set API
  (``newstest2014_filtered``).
* ``custom``: the user's files ``<prefix>.<src_lang>`` / ``<prefix>.<tgt_lang>`` named per
  split in ``data.custom_files``.

:func:`fetch` returns, per split, the two original text files (plain or gzip) that the
cleaning stage reads with :func:`read_lines`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.errors import UserError
from transformer_nmt.fileio import atomic_write

log = logging.getLogger(__name__)

CORPORA = ("multi30k", "wmt14", "custom")
MIRROR_ENV = "NMT_MULTI30K_MIRROR"
MULTI30K_VALID = "val"
"""Official name of the Multi30k validation split (stored on disk as ``data.valid_split``)."""
WMT14_HF_SPLITS = {"train": "train", "newstest2013": "validation", "newstest2014": "test"}
"""Our split name -> the ``datasets`` split of ``wmt/wmt14``."""
WMT14_FILTERED = "newstest2014_filtered"
"""The 2737-line filtered newstest2014 (sacreBLEU test set ``wmt14``)."""


class DataError(UserError):
    """Bad or missing input data; the message names the file, line and values at fault."""


@dataclass(frozen=True)
class SplitSource:
    """The original text of one split: two line-aligned files (plain text or ``.gz``).

    Attributes:
        split: split name on disk (``train``, ``valid``, ``test_2016_flickr`` ...).
        src: source-language file.
        tgt: target-language file.
        is_train: True for the training split (the only one that is filtered).
        max_pairs: read at most this many pairs (``data.max_train_pairs``); None = all.
    """

    split: str
    src: Path
    tgt: Path
    is_train: bool
    max_pairs: int | None = None


def orig_dir(data_cfg: Any) -> Path:
    """Folder for downloaded or streamed originals: ``<root>/raw/<name>/orig``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / "orig"


def splits(data_cfg: Any) -> list[str]:
    """All split names of a corpus, training split first: train, valid, then each test split."""
    names = [data_cfg.train_split, data_cfg.valid_split, *list(data_cfg.test_splits)]
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def fetch(data_cfg: Any) -> tuple[list[SplitSource], bool]:
    """Make the original text of every split available on local disk.

    Args:
        data_cfg: ``cfg.data`` (:class:`transformer_nmt.config.DataConfig`).

    Returns:
        ``(sources, did_work)``: one :class:`SplitSource` per split (training split first)
        and whether anything was downloaded or streamed (False when all was already there).

    Raises:
        DataError: unknown ``data.corpus``, missing file or folder, failed download,
            a split name the corpus does not provide.
    """
    corpus = data_cfg.corpus
    if corpus == "multi30k":
        return _fetch_multi30k(data_cfg)
    if corpus == "wmt14":
        return _fetch_wmt14(data_cfg)
    if corpus == "custom":
        return _custom_sources(data_cfg), False
    raise DataError(
        f"unknown corpus data.corpus={corpus!r} (data.name={data_cfg.name!r}): "
        f"expected one of {list(CORPORA)}"
    )


def _max_pairs(data_cfg: Any, split: str) -> int | None:
    return data_cfg.max_train_pairs if split == data_cfg.train_split else None


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{what}: file not found: {path}")
    return path


# --- Multi30k ------------------------------------------------------------------------------


def multi30k_mirror(data_cfg: Any) -> Path | None:
    """The local mirror folder: ``data.mirror``, else ``$NMT_MULTI30K_MIRROR``; empty = unset."""
    mirror = data_cfg.mirror or os.environ.get(MIRROR_ENV) or None
    return Path(mirror) if mirror else None


def _multi30k_official(data_cfg: Any, split: str) -> str:
    if split == data_cfg.valid_split:
        return MULTI30K_VALID
    return split


def _fetch_multi30k(data_cfg: Any) -> tuple[list[SplitSource], bool]:
    mirror = multi30k_mirror(data_cfg)
    langs = (data_cfg.src_lang, data_cfg.tgt_lang)
    did_work = False
    sources = []
    if mirror is not None and not mirror.is_dir():
        raise DataError(
            f"Multi30k mirror folder not found: {mirror} (data.mirror or ${MIRROR_ENV})"
        )
    for split in splits(data_cfg):
        official = _multi30k_official(data_cfg, split)
        paths = []
        for lang in langs:
            fname = f"{official}.{lang}.gz"
            if mirror is not None:
                path = mirror / fname
                if not path.is_file() and (mirror / fname[:-3]).is_file():
                    path = mirror / fname[:-3]
                _require_file(path, f"Multi30k {split} ({lang}) in mirror {mirror}")
            else:
                if not data_cfg.url:
                    raise DataError(
                        "Multi30k needs a source: set data.mirror (or $NMT_MULTI30K_MIRROR) to a "
                        "folder holding train.en.gz ..., or data.url to the official files"
                    )
                path = orig_dir(data_cfg) / fname
                if not path.is_file():
                    download(f"{data_cfg.url.rstrip('/')}/{fname}", path)
                    did_work = True
            paths.append(path)
        sources.append(
            SplitSource(split, paths[0], paths[1], split == data_cfg.train_split,
                        _max_pairs(data_cfg, split))
        )
    return sources, did_work


def download(url: str, dest: Path, timeout_s: float = 60.0) -> None:
    """Download ``url`` to ``dest`` atomically (a partial download never appears as ``dest``).

    Raises:
        DataError: naming the URL and the reason (HTTP status, unreachable host ...).
    """
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp, atomic_write(dest, "wb") as f:
            shutil.copyfileobj(resp, f, length=1 << 20)
    except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"could not download {url}: {e}; without network, point data.mirror "
            f"(or ${MIRROR_ENV}) at a local copy of the files"
        ) from e


# --- custom ---------------------------------------------------------------------------------


def _custom_sources(data_cfg: Any) -> list[SplitSource]:
    files = dict(data_cfg.custom_files or {})
    sources = []
    for split in splits(data_cfg):
        if split not in files:
            raise DataError(
                f"data.custom_files has no entry for split {split!r} (has {sorted(files)}); "
                f"add +data.custom_files.{split}=/path/prefix (files <prefix>.{data_cfg.src_lang} "
                f"and <prefix>.{data_cfg.tgt_lang})"
            )
        paths = []
        for lang in (data_cfg.src_lang, data_cfg.tgt_lang):
            path = Path(f"{files[split]}.{lang}")
            if not path.is_file() and Path(f"{path}.gz").is_file():
                path = Path(f"{path}.gz")
            paths.append(_require_file(path, f"data.custom_files.{split} ({lang})"))
        sources.append(
            SplitSource(split, paths[0], paths[1], split == data_cfg.train_split,
                        _max_pairs(data_cfg, split))
        )
    return sources


# --- WMT14 ------------------------------------------------------------------------------------


def _wmt14_stamp_ok(stamp: Path, max_pairs: int | None) -> bool:
    """True when an earlier streaming run saved at least the ``max_pairs`` now asked for."""
    if not stamp.is_file():
        return False
    saved = json.loads(stamp.read_text()).get("max_pairs")
    return saved is None or (max_pairs is not None and saved >= max_pairs)


def _fetch_wmt14(data_cfg: Any) -> tuple[list[SplitSource], bool]:
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    out = orig_dir(data_cfg)
    did_work = False
    sources = []
    for split in splits(data_cfg):
        dest = (out / f"{split}.{src}", out / f"{split}.{tgt}")
        stamp = out / f"{split}.json"
        max_pairs = _max_pairs(data_cfg, split)
        if not (dest[0].is_file() and dest[1].is_file() and _wmt14_stamp_ok(stamp, max_pairs)):
            if split == WMT14_FILTERED:
                n = _sacrebleu_wmt14(src, tgt, dest)
            elif split in WMT14_HF_SPLITS:
                n = _stream_hf(data_cfg, WMT14_HF_SPLITS[split], dest, max_pairs)
            else:
                raise DataError(
                    f"WMT14 has no split {split!r}: expected one of "
                    f"{sorted([*WMT14_HF_SPLITS, WMT14_FILTERED])}"
                )
            with atomic_write(stamp) as f:
                json.dump({"pairs": n, "max_pairs": max_pairs}, f)
            did_work = True
        sources.append(SplitSource(split, dest[0], dest[1], split == data_cfg.train_split,
                                   max_pairs))
    return sources, did_work


def _one_line(text: str) -> str:
    """A record's text on one line (a newline inside a record would break the alignment)."""
    return text.replace("\r", " ").replace("\n", " ")


def _stream_hf(data_cfg: Any, hf_split: str, dest: tuple[Path, Path],
               max_pairs: int | None) -> int:
    """Stream ``{"translation": {lang: text}}`` records of one split to two text files.

    Memory is bounded: records are written as they arrive (``streaming=True``).

    Returns:
        Number of pairs written.
    """
    import datasets

    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    log.info("streaming %s/%s split %s -> %s", data_cfg.hf_dataset, data_cfg.hf_config,
             hf_split, dest[0].parent)
    try:
        records = datasets.load_dataset(
            data_cfg.hf_dataset, data_cfg.hf_config, split=hf_split, streaming=True
        )
    except Exception as e:  # the hub raises many kinds (ConnectionError, FileNotFoundError ...)
        raise DataError(
            f"could not open {data_cfg.hf_dataset} ({data_cfg.hf_config}) split {hf_split}: {e}"
        ) from e
    n = 0
    with atomic_write(dest[0]) as fs, atomic_write(dest[1]) as ft:
        for rec in records:
            if max_pairs is not None and n >= max_pairs:
                break
            pair = rec["translation"]
            try:
                s, t = pair[src], pair[tgt]
            except KeyError as e:
                raise DataError(
                    f"{data_cfg.hf_dataset} ({data_cfg.hf_config}) split {hf_split} record {n}: "
                    f"no language {e} (has {sorted(pair)})"
                ) from e
            fs.write(_one_line(s) + "\n")
            ft.write(_one_line(t) + "\n")
            n += 1
    return n


def _sacrebleu_wmt14(src: str, tgt: str, dest: tuple[Path, Path]) -> int:
    """Copy sacreBLEU's ``wmt14`` test set (filtered newstest2014, 2737 lines) for ``src-tgt``."""
    import sacrebleu.utils

    langpair = f"{src}-{tgt}"
    try:
        paths = sacrebleu.utils.download_test_set("wmt14", langpair)
    except Exception as e:
        raise DataError(f"could not get sacreBLEU test set wmt14 ({langpair}): {e}") from e
    counts = []
    with atomic_write(dest[0]) as fs, atomic_write(dest[1]) as ft:
        for path, f in ((paths[0], fs), (paths[1], ft)):
            n = 0
            with open(path, encoding="utf-8", newline="\n") as inp:
                for line in inp:
                    f.write(_one_line(line.rstrip("\n")) + "\n")
                    n += 1
            counts.append(n)
        if counts[0] != counts[1]:
            raise DataError(
                f"sacreBLEU wmt14 ({langpair}): {paths[0]} has {counts[0]} lines but "
                f"{paths[1]} has {counts[1]}"
            )
    return counts[0]


# --- reading ------------------------------------------------------------------------------------


def open_binary(path: Path):
    """Open a plain or gzip file for reading bytes (gzip detected by its magic number)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_lines(path: Path, encoding_errors: str = "strict",
               stats: dict | None = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or gzip) without their ``\\n``.

    Only ``\\n`` ends a line; a stray ``\\r`` or U+2028 inside a line stays in it (cleaning
    removes it), so parallel files stay aligned.

    Args:
        path: the file.
        encoding_errors: ``strict`` (raise) or ``replace`` (U+FFFD for each bad byte).
        stats: if given, ``stats["invalid_utf8_lines"]`` counts lines that needed replacement.

    Raises:
        DataError: missing file; invalid UTF-8 under ``strict`` (names file, line and byte);
            a UTF-16 file (byte-order mark, under either setting); a truncated or damaged
            ``.gz`` (names the file and the last line read).
    """
    path = Path(path)
    _require_file(path, "input text")
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open_binary(path))
        lineno = 0
        try:
            for lineno, raw in enumerate(f, 1):
                if lineno == 1 and raw[:2] in _UTF16_BOMS:
                    raise DataError(
                        f"{path}: looks like UTF-16 ({_UTF16_BOMS[raw[:2]]} BOM "
                        f"{raw[:2].hex(' ').upper()}), not UTF-8; convert it first, e.g. "
                        f"iconv -f UTF-16 -t UTF-8 {path}"
                    )
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    if encoding_errors != "replace":
                        raise DataError(
                            f"{path}, line {lineno}: invalid UTF-8 at byte {e.start} "
                            f"({raw[max(0, e.start - 10):e.end + 10]!r}): {e.reason}; set "
                            "data.encoding_errors=replace to substitute U+FFFD"
                        ) from None
                    if stats is not None:
                        stats["invalid_utf8_lines"] = stats.get("invalid_utf8_lines", 0) + 1
                    line = raw.decode("utf-8", errors="replace")
                yield line
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DataError(
                f"{path}: damaged gzip file after line {lineno} ({type(e).__name__}: {e}); "
                "download or compress it again"
            ) from None


_UTF16_BOMS = {b"\xff\xfe": "little-endian", b"\xfe\xff": "big-endian"}
"""Byte-order marks of UTF-16 text (a UTF-16 file is not valid UTF-8)."""
