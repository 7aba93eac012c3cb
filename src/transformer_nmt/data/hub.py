"""The ``datasets`` side of the WMT14 stream (:func:`transformer_nmt.data.corpora.fetch`).

* :func:`open_stream` opens one split of ``data.hf_dataset`` / ``data.hf_config`` as a
  stream: a dataset on the Hugging Face hub (``wmt/wmt14``), a local folder with its files
  as the hub stores them (parquet shards and the README's ``configs``), or a local folder
  written by ``DatasetDict.save_to_disk``. When the hub's host cannot be resolved (no
  network), the hub is not asked at all, and so not retried: the dataset is looked up in the
  local Hugging Face cache only, as under ``HF_HUB_OFFLINE=1``.
* :func:`is_network_error` tells a failed read that may heal (connection, timeout, HTTP 5xx:
  retried) from a fault of the data or of the settings (never retried), by the exception's
  type and the types of its causes, never by its message.
* :func:`record_pair` checks one record, ``{"translation": {src: text, tgt: text}}``.
* :class:`StreamProgress` shows the rows read: a tqdm bar on standard error when it is a
  terminal (not under ``TQDM_DISABLE=1``), and a log line every so many rows.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from transformer_nmt.errors import DataError

log = logging.getLogger(__name__)

OFFLINE_ADVICE = (
    "to run without network, give a local copy: data.hf_dataset=<folder> holding the "
    "dataset's files as the hub stores them (hf download <dataset> --repo-type dataset "
    "--local-dir <folder>) or a folder written by DatasetDict.save_to_disk, or set "
    "HF_HUB_OFFLINE=1 with the dataset in the Hugging Face cache (loaded once by "
    "datasets.load_dataset on a machine with network; docs/wmt14.md)"
)
"""What a user without network can do (the end of every error that says the hub is out of
reach)."""
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses of a read that may succeed when tried again."""


class RecordError(Exception):
    """A record that is not ``{"translation": {src: text, tgt: text}}``.

    Attributes:
        field: the field at fault (``translation``, ``translation.de``).
        problem: what is wrong with it (``null``, ``missing ...``, ``a list, not text``).
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field} is {problem}")
        self.field, self.problem = field, problem


def record_pair(rec: Any, src: str, tgt: str) -> tuple[str, str]:
    """The two texts of one record, checked.

    Raises:
        RecordError: no ``translation`` field, a null or non-mapping one, a language
            missing, null or not a string.
    """
    if not isinstance(rec, Mapping) or "translation" not in rec:
        have = sorted(rec) if isinstance(rec, Mapping) else type(rec).__name__
        raise RecordError("translation", f"missing (the record has {have})")
    pair = rec["translation"]
    if pair is None:
        raise RecordError("translation", "null")
    if not isinstance(pair, Mapping):
        raise RecordError("translation", f"a {type(pair).__name__}, not a mapping of "
                                         "language to text")
    texts = []
    for lang in (src, tgt):
        if lang not in pair:
            raise RecordError(f"translation.{lang}", f"missing (the record has {sorted(pair)})")
        text = pair[lang]
        if text is None:
            raise RecordError(f"translation.{lang}", "null")
        if not isinstance(text, str):
            raise RecordError(f"translation.{lang}", f"a {type(text).__name__}, not text")
        texts.append(text)
    return texts[0], texts[1]


# --- network or data -------------------------------------------------------------------------


def _network_types() -> tuple[type[BaseException], ...]:
    """Exception types of a connection that failed or timed out, in the libraries that the
    hub's clients use (those installed)."""
    found: list[type[BaseException]] = [
        ConnectionError, TimeoutError, socket.gaierror, socket.herror,
        http.client.IncompleteRead, http.client.RemoteDisconnected,
    ]
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests.exceptions", ("ConnectionError", "Timeout",
                                                   "ChunkedEncodingError")),
                          ("aiohttp", ("ClientConnectionError", "ClientPayloadError"))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    return tuple(found)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (``response.status_code``, ``status``, ``code``)."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is None and isinstance(exc, urllib.error.HTTPError):
        status = exc.code
    if status is None and type(exc).__module__.startswith("aiohttp"):
        status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_network_error(exc: BaseException) -> bool:
    """True when ``exc`` or one of its causes is a failed connection, a timeout or an HTTP
    status worth a retry (408, 429, 5xx): a read that may succeed when tried again."""
    network = _network_types()
    for e in _chain(exc):
        status = http_status(e)
        if status is not None:
            if status in RETRY_STATUS or status >= 500:
                return True
            continue  # 4xx: the request itself is wrong (not found, no access)
        if isinstance(e, network) or (isinstance(e, urllib.error.URLError)
                                      and not isinstance(e, urllib.error.HTTPError)):
            return True
    return False


def is_data_error(exc: BaseException) -> bool:
    """True when ``exc`` is a fault of the records or of their schema (a value of the wrong
    type, a missing field, columns that do not cast): reading again fails the same way."""
    types: list[type[BaseException]] = [ValueError, TypeError, KeyError, IndexError,
                                        RecordError]
    with contextlib.suppress(ImportError):
        import pyarrow
        types.append(pyarrow.lib.ArrowException)
    with contextlib.suppress(ImportError):
        import datasets.exceptions
        types.append(datasets.exceptions.DatasetsError)
    return isinstance(exc, tuple(types))


def type_and_message(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line (the libraries' messages span several)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- opening a split ------------------------------------------------------------------------


def is_local(hf_dataset: str) -> bool:
    """True when ``data.hf_dataset`` names a local folder (or file), not a hub dataset."""
    return Path(hf_dataset).expanduser().exists()


def _looks_like_a_path(hf_dataset: str) -> bool:
    return (hf_dataset.startswith((".", "/", "~")) or hf_dataset.count("/") > 1
            or os.sep != "/" and os.sep in hf_dataset)


def hub_host() -> str:
    """The host of the hub's endpoint (``HF_ENDPOINT``; ``huggingface.co`` by default)."""
    import datasets.config

    return urlparse(datasets.config.HF_ENDPOINT).hostname or "huggingface.co"


def hub_offline() -> bool:
    """True under ``HF_HUB_OFFLINE=1`` (the hub is never asked; its cache only)."""
    import datasets.config

    return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))


def host_resolves(host: str) -> bool:
    """True when ``host`` resolves (one DNS look-up, no retry), or when a proxy would do it."""
    proxies = urllib.request.getproxies()
    if proxies.get("https") or proxies.get("all"):
        return True
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except (socket.gaierror, socket.herror, UnicodeError):
        return False
    return True


@contextlib.contextmanager
def offline_mode() -> Iterator[None]:
    """The hub's offline mode within the block (what ``HF_HUB_OFFLINE=1`` sets when the
    libraries are imported): no request is made, the local cache is read."""
    import datasets.config
    import huggingface_hub.constants

    targets = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
               (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in targets if hasattr(mod, attr)]
    for mod, attr, _ in saved:
        setattr(mod, attr, True)
    try:
        yield
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)


def open_stream(hf_dataset: str | None, hf_config: str | None, split: str,
                resume_note: str = "") -> tuple[Any, int | None]:
    """One split of a dataset as a ``datasets.IterableDataset`` and its row count (None
    when the dataset does not say).

    Args:
        hf_dataset: ``data.hf_dataset``: a hub dataset (``wmt/wmt14``) or a local folder.
        hf_config: ``data.hf_config`` (ignored for a ``save_to_disk`` folder).
        split: the dataset's split (``train``, ``validation``).
        resume_note: appended to an error that the hub is out of reach (where a later run
            resumes).

    Raises:
        DataError: the hub is out of reach (how to run offline said), the dataset, its
            configuration or the split does not exist, ``data.hf_config`` is null where the
            dataset has several.
    """
    import datasets

    name = f"{hf_dataset} ({hf_config}) split {split}"
    if not hf_dataset:
        raise DataError("data.hf_dataset is not set: name a dataset of the hub (wmt/wmt14) "
                        "or a local folder with a copy of it")
    local = is_local(hf_dataset)
    if local and (Path(hf_dataset).expanduser() / "dataset_dict.json").is_file():
        return _open_saved(Path(hf_dataset).expanduser(), split)
    if not local and _looks_like_a_path(hf_dataset):
        raise DataError(f"data.hf_dataset={hf_dataset}: no such folder (a local copy of the "
                        "dataset, or a hub name such as wmt/wmt14)")
    offline = False
    if not local and not hub_offline():
        host = hub_host()
        if not host_resolves(host):
            offline = True
            log.warning("%s cannot be resolved (no network?): looking for %s in the local "
                        "Hugging Face cache only, as with HF_HUB_OFFLINE=1", host, hf_dataset)
    path = str(Path(hf_dataset).expanduser()) if local else hf_dataset
    try:
        with offline_mode() if offline else contextlib.nullcontext():
            records = datasets.load_dataset(path, hf_config, split=split, streaming=True)
    except Exception as e:  # the hub raises many kinds: told apart by type below
        if offline or is_network_error(e):
            if offline:
                why = (f"{hub_host()} cannot be resolved (no network?) and {hf_dataset} "
                       f"({hf_config}) is not in the Hugging Face cache")
            elif hub_offline() and not local:
                why = (f"HF_HUB_OFFLINE is set and {hf_dataset} ({hf_config}) is not in the "
                       f"Hugging Face cache ({type_and_message(e)})")
            else:
                why = f"cannot reach the Hugging Face hub for {name} ({type_and_message(e)})"
            raise DataError(f"{why}; {OFFLINE_ADVICE}{resume_note}") from e
        if hf_config is None and isinstance(e, ValueError):
            raise DataError(f"cannot open {name}: data.hf_config is null ({type_and_message(e)}); "
                            "set data.hf_config to one of the dataset's configurations, e.g. "
                            "data.hf_config=de-en") from e
        if isinstance(e, ValueError) and not isinstance(e, datasets.exceptions.DatasetsError):
            raise DataError(f"cannot open {name}: {type_and_message(e)}; check data.hf_config and "
                            "the split") from e
        raise DataError(f"cannot open {name}: {type_and_message(e)}; check data.hf_dataset (a hub "
                        "dataset such as wmt/wmt14, or a local folder with a copy of it)") from e
    return records, _rows_of(records, split)


def _rows_of(records: Any, split: str) -> int | None:
    splits = getattr(getattr(records, "info", None), "splits", None) or {}
    info = splits.get(split) if hasattr(splits, "get") else None
    rows = getattr(info, "num_examples", None)
    return rows if isinstance(rows, int) and rows > 0 else None


def _open_saved(folder: Path, split: str) -> tuple[Any, int]:
    """A split of a ``DatasetDict.save_to_disk`` folder, as a stream."""
    import datasets

    try:
        saved = datasets.load_from_disk(str(folder))
    except Exception as e:
        raise DataError(f"cannot read the saved dataset {folder}: {type_and_message(e)}") from e
    if split not in saved:
        raise DataError(f"the saved dataset {folder} has no split {split!r} (has "
                        f"{sorted(saved)}); save the hub's splits train and validation")
    return saved[split].to_iterable_dataset(), len(saved[split])


# --- progress -------------------------------------------------------------------------------


def bar_wanted(stream: Any = None) -> bool:
    """A progress bar only on a terminal, and not under ``TQDM_DISABLE=1`` (any value but
    empty, ``0``, ``false``, ``no``)."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StreamProgress:
    """Rows read from a stream: a tqdm bar on standard error (:func:`bar_wanted`) and an
    INFO log line every ``log_every`` rows (so that log files show progress too).

    Args:
        desc: what is read (``wmt/wmt14 (de-en) split train``).
        total: the rows expected (None: unknown; the bar then counts without an end).
        start: rows already there (a resumed stream).
        log_every: rows between two log lines.
    """

    STEP = 1000
    """Rows between two updates of the bar (keeps its cost out of the loop)."""

    def __init__(self, desc: str, total: int | None, start: int, log_every: int):
        from tqdm import tqdm

        self.desc, self.total, self.log_every = desc, total, log_every
        self.started, self.start = time.monotonic(), start
        self.shown = bar_wanted()
        self.bar = tqdm(total=total, initial=start, desc=desc, unit=" rows", unit_scale=True,
                        file=sys.stderr, disable=not self.shown, dynamic_ncols=True,
                        mininterval=0.5)
        self._redirect = contextlib.ExitStack()
        if self.shown:  # log lines above the bar, not through it
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._redirect.enter_context(logging_redirect_tqdm())

    def update(self, rows: int) -> None:
        """``rows`` read so far (called for every row)."""
        if rows % self.STEP == 0:
            self.bar.update(rows - self.bar.n)
        if rows % self.log_every == 0:
            seconds = max(time.monotonic() - self.started, 1e-9)
            of = (f" of {self.total:,} ({100 * rows / self.total:.0f} %)"
                  if self.total else "")
            log.info("%s: %s rows%s, %s rows/s", self.desc, f"{rows:,}", of,
                     f"{(rows - self.start) / seconds:,.0f}")

    def restart(self, rows: int) -> None:
        """Go back to ``rows`` (a retry from the saved position)."""
        self.bar.n = rows
        self.bar.refresh()

    def close(self, rows: int) -> None:
        """Show the final count and remove the bar's redirection of the log."""
        self.bar.update(rows - self.bar.n)
        self.bar.close()
        self._redirect.close()
