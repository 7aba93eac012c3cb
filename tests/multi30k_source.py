"""Where the tests find real Multi30k text (the ``multi30k_mirror`` fixture of conftest.py):
a local mirror (``$NMT_MULTI30K_MIRROR``, else ``../shared/data/multi30k`` beside the
repository), else a cache folder outside the repository filled once by the project's own
downloader (:func:`transformer_nmt.data.corpora.download`) from the official URL of
``configs/data/multi30k_en_de.yaml`` and reused by every later run; when neither works, the
tests that need it skip with the reason."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIRROR_ENV = "NMT_MULTI30K_MIRROR"
FILES = tuple(f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr",
                                                 "test_2017_flickr")
              for lang in ("en", "de", "fr"))
"""The files the tests read: every split of the English, German and French sides."""


def default_mirror() -> Path:
    """``$NMT_MULTI30K_MIRROR``, else ``../shared/data/multi30k`` beside the repository."""
    return Path(os.environ.get(MIRROR_ENV) or REPO.parent / "shared" / "data" / "multi30k")


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/transformer_nmt/multi30k`` (``~/.cache`` by default)."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return user / "transformer_nmt" / "multi30k"


def official_url() -> str:
    """``data.url`` of the Multi30k configs (where ``nmt-prepare`` downloads from)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(REPO / "configs" / "data" / "multi30k_en_de.yaml").url)


def _readable(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error):
        return False
    return True


def locate(mirror: Path, url: str, cache: Path, timeout_s: float = 30.0) -> tuple[Path | None, str]:
    """The folder with the Multi30k files, and why not when there is none.

    ``mirror`` when it holds ``train.en.gz``; else ``cache`` once it holds every file of
    :data:`FILES`, the missing ones downloaded from ``url`` (one process at a time: a lock
    file in ``cache``), each checked to be whole gzip before it counts.

    Returns:
        ``(folder, "")``, or ``(None, reason)`` naming the mirror, the URL and the failure.
    """
    from transformer_nmt.data.corpora import download
    from transformer_nmt.errors import DataError
    from transformer_nmt.fileio import created_folders_removed_when_empty

    if (mirror / "train.en.gz").is_file():
        return mirror, ""
    # a failed first download leaves no folder behind
    with created_folders_removed_when_empty(cache):
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with open(cache / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                for name in FILES:
                    path = cache / name
                    if path.is_file():
                        continue
                    download(f"{url.rstrip('/')}/{name}", path, timeout_s=timeout_s)
                    if not _readable(path):
                        path.unlink()
                        raise DataError(f"{url}/{name} is not a whole gzip file")
        except (DataError, OSError) as e:
            with contextlib.suppress(OSError):
                if [p.name for p in cache.iterdir()] == [".lock"]:
                    (cache / ".lock").unlink()
            return None, (f"Multi30k not found: no mirror at {mirror} (${MIRROR_ENV}), and the "
                          f"download into {cache} failed: {e}")
    return cache, ""
