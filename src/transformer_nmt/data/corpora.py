"""Where each corpus comes from: the first stage of the pipeline (download).

Three kinds of source (``data.corpus``):

* ``multi30k``: the official Multi30k task-1 files ``<split>.<lang>.gz`` (Elliott et al.,
  2016), read in place from a local mirror folder (``data.mirror`` or the environment
  variable ``NMT_MULTI30K_MIRROR``) or downloaded from ``data.url`` into
  ``<root>/raw/<name>/orig/``. Official split names ``train``, ``val``,
  ``test_2016_flickr``, ``test_2017_flickr``; ``val`` becomes ``data.valid_split``.
* ``wmt14``: the Hugging Face ``datasets`` library (``data.hf_dataset`` / ``data.hf_config``),
  streamed record by record to ``<root>/raw/<name>/orig/<split>.<lang>``: ``train`` and
  ``validation`` (newstest2013, the valid split). The test sets are sacreBLEU's own copies,
  copied byte for byte: ``newstest2014`` is sacreBLEU ``wmt14/full`` (3,003 lines, the set
  fairseq and NVIDIA report on) and ``newstest2014_filtered`` is sacreBLEU ``wmt14`` (the
  filtered ``test-filtered.tgz``: 2,737 lines for EN-DE; sacreBLEU's dataset definition names
  files and checksums, not line counts, so the count found is recorded in
  ``orig/<split>.json``).
* ``custom``: the user's files ``<prefix>.<src_lang>`` / ``<prefix>.<tgt_lang>`` named per
  split in ``data.custom_files``.

:func:`fetch` returns, per split, the two original text files (plain or gzip) that the
cleaning stage reads with :func:`read_lines`, and keeps the target side of every test split
untouched as the official reference, ``<root>/raw/<name>/ref/<split>.<tgt>``
(:func:`reference_path`): the bytes as distributed (decompressed), which cleaning never
rewrites and which ``nmt-evaluate`` scores against.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from transformer_nmt.config import Corpus, DataConfig
from transformer_nmt.data import hub
from transformer_nmt.errors import DataError
from transformer_nmt.fileio import (  # noqa: F401  (read_lines: re-exported)
    atomic_write,
    file_digest,
    is_up_to_date,
    open_binary,
    read_lines,
    require_file,
)

log = logging.getLogger(__name__)

CORPORA = tuple(m.value for m in Corpus)  # ("multi30k", "wmt14", "custom")
MIRROR_ENV = "NMT_MULTI30K_MIRROR"
MULTI30K_VALID = "val"
"""Official name of the Multi30k validation split (stored on disk as ``data.valid_split``)."""
WMT14_HF_SPLITS = {"train": "train", "newstest2013": "validation"}
"""Our split name -> the ``datasets`` split of ``wmt/wmt14``."""
WMT14_FILTERED = "newstest2014_filtered"
"""The filtered newstest2014 (sacreBLEU test set ``wmt14``; 2,737 lines for EN-DE)."""
WMT14_SACREBLEU = {"newstest2014": "wmt14/full", WMT14_FILTERED: "wmt14"}
"""Our test split name -> sacreBLEU's test set (newstest2014 full, 3,003 lines; filtered)."""
WMT14_OFFICIAL_LINES = {("newstest2014", "de"): 3003, ("newstest2014", "fr"): 3003,
                        (WMT14_FILTERED, "de"): 2737}
"""Lines of the official WMT14 test sets (sacreBLEU's copies), by our split and the language
paired with English; a copy with another count (a truncated download or cache) is refused.
The dev set comes from ``data.hf_dataset``, which may be a smaller local folder on purpose."""
REFERENCE_DIR = "ref"
"""Folder under ``<root>/raw/<name>/`` holding the official references of the test splits."""


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


def orig_dir(data_cfg: DataConfig) -> Path:
    """Folder for downloaded or streamed originals: ``<root>/raw/<name>/orig``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / "orig"


def reference_path(data_cfg: DataConfig, split: str, lang: str) -> Path:
    """The official reference text of a test split: ``<root>/raw/<name>/ref/<split>.<lang>``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / REFERENCE_DIR / f"{split}.{lang}"


def keep_references(data_cfg: DataConfig, sources: list[SplitSource]) -> list[Path]:
    """Copy the target side of every test split and of the validation split, byte for byte
    (gzip decompressed), to :func:`reference_path`; a copy with the original's content is
    left as it is (compared by SHA-256, whatever the files' times: a second corpus prepared
    under the same ``data.name`` from older files replaces the first one's references).

    Returns:
        The reference files, one per test split.
    """
    tests = {data_cfg.valid_split, *data_cfg.test_splits}  # the dev set too (Table 3's BLEU)
    out = []
    for source in sources:
        if source.split not in tests:
            continue
        dest = reference_path(data_cfg, source.split, data_cfg.tgt_lang)
        if not dest.is_file() or (
                file_digest(dest, decompressed=True) != file_digest(source.tgt, decompressed=True)):
            with open_binary(source.tgt) as inp, atomic_write(dest, "wb") as f:
                shutil.copyfileobj(inp, f, length=1 << 20)
            log.info("official reference %s -> %s", source.tgt, dest)
        out.append(dest)
    return out


def splits(data_cfg: DataConfig) -> list[str]:
    """All split names of a corpus, training split first: train, valid, then each test split."""
    names = [data_cfg.train_split, data_cfg.valid_split, *list(data_cfg.test_splits)]
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def fetch(data_cfg: DataConfig) -> tuple[list[SplitSource], bool]:
    """Make the original text of every split available on local disk.

    Args:
        data_cfg: ``cfg.data`` (:class:`transformer_nmt.config.DataConfig`).

    Returns:
        ``(sources, did_work)``: one :class:`SplitSource` per split (training split first)
        and whether anything was downloaded or streamed (False when all was already there).
        The official references are written too (:func:`keep_references`).

    Raises:
        DataError: unknown ``data.corpus``, missing file or folder, failed download,
            a split name the corpus does not provide.
    """
    corpus = data_cfg.corpus
    if corpus == "multi30k":
        sources, did_work = _fetch_multi30k(data_cfg)
    elif corpus == "wmt14":
        sources, did_work = _fetch_wmt14(data_cfg)
    elif corpus == "custom":
        sources, did_work = _custom_sources(data_cfg), False
    else:
        raise DataError(
            f"unknown corpus data.corpus={corpus!r} (data.name={data_cfg.name!r}): "
            f"expected one of {list(CORPORA)}"
        )
    keep_references(data_cfg, sources)
    return sources, did_work


def official_lines(data_cfg: DataConfig, split: str) -> int | None:
    """The official line count of a WMT14 test split (:data:`WMT14_OFFICIAL_LINES`), or None
    (another corpus, a split without one)."""
    if str(data_cfg.corpus) != "wmt14":
        return None
    other = data_cfg.tgt_lang if data_cfg.src_lang == "en" else data_cfg.src_lang
    return WMT14_OFFICIAL_LINES.get((split, other))


def _max_pairs(data_cfg: DataConfig, split: str) -> int | None:
    return data_cfg.max_train_pairs if split == data_cfg.train_split else None


# --- Multi30k ------------------------------------------------------------------------------


def multi30k_mirror(data_cfg: DataConfig) -> Path | None:
    """The local mirror folder: ``data.mirror``, else ``$NMT_MULTI30K_MIRROR``; empty = unset."""
    mirror = data_cfg.mirror or os.environ.get(MIRROR_ENV) or None
    return Path(mirror) if mirror else None


def _multi30k_official(data_cfg: DataConfig, split: str) -> str:
    if split == data_cfg.valid_split:
        return MULTI30K_VALID
    return split


def _fetch_multi30k(data_cfg: DataConfig) -> tuple[list[SplitSource], bool]:
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
                require_file(path, f"Multi30k {split} ({lang}) in mirror {mirror}")
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


def _custom_sources(data_cfg: DataConfig) -> list[SplitSource]:
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
            paths.append(require_file(path, f"data.custom_files.{split} ({lang})"))
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


def _fetch_wmt14(data_cfg: DataConfig) -> tuple[list[SplitSource], bool]:
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    out = orig_dir(data_cfg)
    did_work = False
    sources = []
    for split in splits(data_cfg):
        dest = (out / f"{split}.{src}", out / f"{split}.{tgt}")
        stamp = out / f"{split}.json"
        max_pairs = _max_pairs(data_cfg, split)
        if not (dest[0].is_file() and dest[1].is_file() and _wmt14_stamp_ok(stamp, max_pairs)):
            if split in WMT14_SACREBLEU:
                n = _sacrebleu_test_set(WMT14_SACREBLEU[split], src, tgt, dest)
            elif split in WMT14_HF_SPLITS:
                n = _stream_hf(data_cfg, WMT14_HF_SPLITS[split], dest, max_pairs)
            else:
                raise DataError(
                    f"WMT14 has no split {split!r}: expected one of "
                    f"{sorted([*WMT14_HF_SPLITS, *WMT14_SACREBLEU])}"
                )
            expected = official_lines(data_cfg, split)
            if expected is not None and max_pairs is None and n != expected:
                for p in dest:
                    p.unlink(missing_ok=True)
                raise DataError(
                    f"WMT14 {split} ({src}-{tgt}) has {n} lines, not the official {expected}: "
                    "the downloaded copy is truncated or damaged; delete it (sacreBLEU keeps "
                    "test sets under ~/.sacrebleu or $SACREBLEU, the datasets library under "
                    "~/.cache/huggingface) and run nmt-prepare again")
            with atomic_write(stamp) as f:
                json.dump({"pairs": n, "max_pairs": max_pairs}, f)
            did_work = True
        sources.append(SplitSource(split, dest[0], dest[1], split == data_cfg.train_split,
                                   max_pairs))
    return sources, did_work


def _one_line(text: str) -> str:
    """A record's text on one line (a newline inside a record would break the alignment)."""
    return text.replace("\r", " ").replace("\n", " ")


STREAM_CHECKPOINT_ROWS = 200_000
"""Rows between two saved positions of a ``datasets`` stream (what a resumed stream re-reads)."""
STREAM_RETRIES = 3
"""Reads of a stream that failed for the network, retried in the same process (each from the
last saved position); a fault of the data is never retried."""
STREAM_LOG_ROWS = 500_000
"""Rows between two log lines of a stream's progress."""


def _stream_progress(dest: tuple[Path, Path]) -> tuple[tuple[Path, Path], Path]:
    """The partial output files of a stream and the JSON file holding its saved position."""
    partial = (dest[0].with_name(dest[0].name + ".partial"),
               dest[1].with_name(dest[1].name + ".partial"))
    return partial, dest[0].with_name(dest[0].name + ".partial.json")


def _resume_point(partial: tuple[Path, Path], progress: Path, ident: dict) -> dict | None:
    """The saved position of an interrupted stream of the same source, with the partial files
    truncated to it; None (and no partial files) when there is nothing to resume."""
    saved = None
    if progress.is_file() and partial[0].is_file() and partial[1].is_file():
        with contextlib.suppress(ValueError, OSError):
            saved = json.loads(progress.read_text())
    if not saved or saved.get("source") != ident:
        for path in (*partial, progress):
            path.unlink(missing_ok=True)
        return None
    for path, size in zip(partial, saved["bytes"]):
        with open(path, "r+b") as f:
            f.truncate(size)
    return saved


def _stream_hf(data_cfg: DataConfig, hf_split: str, dest: tuple[Path, Path],
               max_pairs: int | None) -> int:
    """Stream ``{"translation": {lang: text}}`` records of one split to two text files.

    Memory is bounded: records are written as they arrive (``streaming=True``). Every
    :data:`STREAM_CHECKPOINT_ROWS` rows the files are flushed and the stream's position
    (``IterableDataset.state_dict()``) saved beside them, so a read that failed for the
    network (:func:`transformer_nmt.data.hub.is_network_error`) is retried from there
    (:data:`STREAM_RETRIES` times) and a later run resumes an interrupted stream instead of
    starting again from row 0. A fault of the data or of its schema (a null or missing
    field, a value of another type, columns that do not cast) is never retried: it fails
    at once, naming the row and the field. The rows read are shown as they come
    (:class:`transformer_nmt.data.hub.StreamProgress`, a log line every
    :data:`STREAM_LOG_ROWS`). ``dest`` appears only once the split is complete.

    Returns:
        Number of pairs written.

    Raises:
        DataError: the dataset cannot be opened (how to run offline said when the hub is
            out of reach), a record or the schema is at fault (dataset, split, row and field
            named), or the stream kept failing for the network (the message says from which
            row the next run resumes).
    """
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    name = f"{data_cfg.hf_dataset} ({data_cfg.hf_config}) split {hf_split}"
    ident = {"dataset": str(data_cfg.hf_dataset), "config": data_cfg.hf_config,
             "split": hf_split, "langs": [src, tgt]}
    partial, progress = _stream_progress(dest)
    saved = _resume_point(partial, progress, ident)
    failures = 0
    shown = None
    try:
        while True:
            n = saved["rows"] if saved else 0
            log.info("streaming %s -> %s%s", name, dest[0].parent,
                     f" (resuming at row {n:,})" if n else "")
            records, total = hub.open_stream(
                data_cfg.hf_dataset, data_cfg.hf_config, hf_split,
                f"; run the same command again to resume at row {n:,}" if n else "")
            if saved:
                records.load_state_dict(saved["state"])
            if max_pairs is not None:
                total = min(total, max_pairs) if total else max_pairs
            if shown is None:
                shown = hub.StreamProgress(name, total, n, STREAM_LOG_ROWS)
            else:
                shown.restart(n)
            dest[0].parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(partial[0], "ab") as fs, open(partial[1], "ab") as ft:
                    for rec in records:
                        if max_pairs is not None and n >= max_pairs:
                            break
                        s, t = hub.record_pair(rec, src, tgt)
                        fs.write((_one_line(s) + "\n").encode("utf-8"))
                        ft.write((_one_line(t) + "\n").encode("utf-8"))
                        n += 1
                        shown.update(n)
                        if n % STREAM_CHECKPOINT_ROWS == 0:
                            saved = _save_stream_position(fs, ft, progress, ident, n, records)
                break
            except hub.RecordError as e:
                raise DataError(
                    f"{name}, row {n:,} (counted from 0): {e}; records must be "
                    f'{{"translation": {{"{src}": <text>, "{tgt}": <text>}}}}. A fault of the '
                    "data, not of the network, so it is not retried: check data.hf_config, "
                    "data.src_lang and data.tgt_lang, or fix that record in a local copy "
                    "(data.hf_dataset=<folder>)") from None
            except Exception as e:  # told apart by type: network, data, anything else
                if not hub.is_network_error(e):
                    if hub.is_data_error(e):
                        raise DataError(
                            f"{name}, row {n:,} (counted from 0): cannot read the record: "
                            f"{hub.type_and_message(e)}. A fault of the data or of its schema, "
                            "not of the network, so it is not retried: check data.hf_dataset and "
                            "data.hf_config (in a local copy, every file of a split must hold "
                            "one translation column of the same two languages)") from e
                    status = hub.http_status(e)
                    if status is not None and 400 <= status < 500:
                        raise DataError(
                            f"{name}, row {n:,}: the hub refused a read with HTTP {status} "
                            f"({hub.type_and_message(e)}), so it is not retried: check that the "
                            "dataset exists and that your Hugging Face token may read it "
                            "(hf auth login)") from e
                    raise
                failures += 1
                at = saved["rows"] if saved else 0
                if failures > STREAM_RETRIES:
                    raise DataError(
                        f"reading {name} failed {failures} times, last at row {n:,}: "
                        f"{hub.type_and_message(e)}; run the same command again to resume at row "
                        f"{at:,}") from e
                log.warning("reading %s failed at row %d (%s); retrying from row %d", name, n,
                            hub.type_and_message(e), at)
                saved = _resume_point(partial, progress, ident)
    except BaseException:
        if not progress.is_file():  # nothing a later run could resume from
            for path in partial:
                path.unlink(missing_ok=True)
        raise
    finally:
        if shown is not None:
            shown.close(n)
    for part, final in zip(partial, dest):
        os.replace(part, final)
    progress.unlink(missing_ok=True)
    return n


def _save_stream_position(fs, ft, progress: Path, ident: dict, rows: int, records) -> dict:
    """Flush both partial files to disk and save the stream position reached after ``rows``."""
    for f in (fs, ft):
        f.flush()
        os.fsync(f.fileno())
    saved = {"source": ident, "rows": rows, "bytes": [fs.tell(), ft.tell()],
             "state": records.state_dict()}
    with atomic_write(progress) as f:
        json.dump(saved, f)
    return saved


def _sacrebleu_test_set(test_set: str, src: str, tgt: str, dest: tuple[Path, Path]) -> int:
    """Copy sacreBLEU's plain-text source and reference of ``test_set`` for ``src-tgt``
    byte for byte (what ``sacrebleu -t <test_set> -l <src>-<tgt> --echo src|ref`` prints).

    Returns:
        The number of lines (the same in both files).

    Raises:
        DataError: the test set cannot be had, or the two files differ in line count.
    """
    import sacrebleu.utils

    langpair = f"{src}-{tgt}"
    try:
        paths = sacrebleu.utils.download_test_set(test_set, langpair)
    except Exception as e:
        advice = ("; without network, copy sacreBLEU's folder (~/.sacrebleu, or $SACREBLEU) from "
                  "a machine that has fetched the test set, or leave the split out of "
                  "data.test_splits") if hub.is_network_error(e) else ""
        raise DataError(f"could not get sacreBLEU test set {test_set} ({langpair}): "
                        f"{hub.type_and_message(e)}{advice}") from e
    counts = []
    for path, out in zip(paths[:2], dest):
        with open(path, "rb") as inp, atomic_write(out, "wb") as f:
            data = inp.read()
            f.write(data)
        counts.append(data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0))
    if counts[0] != counts[1]:
        for out in dest:
            out.unlink(missing_ok=True)
        raise DataError(
            f"sacreBLEU {test_set} ({langpair}): {paths[0]} has {counts[0]} lines but "
            f"{paths[1]} has {counts[1]}"
        )
    log.info("sacreBLEU %s (%s): %d lines", test_set, langpair, counts[0])
    return counts[0]
