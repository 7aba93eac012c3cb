"""File layout of the pipeline, all-or-nothing writes, and the one way text is read.

Every stage reads text through :func:`read_lines` (one line-splitting rule: ``\\n`` ends
a line, ``\\r\\n`` is accepted as its ending, a lone ``\\r`` stays inside the line) and
reports bad input as :class:`DataError`, naming the file and line.

Every stage writes through :func:`atomic_write` (a temporary file in the same folder,
renamed over the target on success), so a killed run never leaves a half-written
output that a later run would take as up to date.

Layout (``root`` is ``data.root``, ``name`` is ``data.name``)::

    <root>/raw/<name>/<split>.<lang>          cleaned text
    <root>/spm/<name>/spm.model               shared SentencePiece model
    <root>/bin/<name>/<split>.<lang>.bin/.idx token ids + offsets
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig

from transformer_nmt.config import DataConfig
from transformer_nmt.errors import UserError


class DataError(UserError):
    """Bad or missing input data; the message names the file, line and values at fault."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()
"""Permissions of finished outputs (mkstemp creates 0600 files; outputs follow the umask)."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` for code that writes a file by name (torch.save, spm).

    Yields a temporary path beside ``path``; renamed to ``path`` if the block succeeds.

    Raises:
        transformer_nmt.errors.NoSpaceError: the device is full ("no space left on device:
            <path>"); ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as e:
        full = _disk_full(e, path.parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if full:
            from transformer_nmt.errors import NoSpaceError

            raise NoSpaceError(f"no space left on device: {path}") from e
        raise


def _disk_full(e: BaseException, folder: Path) -> bool:
    """True when ``e`` is a failed write on a full device: ``OSError`` ENOSPC/EDQUOT, or
    torch.save's C++ writer (``RuntimeError`` "... file write failed") with no space left."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(e, RuntimeError) and "write failed" in str(e):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(folder).free < (1 << 20)
    return False


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary file beside ``path``; rename it to ``path`` only if the block succeeds.

    Args:
        path: final file path; its parent folders are created.
        mode: ``"w"`` (text, UTF-8 unless ``encoding`` is given) or ``"wb"``.
        **kwargs: passed to :func:`open`.

    Yields:
        The open temporary file.

    On an exception the temporary file is removed and the exception re-raised; ``path``
    is left as it was.
    """
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def is_up_to_date(outputs: list[Path], inputs: list[Path]) -> bool:
    """True when every output exists and none is older than any input (make's rule)."""
    if not all(p.exists() for p in outputs):
        return False
    if not inputs:
        return True
    newest_input = max(p.stat().st_mtime for p in inputs)
    return min(p.stat().st_mtime for p in outputs) >= newest_input


def finite_json(obj: Any) -> Any:
    """``obj`` with every float that is NaN or infinite replaced by None (JSON's null), so it
    can be written as strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as strict JSON (RFC 8259: a NaN or infinity is written as null,
    :func:`finite_json`), UTF-8 without escapes, ending in a newline, atomically
    (:func:`atomic_write`)."""
    text = json.dumps(finite_json(obj), indent=indent, ensure_ascii=False, allow_nan=False)
    with atomic_write(path) as f:
        f.write(text + "\n")


def raw_path(data_cfg: DataConfig | DictConfig, split: str, lang: str) -> Path:
    """Cleaned text of one split and language: ``<root>/raw/<name>/<split>.<lang>``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / f"{split}.{lang}"


def spm_model_path(data_cfg: DataConfig | DictConfig) -> Path:
    """The shared SentencePiece model: ``<root>/spm/<name>/spm.model``."""
    return Path(data_cfg.root) / "spm" / data_cfg.name / "spm.model"


def bin_prefix(data_cfg: DataConfig | DictConfig, split: str, lang: str) -> Path:
    """Prefix of the binarized files: ``<root>/bin/<name>/<split>.<lang>`` (+ .bin / .idx)."""
    return Path(data_cfg.root) / "bin" / data_cfg.name / f"{split}.{lang}"


# --- reading ------------------------------------------------------------------------------------

REPLACE_HINT = "set data.encoding_errors=replace to substitute U+FFFD"


def require_file(path: Path, what: str) -> Path:
    """``path`` if it is a file, else :class:`DataError` ``"<what>: file not found: <path>"``."""
    if not path.is_file():
        raise DataError(f"{what}: file not found: {path}")
    return path


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open a plain or gzip file for reading bytes (gzip detected by its magic number)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def file_digest(path: str | os.PathLike, decompressed: bool = False,
                chunk: int = 1 << 20) -> str:
    """SHA-256 (hex, as ``sha256sum`` prints it) of a file's bytes, read in ``chunk``-byte
    blocks; ``decompressed``: of a gzip file's content (:func:`open_binary`), so that a
    ``.gz`` and its plain copy compare equal."""
    h = hashlib.sha256()
    with (open_binary(path) if decompressed else open(path, "rb")) as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def iter_lines(
    f: Iterable[bytes],
    name: str,
    encoding_errors: str = "strict",
    stats: dict | None = None,
    hint: str | None = REPLACE_HINT,
) -> Iterator[str]:
    """Decode the lines of a binary stream (iterating it splits on ``\\n`` only).

    The ending ``\\n`` or ``\\r\\n`` is removed; a lone ``\\r`` (or U+2028, U+0085) inside
    a line stays in it (cleaning removes it), so parallel files stay aligned and a
    translation has exactly one output line per input line.

    Args:
        f: binary file object (plain, gzip, ``sys.stdin.buffer``).
        name: the file's name for messages.
        encoding_errors: ``strict`` (raise) or ``replace`` (U+FFFD for each bad byte).
        stats: if given, ``stats["invalid_utf8_lines"]`` counts lines that needed replacement.
        hint: appended to the invalid-UTF-8 message (how to get past it), or None.

    Raises:
        DataError: invalid UTF-8 under ``strict`` (names file, line and byte); a UTF-16 file
            (byte-order mark, under either setting); a truncated or damaged ``.gz`` (names the
            file and the last line read).
    """
    lineno = 0
    try:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw[:2] in _UTF16_BOMS:
                raise DataError(
                    f"{name}: looks like UTF-16 ({_UTF16_BOMS[raw[:2]]} BOM "
                    f"{raw[:2].hex(' ').upper()}), not UTF-8; convert it first, e.g. "
                    f"iconv -f UTF-16 -t UTF-8 {name}"
                )
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if encoding_errors != "replace":
                    raise DataError(
                        f"{name}, line {lineno}: invalid UTF-8 at byte {e.start} "
                        f"({raw[max(0, e.start - 10):e.end + 10]!r}): {e.reason}"
                        + (f"; {hint}" if hint else "")
                    ) from None
                if stats is not None:
                    stats["invalid_utf8_lines"] = stats.get("invalid_utf8_lines", 0) + 1
                line = raw.decode("utf-8", errors="replace")
            yield line
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(
            f"{name}: damaged gzip file after line {lineno} ({type(e).__name__}: {e}); "
            "download or compress it again"
        ) from None


_UTF16_BOMS = {b"\xff\xfe": "little-endian", b"\xfe\xff": "big-endian"}
"""Byte-order marks of UTF-16 text (a UTF-16 file is not valid UTF-8)."""


def read_lines(
    path: str | os.PathLike,
    encoding_errors: str = "strict",
    stats: dict | None = None,
    hint: str | None = REPLACE_HINT,
) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or gzip) without their endings.

    Lines as in :func:`iter_lines`; arguments as there.

    Raises:
        DataError: missing file; invalid UTF-8 under ``strict`` (names file, line and byte).
    """
    path = Path(path)
    require_file(path, "input text")
    with open_binary(path) as f:
        yield from iter_lines(f, str(path), encoding_errors, stats, hint)
