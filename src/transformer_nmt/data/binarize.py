"""Token ids on disk: cleaned text -> ``<prefix>.bin`` + ``<prefix>.idx``, read back O(1).

Format (one pair of files per split and language, ``fileio.bin_prefix``):

``<prefix>.bin``  the piece ids of every sentence, concatenated, without bos/eos;
                  ``uint16`` when the vocabulary has fewer than 65,536 pieces, else ``int32``.
``<prefix>.idx``  ``int64`` token offsets, ``n + 1`` entries: sentence ``i`` is
                  ``bin[idx[i]:idx[i+1]]``. The id width is ``bin bytes / idx[-1]``.

Encoding runs in ``data.num_workers`` processes (a ``multiprocessing`` pool over chunks of
lines, ``imap`` to keep the order). At most a few chunks per worker are in flight, so
memory stays bounded whatever the file size; offsets are written as they are produced.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path

import numpy as np

from transformer_nmt.config import UNK_ID
from transformer_nmt.errors import DataError
from transformer_nmt.fileio import atomic_write, read_lines

CHUNK_LINES = 4096
"""Lines per task sent to an encoder worker."""
IN_FLIGHT_PER_WORKER = 4
"""Chunks queued or being encoded per worker (bounds memory)."""


def id_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` for vocabularies below 65,536 pieces, else ``int32``."""
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.int32)


_worker_sp = None
_worker_dtype = None


def _init_worker(model_path: str, dtype: str) -> None:
    """Load the model in an encoder process. A forked worker inherits the command's SIGTERM
    handler (the run lock's, which exits through Python): the pool's ``terminate`` would then
    wait for a worker blocked in a lock, so workers die on SIGTERM at once as by default."""
    import sentencepiece as spm

    if mp.parent_process() is not None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    global _worker_sp, _worker_dtype
    _worker_sp = spm.SentencePieceProcessor(model_file=model_path)
    _worker_dtype = np.dtype(dtype)


def _encode_chunk(lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Worker: (ids of all lines concatenated, tokens per line int64)."""
    pieces = _worker_sp.encode(lines, out_type=int, num_threads=1)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    ids = np.fromiter(chain.from_iterable(pieces), dtype=_worker_dtype, count=int(lengths.sum()))
    return ids, lengths


def _chunks(lines: Iterator[str], size: int, gate: threading.Semaphore,
            stop: threading.Event) -> Iterator[list[str]]:
    """Chunks of ``size`` lines; waits on ``gate`` so that few chunks are in flight."""
    while True:
        gate.acquire()  # released when the main process has written a result
        if stop.is_set():
            return
        chunk = list(islice(lines, size))
        if not chunk:
            return
        yield chunk


def binarize_files(jobs: list[tuple[Path, Path]], model_path: Path, vocab_size: int,
                   num_workers: int = 1, chunk_lines: int = CHUNK_LINES) -> list[dict]:
    """Encode cleaned text files (one sentence per line) into ``prefix.bin`` / ``prefix.idx``.

    The text is expected to be normalised already (the cleaning stage), so it is encoded
    as is. One pool of ``num_workers`` encoder processes serves all files.

    Args:
        jobs: ``(text_path, prefix)`` pairs; ``.bin`` and ``.idx`` are appended to the prefix.
        model_path: the SentencePiece model.
        vocab_size: pieces in the model (chooses the id width).
        num_workers: encoder processes (1 = encode in this process).
        chunk_lines: lines per task.

    Returns:
        Per job ``{"sentences": n, "tokens": total ids, "unk": ids equal to unk}``.

    Raises:
        DataError: missing file or invalid UTF-8. The two files of a job are written
        atomically; on any error neither appears.
    """
    dtype = id_dtype(vocab_size)
    pool = None
    if num_workers > 1 and jobs:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        pool = ctx.Pool(num_workers, _init_worker, (str(model_path), dtype.str))
    else:
        _init_worker(str(model_path), dtype.str)
    try:
        return [_binarize_one(Path(text), Path(prefix), pool, max(1, num_workers), chunk_lines)
                for text, prefix in jobs]
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def _binarize_one(text_path: Path, prefix: Path, pool, num_workers: int,
                  chunk_lines: int) -> dict:
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    n = tokens = unk = 0
    gate = threading.Semaphore(num_workers * IN_FLIGHT_PER_WORKER)
    stop = threading.Event()
    chunks = _chunks(read_lines(text_path, "strict"), chunk_lines, gate, stop)
    results = pool.imap(_encode_chunk, chunks) if pool is not None else map(_encode_chunk, chunks)
    try:
        with atomic_write(bin_path, "wb") as fb, atomic_write(idx_path, "wb") as fi:
            fi.write(np.zeros(1, dtype=np.int64).tobytes())
            for ids, lengths in results:
                gate.release()
                fb.write(ids.tobytes())
                fi.write((tokens + np.cumsum(lengths)).tobytes())
                n += len(lengths)
                tokens += int(lengths.sum())
                unk += int(np.count_nonzero(ids == UNK_ID))
    finally:
        stop.set()
        gate.release()  # wake the chunk reader if it waits, so that it stops
    return {"sentences": n, "tokens": tokens, "unk": unk}


class TokenDataset:
    """Memory-mapped sentences of one split and language (O(1) random access).

    Args:
        prefix: ``fileio.bin_prefix(cfg.data, split, lang)``; reads ``prefix.bin`` / ``.idx``.

    ``len(ds)`` sentences; ``ds[i]`` -> ``np.ndarray`` int64 of shape ``(sizes[i],)`` (piece
    ids, no bos/eos); ``ds.sizes`` -> int64 array ``(len(ds),)`` of tokens per sentence.
    Pickles without its data (worker processes re-open the files).

    Raises:
        DataError: missing or inconsistent files.
        IndexError: index out of range.
    """

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = Path(prefix)
        self._open()

    def _open(self) -> None:
        bin_path, idx_path = Path(f"{self.prefix}.bin"), Path(f"{self.prefix}.idx")
        for p in (bin_path, idx_path):
            if not p.is_file():
                raise DataError(f"binarized file not found: {p} (run nmt-prepare first)")
        idx_bytes = idx_path.stat().st_size
        if idx_bytes < 8 or idx_bytes % 8:
            raise DataError(f"{idx_path}: {idx_bytes} bytes is not a list of int64 offsets")
        self._idx = np.memmap(idx_path, dtype=np.int64, mode="r")
        n_tokens = int(self._idx[-1])
        bin_bytes = bin_path.stat().st_size
        if n_tokens == 0:
            width = 2
        elif bin_bytes % n_tokens or bin_bytes // n_tokens not in (2, 4):
            raise DataError(
                f"{bin_path}: {bin_bytes} bytes do not hold the {n_tokens} ids that {idx_path} "
                "announces (files from different runs?)"
            )
        else:
            width = bin_bytes // n_tokens
        self.dtype = np.dtype(np.uint16) if width == 2 else np.dtype(np.int32)
        # np.memmap cannot map an empty file
        self._bin = (np.memmap(bin_path, dtype=self.dtype, mode="r") if n_tokens
                     else np.zeros(0, dtype=self.dtype))
        self._sizes = None

    def __len__(self) -> int:
        return len(self._idx) - 1

    @property
    def sizes(self) -> np.ndarray:
        """Tokens per sentence, int64 ``(len(ds),)``, without bos/eos."""
        if self._sizes is None:
            self._sizes = np.diff(self._idx).astype(np.int64)
        return self._sizes

    @property
    def ids(self) -> np.ndarray:
        """All ids of the file, concatenated (a read-only memory map, ``(num_tokens,)``)."""
        return self._bin

    @property
    def num_tokens(self) -> int:
        """Total ids in the file."""
        return int(self._idx[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sentence {i} out of range for {self.prefix} ({n} sentences)")
        start, end = int(self._idx[i]), int(self._idx[i + 1])
        return self._bin[start:end].astype(np.int64)

    def __getstate__(self) -> dict:
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.prefix = state["prefix"]
        self._open()


def max_train_tokens(max_positions: int, max_tokens: int) -> int:
    """Longest training sentence kept, in pieces without bos/eos: the model sees it with one
    more token (eos on the source, bos on the target), which must fit both the position
    table (``model.max_positions``) and one batch alone (``trainer.max_tokens``)."""
    return min(int(max_positions), int(max_tokens)) - 1


def filter_long_pairs(src_prefix: str | os.PathLike, tgt_prefix: str | os.PathLike,
                      max_len: int, block: int = 1 << 20) -> dict[str, int]:
    """Drop the pairs with more than ``max_len`` pieces on either side from the binarized
    ``src_prefix`` / ``tgt_prefix`` (rewritten in place, atomically, ``block`` sentences at a
    time; untouched when nothing is dropped).

    Whitespace-word limits of cleaning cannot see a long URL or an unspaced line that
    becomes hundreds of pieces; such a pair would overflow the position table or refuse to
    fit any batch.

    Returns:
        ``{"max_len", "kept", "dropped"}`` (pairs).

    Raises:
        DataError: the two sides hold different numbers of sentences.
    """
    src, tgt = TokenDataset(src_prefix), TokenDataset(tgt_prefix)
    if len(src) != len(tgt):
        raise DataError(f"{src.prefix} and {tgt.prefix} hold {len(src)} and {len(tgt)} sentences")
    keep = (src.sizes <= max_len) & (tgt.sizes <= max_len)  # (N,) bool
    dropped = int(len(keep) - keep.sum())
    if dropped:
        for ds in (src, tgt):
            _rewrite_kept(ds, keep, block)
    return {"max_len": int(max_len), "kept": int(keep.sum()), "dropped": dropped}


def _rewrite_kept(ds: TokenDataset, keep: np.ndarray, block: int) -> None:
    """Rewrite ``ds``'s ``.bin`` / ``.idx`` with only the sentences where ``keep`` is True."""
    sizes = ds.sizes
    offsets = np.asarray(ds._idx)
    with (atomic_write(f"{ds.prefix}.bin", "wb") as fbin,
          atomic_write(f"{ds.prefix}.idx", "wb") as fidx):
        np.zeros(1, dtype=np.int64).tofile(fidx)
        total = 0
        for lo in range(0, len(sizes), block):
            hi = min(lo + block, len(sizes))
            ids = np.asarray(ds.ids[offsets[lo]:offsets[hi]])  # this block's pieces
            kept = keep[lo:hi]
            ids[np.repeat(kept, sizes[lo:hi])].astype(ds.dtype).tofile(fbin)
            ends = total + np.cumsum(sizes[lo:hi][kept])
            ends.astype(np.int64).tofile(fidx)
            total = int(ends[-1]) if len(ends) else total
