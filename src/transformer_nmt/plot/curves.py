"""Training curves from ``runs/<name>/metrics.jsonl``.

:func:`read_metrics` reads the lines the training loop writes (``{"split", "step", "time",
...values}``) into one history per split, with the records a resumed run re-did taken from
the resumed segment only; :func:`plot_curves` draws train loss and valid perplexity against
steps and against target tokens seen, the learning rate, tokens/s, the gradient norm and
the skipped steps, one colour per run.
"""


from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
import numpy as np

from transformer_nmt.errors import DataError, JsonFileError
from transformer_nmt.fileio import invalid_utf8, read_json
from transformer_nmt.plot.common import save_figure

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# metrics.jsonl
# --------------------------------------------------------------------------------------


def read_metrics(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Per-split histories of a run's ``metrics.jsonl``, one record per step, steps increasing.

    A resumed run restarts from its latest checkpoint at step r and appends to the same
    file; the records the interrupted run had written after r (its state was never saved)
    are then written again, with possibly different values, by the resumed run. A record
    whose step is not above the previous record of its split therefore starts a resumed
    segment, and every earlier record (of any split) at that step or later is dropped:
    the kept history is the one the checkpoints continue. Keeping "the last record of each
    step" instead would also keep the interrupted run's records past the point the resumed
    run stopped at, which no checkpoint continues.

    Args:
        path: the ``metrics.jsonl`` file.

    Returns:
        ``{split: [record, ...]}`` (``"train"``, ``"valid"``), each list sorted by a
        strictly increasing ``step``.

    Raises:
        FileNotFoundError: naming the file.
        DataError (a UserError): naming the file and line of a line that is not UTF-8 or
            not a JSON object with an integer ``step`` and a ``split``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the training loop writes it; train first)")
    records: list[dict[str, Any]] = []
    last_step: dict[str, int] = {}
    with open(path, "rb") as f:  # decoded line by line: a bad byte is named by its own line
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not raw.endswith(b"\n"):  # a write cut short by a kill
                    log.warning("%s, line %d: incomplete last line ignored", path, n)
                    break
                raise DataError(f"{invalid_utf8(str(path), n, raw[:-1], e)}; the file is "
                                "damaged: delete that line to plot the rest") from None
            if not line.strip():
                continue
            try:
                rec = read_json(f"{path}, line {n}", text=line)
            except JsonFileError as e:
                if not line.endswith("\n"):  # a write cut short by a kill
                    log.warning("%s, line %d: incomplete last line ignored", path, n)
                    break
                problem = e.problem.replace("not valid JSON (line 1: ", "not JSON (")
                raise DataError(f"{e.path}: {problem}: {line.strip()[:80]!r}") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("split"), str):
                raise DataError(
                    f"{path}, line {n}: expected an object with a 'split', got "
                    f"{line.strip()[:80]!r}")
            step = rec.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise DataError(
                    f"{path}, line {n}: 'step' must be an integer, got {step!r}")
            split = rec["split"]
            if split in last_step and step <= last_step[split]:
                records = [r for r in records if r["step"] < step]  # the re-done segment
                last_step = {}
                for r in records:
                    last_step[r["split"]] = r["step"]
            records.append(rec)
            last_step[split] = step
    history: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        history.setdefault(rec["split"], []).append(rec)
    return history


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``key`` over the records that hold a finite number for it."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.float64)


def _tokens_at(train: Sequence[Mapping[str, Any]], steps: np.ndarray) -> np.ndarray:
    """Target tokens seen at ``steps`` (valid records do not hold the count).

    Linear between the train records' counts (and 0 at step 0); past the last train
    record (a final validation), extended at the tokens per step of the last interval.
    """
    xs, toks = _series(train, "tokens_seen")
    if xs.size == 0:
        return np.full(steps.shape, np.nan)
    xs = np.concatenate([[0], xs])
    toks = np.concatenate([[0.0], toks])
    out = np.interp(steps, xs, toks)
    rate = (toks[-1] - toks[-2]) / max(xs[-1] - xs[-2], 1)
    past = steps > xs[-1]
    out[past] = toks[-1] + rate * (steps[past] - xs[-1])
    return out


# --------------------------------------------------------------------------------------
# Training curves
# --------------------------------------------------------------------------------------

_CURVE_PANELS = (
    # (split, key, x axis, title, log y)
    ("train", "loss", "step", "train loss (label smoothed)", False),
    ("valid", "ppl", "step", "valid perplexity", True),
    ("train", "lr", "step", "learning rate", False),
    ("train", "loss", "tokens", "train loss (label smoothed)", False),
    ("valid", "ppl", "tokens", "valid perplexity", True),
    ("train", "tokens_per_s", "step", "target tokens / s", False),
    ("train", "grad_norm", "step", "gradient norm (before clipping)", False),
    ("train", "skipped_steps", "step", "skipped steps (non-finite, total)", False),
    ("valid", "bleu", "step", "valid BLEU (trainer.valid_bleu)", False),
)


def plot_curves(
    histories: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    path: str | Path,
    dpi: int = 100,
) -> Any:
    """Training curves of one or more runs, one colour per run, written to ``path``.

    Panels (3 x 3): train loss and valid perplexity against optimizer steps and against
    target tokens seen (valid steps mapped to tokens through the train records), learning
    rate, tokens/s, gradient norm, cumulative skipped steps, and valid BLEU when the run
    tracked it (the panel is left empty otherwise).

    Args:
        histories: run label -> :func:`read_metrics` result.
        path: output .png or .svg.
        dpi: resolution; the PNG is 13 x 10 inches, i.e. (1300 x 1000) pixels at 100.

    Returns:
        The matplotlib Figure (closed by the caller with ``plt.close``).

    Raises:
        DataError (a UserError): when no run has any train record.
    """
    if not any(h.get("train") for h in histories.values()):
        raise DataError(f"no train records in {', '.join(histories)}: nothing to plot")
    fig, axes = plt.subplots(3, 3, figsize=(13, 10))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (split, key, xkind, title, logy) in zip(axes.flat, _CURVE_PANELS):
        drawn = False
        for i, (label, hist) in enumerate(histories.items()):
            steps, values = _series(hist.get(split, []), key)
            if steps.size == 0:
                continue
            x = steps if xkind == "step" else _tokens_at(hist.get("train", []), steps)
            marker = "o" if split == "valid" else None
            ax.plot(x, values, label=label, color=colors[i % len(colors)], marker=marker,
                    markersize=3, linewidth=1.2)
            drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer steps" if xkind == "step" else "target tokens seen")
        if xkind == "tokens":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        if drawn and logy:
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, f"no {split} '{key}' records", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
            ax.set_xticks([])
            ax.set_yticks([])
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if len(histories) > 1 and handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4),
                   frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
    else:
        fig.suptitle(next(iter(histories)), fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
    save_figure(fig, path, dpi)
    return fig
