"""File layout of the pipeline and all-or-nothing writes.

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
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


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


def raw_path(data_cfg: Any, split: str, lang: str) -> Path:
    """Cleaned text of one split and language: ``<root>/raw/<name>/<split>.<lang>``."""
    return Path(data_cfg.root) / "raw" / data_cfg.name / f"{split}.{lang}"


def spm_model_path(data_cfg: Any) -> Path:
    """The shared SentencePiece model: ``<root>/spm/<name>/spm.model``."""
    return Path(data_cfg.root) / "spm" / data_cfg.name / "spm.model"


def bin_prefix(data_cfg: Any, split: str, lang: str) -> Path:
    """Prefix of the binarized files: ``<root>/bin/<name>/<split>.<lang>`` (+ .bin / .idx)."""
    return Path(data_cfg.root) / "bin" / data_cfg.name / f"{split}.{lang}"
