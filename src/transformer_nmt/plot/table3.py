"""The Table 3 figure: each row's BLEU difference to its base row, ours beside the paper's."""


from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
import numpy as np

from transformer_nmt.plot.common import save_figure

# --------------------------------------------------------------------------------------
# Table 3
# --------------------------------------------------------------------------------------


def plot_table3(experiment: str, lines: Sequence[Any], path: str | Path,
                kind: str = "paper_bleu") -> Path:
    """Each Table 3 row's dev BLEU difference to its base row, ours beside the paper's.

    Args:
        experiment: the base experiment's name (the title).
        lines: :class:`transformer_nmt.evaluate.table3_groups.Table3Line` objects of one
            experiment, the rows compared with the base row (``nmt-table`` leaves out rows of
            other settings and short runs); the one whose ``variant`` is ``base`` defines zero
            and, with two or more seeds, the seed-noise band (± one and two standard
            deviations of its BLEU).
        path: the figure (.png or .svg), written atomically.
        kind: the BLEU of results.json to draw (``paper_bleu`` or ``sacrebleu``).

    Returns:
        ``path``.

    Raises:
        ValueError: no base row among ``lines`` (nothing to take differences from).
    """
    base = next((x for x in lines if x.variant == "base"), None)
    if base is None or not base.values(kind):
        raise ValueError(
            f"{experiment}: no evaluated base row; Table 3 differences need table3=base")
    base_scores = base.values(kind)
    base_mean = float(np.mean(base_scores))
    base_std = float(np.std(base_scores, ddof=1)) if len(base_scores) > 1 else None
    paper_base = base.paper.bleu if base.paper else None
    rows = [x for x in lines if x is not base and x.values(kind)]
    labels = [f"({x.paper.row}) {x.paper.change}" if x.paper else x.variant for x in rows]
    ours = [float(np.mean(x.values(kind))) - base_mean for x in rows]
    spread = [float(np.std(x.values(kind), ddof=1)) if len(x.values(kind)) > 1 else 0.0
              for x in rows]
    paper = [x.paper.bleu - paper_base if x.paper and paper_base is not None else np.nan
             for x in rows]
    y = np.arange(len(rows))[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.6))
    if base_std is not None:
        ax.axvspan(-2 * base_std, 2 * base_std, color="0.92", label="base seed noise ±2σ")
        ax.axvspan(-base_std, base_std, color="0.82", label="base seed noise ±1σ")
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.barh(y + 0.18, ours, height=0.36, xerr=spread, color="tab:blue", label="ours")
    ax.barh(y - 0.18, paper, height=0.36, color="tab:orange", label="paper")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(f"dev BLEU difference to the base row ({kind})")
    ax.set_title(f"Table 3 rows: {experiment}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
