"""BLEU of every kept checkpoint and of the average, drawn against the step (section 6.1);
the scores come from :func:`transformer_nmt.evaluate.checkpoint_bleu.checkpoint_bleu`."""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt

from transformer_nmt.plot.common import save_figure


def plot_checkpoint_bleu(
    results: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, dpi: int = 100
) -> Any:
    """BLEU of each kept checkpoint against its step, and of the averaged model, per run.

    The checkpoints are a line with dots; the averaged model is a star at the step of its
    newest input, with a dashed line across the steps it averages.

    Args:
        results: run label -> the rows of
            :func:`transformer_nmt.evaluate.checkpoint_bleu.checkpoint_bleu`.
        path: output .png or .svg (8 x 5 inches).

    Returns:
        The matplotlib Figure.
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    n_sent = set()
    for i, (label, rows) in enumerate(results.items()):
        color = colors[i % len(colors)]
        singles = [r for r in rows if r["averaged_from"] is None]
        ax.plot([r["step"] for r in singles], [r["bleu"] for r in singles], marker="o",
                color=color, label=f"{label}: single checkpoints")
        by_name = {r["label"]: r["step"] for r in singles}
        for r in rows:
            n_sent.add(r["sentences"])
            if r["averaged_from"] is None:
                continue
            steps = [by_name[n] for n in r["averaged_from"] if n in by_name]
            lo = min(steps) if steps else r["step"]
            ax.hlines(r["bleu"], lo, r["step"], colors=color, linestyles="dashed")
            ax.plot([r["step"]], [r["bleu"]], marker="*", markersize=14, color=color,
                    linestyle="none",
                    label=f"{label}: average of {len(r['averaged_from'])} "
                          f"({r['bleu']:.2f})")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("sacreBLEU (validation)")
    sent = ", ".join(str(n) for n in sorted(n_sent))
    ax.set_title(f"validation BLEU per checkpoint and after averaging ({sent} sentences)",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi)
    return fig
