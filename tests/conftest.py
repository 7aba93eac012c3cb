"""Shared fixtures: the real Multi30k mirror and config composition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MULTI30K_MIRROR = Path(
    os.environ.get("NMT_MULTI30K_MIRROR") or REPO.parent / "shared" / "data" / "multi30k"
)


@pytest.fixture(scope="session")
def multi30k_mirror() -> Path:
    """Folder with the real Multi30k files (train.en.gz, ...); tests that need it skip without it."""
    if not (MULTI30K_MIRROR / "train.en.gz").exists():
        pytest.skip(f"Multi30k mirror not found at {MULTI30K_MIRROR}")
    return MULTI30K_MIRROR
