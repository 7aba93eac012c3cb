"""File layout of the pipeline, all-or-nothing writes, and the one way text is read.

Every stage reads text through :func:`read_lines` (one line-splitting rule: ``\\n`` ends
a line, ``\\r\\n`` is accepted as its ending, a lone ``\\r`` stays inside the line) and
reports bad input as :class:`DataError`, naming the file and line.

Every stage writes through :func:`atomic_write` (a temporary file in the same folder,
renamed over the target on success), so a killed run never leaves a half-written
output that a later run would take as up to date. A path the user names
(``translate.output``, ``table.output``) goes through :func:`write_output`, which writes
through to a FIFO or device and through symlinks instead of replacing them, and refuses a
path that is an input or a model (:func:`check_output`). A write that fails for a cause the
user fixes (full disk, quota, file-size limit, read-only file system) is one
:class:`~transformer_nmt.errors.WriteError` line, whatever the library's wording
(:func:`write_error`).

Layout (``root`` is ``data.root``, ``name`` is ``data.name``)::

    <root>/raw/<name>/<split>.<lang>          cleaned text
    <root>/spm/<name>/spm.model               shared SentencePiece model
    <root>/bin/<name>/<split>.<lang>.bin/.idx token ids + offsets
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import logging
import math
import os
import re
import resource
import shutil
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig

from transformer_nmt.config import DataConfig
from transformer_nmt.errors import (  # noqa: F401  (DataError: re-exported)
    DataError,
    JsonFileError,
    NoSpaceError,
    UserError,
    WriteError,
)

log = logging.getLogger(__name__)


def umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~umask()
"""Permissions of finished outputs (mkstemp creates 0600 files; outputs follow the umask)."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` for code that writes a file by name (torch.save, spm).

    Yields a temporary path beside ``path`` (``.<name>.<random>.tmp``); renamed to ``path``
    if the block succeeds. While the block runs this process holds an exclusive ``flock`` on
    the temporary file, which is how :func:`remove_dead_temps` tells a live writer's file
    from one a killed writer left behind.

    Raises:
        transformer_nmt.errors.WriteError: the write failed for a cause the user fixes (a
            full device, a quota, the file-size limit, a read-only file system;
            :func:`write_error`); ``path`` is left as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        error = write_error(e, path)
        if error is None:
            raise
        raise error from e
    try:
        with contextlib.suppress(OSError):  # a file system without locks: never taken as dead
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield Path(tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as e:
        error = write_error(e, path, Path(tmp)) if isinstance(e, Exception) else None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if error is not None:
            raise error from e
        raise
    finally:
        os.close(fd)


WRITE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file-size limit (ulimit -f)",
    errno.EROFS: "read-only file system",
}
"""The causes of a failed write that are the user's to fix, by errno, and their words."""


_OS_ERROR = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+)")
"""An errno as Rust's ``std::io::Error`` writes it into a message (``File too large (os error
27)``, ``Os { code: 28, kind: StorageFull, ... }``): safetensors' ``SafetensorError``."""


def write_errno(e: BaseException, folder: Path | None = None, tmp: Path | None = None
                ) -> int | None:
    """The cause of a failed write as an errno of :data:`WRITE_ERRNOS`, else None.

    By the errno of ``e`` or of an ``OSError`` in its chain of causes, or the one a Rust
    library writes into its message (:data:`_OS_ERROR`: safetensors); for a ``RuntimeError``
    that hides the errno (torch's C++ writer says ``file write failed`` or ``basic_ios::clear:
    iostream error``, whatever the cause), by the state after the failed write: ENOSPC when
    ``folder``'s device has less than 1 MiB free, EFBIG when the partly written ``tmp``
    reached the process's file-size limit (``RLIMIT_FSIZE``: the kernel writes up to the limit,
    then fails).
    """
    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for link in chain:
        if isinstance(link, OSError) and link.errno is not None:
            return link.errno if link.errno in WRITE_ERRNOS else None
    for link in chain:  # a Rust library's io::Error in its message (safetensors)
        m = None if isinstance(link, UserError) else _OS_ERROR.search(str(link))
        if m is not None:
            code = int(m.group(1) or m.group(2))
            return code if code in WRITE_ERRNOS else None
    if not isinstance(chain[0], RuntimeError) or isinstance(chain[0], UserError):
        return None  # only a library's own write error hides the errno
    if folder is not None:
        with contextlib.suppress(OSError):
            if shutil.disk_usage(folder).free < (1 << 20):
                return errno.ENOSPC
    if tmp is not None:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        with contextlib.suppress(OSError):
            if limit != resource.RLIM_INFINITY and tmp.is_file() and tmp.stat().st_size >= limit:
                return errno.EFBIG
    return None


def write_error(e: BaseException, path: str | os.PathLike | None = None,
                tmp: Path | None = None) -> UserError | None:
    """The one-line error for a write of ``path`` that failed with ``e`` for a cause the user
    fixes (:func:`write_errno`), else None.

    Returns:
        :class:`~transformer_nmt.errors.NoSpaceError` ``"no space left on device: <path>"``
        (ENOSPC), else :class:`~transformer_nmt.errors.WriteError` ``"<cause>: <path>"``
        (EDQUOT, EFBIG with the limit in bytes, EROFS). Without ``path``, the file the
        ``OSError`` names, and an error that hides its errno is not classified.
    """
    folder = Path(path).parent if path is not None else None
    if path is None:
        path = getattr(e, "filename", None) or "<unknown file>"
    path = Path(path)
    code = write_errno(e, folder, tmp)
    if code is None:
        return None
    if code == errno.ENOSPC:
        return NoSpaceError(f"no space left on device: {path}")
    words = WRITE_ERRNOS[code]
    if code == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            words = f"file too large for the file-size limit of {limit:,} bytes (ulimit -f)"
    return WriteError(f"{words}: {path}")


def is_dead_temp(path: Path) -> bool:
    """True when no process holds the ``flock`` that :func:`atomic_path` keeps on its
    temporary file while it writes (the writer was killed); False for a live writer's file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a writer is at work
    finally:
        os.close(fd)  # closing releases our lock
    return True


def remove_dead_temps(folder: Path, pattern: str = ".*.tmp") -> list[Path]:
    """Delete the temporary files of :func:`atomic_path` writes in ``folder`` (those matching
    ``pattern``, e.g. ``.checkpoint_*.pt.*.tmp``) whose writer was killed
    (:func:`is_dead_temp`); a live writer's file is left alone. Returns the deleted paths."""
    removed = []
    if folder.is_dir():
        for p in sorted(folder.glob(pattern)):
            if p.is_file() and not p.is_symlink() and is_dead_temp(p):
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


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


# --- user-named outputs -------------------------------------------------------------------------

MODEL_SUFFIXES = (".pt", ".safetensors")
"""Suffixes of model files, which no text or figure output may overwrite."""


def check_output(path: str | os.PathLike, what: str,
                 inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """Refuse a user-named output (``what``, e.g. ``translate.output``) that would destroy
    something: a folder, a model file (``.pt``, ``.safetensors``, also behind a symlink), a
    file inside a run's ``checkpoints/`` folder (a folder of that name that holds ``.pt``
    files or sits beside a ``.hydra`` folder), or one of ``inputs`` (the same file, by device
    and inode, through any symlink or hard link).

    Returns:
        The path resolved through symlinks (where the bytes will go).

    Raises:
        UserError: naming the key, the path and why.
    """
    given = Path(path)
    real = Path(os.path.realpath(given))
    if real.is_dir():
        raise UserError(f"{what}={given} is a folder; give a file path")
    if any(p.suffix.lower() in MODEL_SUFFIXES for p in (given, real)):
        raise UserError(f"{what}={given} would overwrite a model file "
                        f"({real.suffix or given.suffix}); give another path")
    for folder in (real.parent, *real.parent.parents):
        if folder.name == "checkpoints" and (
                (folder.parent / ".hydra").is_dir() or next(folder.glob("*.pt"), None)):
            raise UserError(f"{what}={given} is inside a run's checkpoints/ folder ({folder});"
                            " give a path outside it")
    for source in inputs:
        if source is None:
            continue
        with contextlib.suppress(OSError):
            if os.path.samefile(real, source):
                raise UserError(f"{what}={given} is the input file {source}; give another path")
    return real


@contextlib.contextmanager
def output_path(path: str | os.PathLike, what: str = "output") -> Iterator[Path]:
    """Where to write a user-named output by name (a figure, a table), without replacing
    what the path names when it is not a regular file.

    A regular file (or a new path) is written through :func:`atomic_path`, at the end of any
    symlinks (the link stays a link); anything else (a FIFO, a character device such as
    ``/dev/null``, a terminal) is written in place, as a shell's ``>`` does. The path is first
    checked by :func:`check_output`.

    Raises:
        UserError: from :func:`check_output`; WriteError: as :func:`atomic_path`, also
            for a device that refuses the bytes (``/dev/full``).
    """
    real = check_output(path, what)
    if real.exists() and not real.is_file():
        try:
            yield real
        except OSError as e:
            error = write_error(e, path)
            if error is None:
                raise
            raise error from e
        return
    with atomic_path(real) as tmp:
        yield tmp


@contextlib.contextmanager
def write_output(path: str | os.PathLike, mode: str = "w", what: str = "output",
                 **kwargs: Any) -> Iterator[IO]:
    """Open a user-named output for writing (:func:`output_path`'s rules: atomically for a
    regular file, in place for a FIFO or device, through symlinks); ``mode`` and ``kwargs``
    as :func:`atomic_write`."""
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with output_path(path, what) as target, open(target, mode, **kwargs) as f:
        yield f
        f.flush()
        if target.is_file():
            os.fsync(f.fileno())


@contextlib.contextmanager
def created_folders_removed_when_empty(path: str | os.PathLike) -> Iterator[Path]:
    """Remove, when the block ends, the folders of ``path`` and above it that did not exist
    when it began and are empty then (a command that failed before writing anything leaves
    no folder behind). A folder that existed before, or that holds anything, is kept.

    Yields:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    try:
        yield path
    finally:
        for folder in missing:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty, or already gone: keep what is there
                if folder.exists():
                    break


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


JSON_MAX_BYTES, JSON_MAX_DEPTH = 64 << 20, 64
"""The most bytes and the deepest nesting :func:`read_json` accepts (far above our files')."""
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _int(text: str) -> int:
    if (digits := len(text.lstrip("-"))) > 308 and math.isinf(float(text)):
        raise OverflowError(f"holds a number too large for a float ({digits} digits)")
    return int(text)


def read_json(path: str | os.PathLike, max_bytes: int = JSON_MAX_BYTES, text: str | None = None
              ) -> Any:
    """The one reader of the project's JSON files (results.json, train_summary.json, caches;
    ``text``: a JSON text read from ``path`` already, e.g. one line): a regular file only,
    opened without blocking (never a FIFO or ``/dev/zero``), of at most ``max_bytes``; JSON
    nested deeper than :data:`JSON_MAX_DEPTH` or holding an integer too large for a float is
    refused here, before a reader's arithmetic or recursion fails on it.

    Raises:
        JsonFileError: ``<path>: <problem>``: ``not a regular file (a FIFO)``, ``larger than N
            bytes``, ``not UTF-8 text (…)``, ``not valid JSON (line N: …)``, ``nested deeper
            than 64 levels``, ``holds a number too large for a float (N digits)``.
    """
    if text is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise JsonFileError(path, f"cannot be read ({e.strerror or e})") from None
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            os.close(fd)
            raise JsonFileError(path, f"not a regular file ({_KINDS.get(stat.S_IFMT(mode))})")
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise JsonFileError(path, f"larger than {max_bytes:,} bytes, not a file of ours")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonFileError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(text, parse_int=_int)
        stack = [(obj, 1)]
        while stack:
            item, depth = stack.pop()
            if isinstance(item, (dict, list)):
                if depth > JSON_MAX_DEPTH:
                    raise RecursionError
                stack += [(x, depth + 1) for x in (item.values() if isinstance(item, dict)
                                                   else item)]
    except json.JSONDecodeError as e:
        raise JsonFileError(path, f"not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise JsonFileError(path, f"nested deeper than {JSON_MAX_DEPTH} levels") from None
    except (OverflowError, ValueError) as e:  # _int, the 4,300-digit limit of int()
        raise JsonFileError(path, str(e) if str(e).startswith("holds") else
                            f"holds a number that cannot be read ({e})") from None
    return obj


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
    translation has exactly one output line per input line. Each line is decoded on its own,
    so a message about invalid UTF-8 names the 1-based line that holds it
    (:func:`invalid_utf8`).

    Args:
        f: binary file object (plain, gzip, ``sys.stdin.buffer``).
        name: the file's name for messages.
        encoding_errors: ``strict`` (raise) or ``replace`` (U+FFFD for each bad byte; the
            first line replaced in the file is logged as a warning, naming line and bytes).
        stats: if given, ``stats["invalid_utf8_lines"]`` counts lines that needed replacement.
        hint: appended to the invalid-UTF-8 message (how to get past it), or None.

    Raises:
        DataError: invalid UTF-8 under ``strict`` (names file, line and byte); a UTF-16 file
            (byte-order mark, under either setting); a truncated or damaged ``.gz`` (names the
            file and the last line read).
    """
    lineno = 0
    warned = False
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
                        invalid_utf8(name, lineno, raw, e) + (f"; {hint}" if hint else "")
                    ) from None
                if not warned:
                    log.warning("%s; replaced by U+FFFD (data.encoding_errors=replace), as is "
                                "every invalid byte after it in this file",
                                invalid_utf8(name, lineno, raw, e))
                    warned = True
                if stats is not None:
                    stats["invalid_utf8_lines"] = stats.get("invalid_utf8_lines", 0) + 1
                line = raw.decode("utf-8", errors="replace")
            yield line
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(
            f"{name}: damaged gzip file after line {lineno} ({type(e).__name__}: {e}); "
            "download or compress it again"
        ) from None


def invalid_utf8(name: str, lineno: int, raw: bytes, error: UnicodeDecodeError) -> str:
    """``"<name>, line <lineno>: invalid UTF-8 at byte <i> (<bytes around it>): <reason>"``
    for the line ``raw`` (without its ending) that failed to decode with ``error``;
    ``lineno`` counts from 1, ``<i>`` from 0 within the line."""
    return (f"{name}, line {lineno}: invalid UTF-8 at byte {error.start} "
            f"({raw[max(0, error.start - 10):error.end + 10]!r}): {error.reason}")


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
