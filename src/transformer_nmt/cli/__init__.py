"""Thin Hydra entry points, one per pipeline stage; each calls a plain function.

All of them compose ``configs/config.yaml`` (typed by :class:`transformer_nmt.config.Config`),
so ``nmt-train experiment=wmt14_en_de_base trainer.max_steps=1000`` works for every stage.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from transformer_nmt import config as _config  # registers the schema

CONFIG_DIR = os.environ.get(
    "NMT_CONFIG_DIR", str(Path(__file__).resolve().parents[3] / "configs")
)
"""Folder holding config.yaml and the config groups (the repository's configs/)."""


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the primary config with overrides, as an entry point would (for tests, scripts).

    Args:
        overrides: Hydra override strings, e.g. ``["experiment=multi30k_en_de", "trainer.max_steps=5"]``.

    Returns:
        The composed, validated config (struct mode: unknown keys raise).

    Raises:
        hydra.errors.ConfigCompositionException / omegaconf errors: unknown keys or groups.
        ValueError: from :func:`transformer_nmt.config.validate`.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    _config.validate(cfg)
    return cfg


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4


def retain_freed_memory() -> bool:
    """Let glibc malloc keep freed memory for reuse instead of handing it back to the OS.

    CPU tensors come from malloc. By default glibc serves large blocks (above a threshold
    that adapts up to 32 MiB) with fresh ``mmap`` pages and unmaps them when freed, and
    trims the heap's free top; a decoding step that allocates its (rows, vocabulary)
    log-probabilities, K/V and activations anew then pays a page fault (the kernel zeroing
    4 KiB) for every page of them, every step. With ``M_MMAP_MAX`` 0 (large blocks from the
    heap) and ``M_TRIM_THRESHOLD`` -1 (never trim), freed blocks are reused without faults;
    the process keeps its peak heap until it exits. The same as running with
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1`` in the environment, or preloading
    jemalloc / tcmalloc. ``nmt-translate`` and ``nmt-evaluate`` call it (docs/benchmarks.md:
    beam-search page faults and time with and without).

    Returns:
        True when applied; False where the C library is not glibc (macOS, musl), where
        nothing changes.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1
