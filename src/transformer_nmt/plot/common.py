"""Saving and closing figures: through a temporary file and a rename (matplotlib's Agg backend)."""


from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt

from transformer_nmt.choices import PlotFormat
from transformer_nmt.fileio import output_path

log = logging.getLogger(__name__)


FORMATS = tuple(f.value for f in PlotFormat)
"""File formats of the figures (``plot.format``, :class:`transformer_nmt.choices.PlotFormat`)."""


# --------------------------------------------------------------------------------------
# Writing figures
# --------------------------------------------------------------------------------------


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: .png or .svg) atomically
    (:func:`transformer_nmt.fileio.output_path`: in place for a FIFO or device, through symlinks).

    Raises:
        ValueError: for a suffix other than .png or .svg.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"{path}: figures are written as {list(FORMATS)}, not {fmt!r}")
    with output_path(path, what="figure") as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi)
    log.info("wrote %s", path)
    return path


def close(fig: Any) -> None:
    """Release a figure returned by the plot functions."""
    plt.close(fig)
