"""What ``nmt-plot`` draws for one or more runs, and its config (:class:`PlotAppConfig`).

The config is the pipeline's plus the ``plot`` node of :class:`PlotConfig` and the
top-level ``runs`` list; :func:`make_plots` writes the figures named by ``plot.kinds``.
"""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

from dataclasses import field

import torch

from transformer_nmt.config import Config

if TYPE_CHECKING:
    from transformer_nmt.plot.make import PlotAppConfig
from transformer_nmt.plot.attention import attention_maps, plot_attention
from transformer_nmt.plot.checkpoint_bleu import checkpoint_bleu, plot_checkpoint_bleu
from transformer_nmt.plot.common import FORMATS, close
from transformer_nmt.plot.curves import plot_curves, read_metrics


@dataclass
class PlotConfig:
    """What ``nmt-plot`` draws and where."""

    kinds: list[str] = field(default_factory=lambda: ["curves", "bleu"])
    """Figures: ``curves`` (metrics.jsonl), ``bleu`` (validation BLEU of each kept checkpoint
    and the average; decodes, cached in plots/checkpoint_bleu.json), ``attention``."""
    format: str = "png"
    """``png`` or ``svg``."""
    dpi: int = 100
    dir: str | None = None
    """Output folder; None = ``<first run>/plots``."""
    bleu_sentences: int | None = None
    """Decode only the first N validation sentences per checkpoint (None = all)."""
    sentence: str | None = None
    """Source sentence for the attention maps (adds ``attention`` to the kinds)."""
    layer: int = 0
    """Encoder layer whose self-attention heads are drawn, from 1; 0 = the last."""
    cross_layer: int = 0
    """Decoder layer whose encoder-decoder attention heads are drawn, from 1; 0 = the last."""


@dataclass
class PlotAppConfig(Config):
    """The pipeline config plus ``plot`` and ``runs`` (nmt-plot only)."""

    plot: PlotConfig = field(default_factory=PlotConfig)
    runs: list[str] = field(default_factory=list)
    """Run names (folders under runs/) or paths to draw together; empty = ``run_dir``."""


# --------------------------------------------------------------------------------------
# One command
# --------------------------------------------------------------------------------------


def _run_dirs(cfg: PlotAppConfig) -> list[Path]:
    """The run folders named by ``runs`` (names under runs/, or paths), else ``run_dir``."""
    base = Path(cfg.run_dir).parent
    names = list(getattr(cfg, "runs", None) or [])
    if not names:
        return [Path(cfg.run_dir)]
    dirs = []
    for n in names:
        p = Path(str(n))
        dirs.append(p if (p.is_dir() or len(p.parts) > 1) else base / p)
    return dirs


def make_plots(cfg: PlotAppConfig) -> list[Path]:
    """``nmt-plot``: the figures ``cfg.plot.kinds`` asks for, from one or more run folders.

    ``curves``: ``curves.<fmt>`` (one run) or ``curves_<a>_vs_<b>.<fmt>`` (``runs=[a,b]``);
    ``bleu``: ``checkpoint_bleu.<fmt>`` likewise; ``attention`` (needs ``plot.sentence``,
    first run's model: ``decode.checkpoint``, else averaged.pt, else the latest checkpoint):
    ``attention_encoder_layer<L>.<fmt>`` and ``attention_cross_layer<L>.<fmt>``. Layers
    count from 1; ``plot.layer`` / ``plot.cross_layer`` 0 mean the last.

    Returns:
        The files written, in ``plot.dir`` or else ``<first run>/plots``.

    Raises:
        ValueError: unknown kind or format, ``bleu_sentences`` below 1, a layer out of
            range, attention without a sentence, or bad metrics lines (named).
        FileNotFoundError: a run folder without metrics.jsonl or checkpoints (named).
    """
    p = cfg.plot
    kinds = list(p.kinds)
    if p.sentence and "attention" not in kinds:
        kinds.append("attention")
    unknown = [k for k in kinds if k not in ("curves", "bleu", "attention")]
    if unknown:
        raise ValueError(f"plot.kinds={kinds}: unknown {unknown}; allowed: curves, bleu, attention")
    fmt = str(p.format).lower()
    if fmt not in FORMATS:
        raise ValueError(f"plot.format={p.format!r} is not one of {list(FORMATS)}")
    if p.bleu_sentences is not None and int(p.bleu_sentences) <= 0:
        raise ValueError(f"plot.bleu_sentences={p.bleu_sentences} must be positive (or null for "
                         "every validation sentence)")
    if "attention" in kinds and not p.sentence:
        raise ValueError('plot.kinds has attention but plot.sentence is unset '
                         '(plot.sentence="A man rides a bike.")')
    run_dirs = _run_dirs(cfg)
    for d in run_dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"run folder {d} does not exist")
    labels = [d.name for d in run_dirs]
    out_dir = Path(p.dir) if p.dir else run_dirs[0] / "plots"
    suffix = "" if len(run_dirs) == 1 else "_" + "_vs_".join(labels)
    dpi = int(p.dpi)
    written: list[Path] = []

    if "curves" in kinds:
        histories = {d.name: read_metrics(d / "metrics.jsonl") for d in run_dirs}
        fig = plot_curves(histories, out_dir / f"curves{suffix}.{fmt}", dpi)
        written.append(out_dir / f"curves{suffix}.{fmt}")
        close(fig)

    if "bleu" in kinds or "attention" in kinds:
        from transformer_nmt.decode.translate import resolve_device

        device = resolve_device(cfg.decode.device)
    if "bleu" in kinds:
        results = {
            d.name: checkpoint_bleu(d, cfg.decode, device, p.bleu_sentences,
                                     average_last=int(cfg.average.last))
            for d in run_dirs
        }
        for label, rows in results.items():
            for r in rows:
                print(f"{label} {r['label']} (step {r['step']}): valid BLEU {r['bleu']:.2f} "
                      f"({r['sentences']} sentences)")
        fig = plot_checkpoint_bleu(results, out_dir / f"checkpoint_bleu{suffix}.{fmt}", dpi)
        written.append(out_dir / f"checkpoint_bleu{suffix}.{fmt}")
        close(fig)

    if "attention" in kinds:
        written += _plot_attention_files(cfg, run_dirs[0], out_dir, fmt, dpi, device)
    for path in written:
        print(path)
    return written


def _plot_attention_files(cfg: PlotAppConfig, run_dir: Path, out_dir: Path, fmt: str, dpi: int,
                          device: torch.device) -> list[Path]:
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.decode.translate import load_tokenizer, resolve_checkpoint

    p = cfg.plot
    run_cfg = cfg
    if Path(cfg.run_dir) != run_dir:
        run_cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    ckpt = resolve_checkpoint(run_cfg)
    model, model_cfg = load_model(ckpt, device)
    tokenizer = load_tokenizer(model_cfg.data)
    maps = attention_maps(model, tokenizer, str(p.sentence), cfg.decode)
    enc_l = _layer_index(int(p.layer), len(maps["encoder"]), "plot.layer")
    dec_l = _layer_index(int(p.cross_layer), len(maps["cross"]), "plot.cross_layer")
    print(f"source: {' '.join(maps['source'])}")
    print(f"translation: {maps['translation']}")
    src, tgt = maps["source"], maps["target"]
    enc_path = out_dir / f"attention_encoder_layer{enc_l + 1}.{fmt}"
    fig = plot_attention(
        maps["encoder"][enc_l], src, src, enc_path,
        f"encoder self-attention, layer {enc_l + 1} of {len(maps['encoder'])} "
        f"({ckpt.name}): rows attend to columns", dpi)
    close(fig)
    cross_path = out_dir / f"attention_cross_layer{dec_l + 1}.{fmt}"
    fig = plot_attention(
        maps["cross"][dec_l], tgt, src, cross_path,
        f"encoder-decoder attention, decoder layer {dec_l + 1} of {len(maps['cross'])} "
        f"({ckpt.name}): target pieces (rows) over source pieces (columns)", dpi)
    close(fig)
    return [enc_path, cross_path]


def _layer_index(layer: int, n: int, key: str) -> int:
    """1-based ``layer`` (0 = last) -> 0-based index, checked against ``n`` layers."""
    if layer == 0:
        return n - 1
    if not 1 <= layer <= n:
        raise ValueError(f"{key}={layer} is out of range: the model has {n} layers "
                         "(1..{n}, or 0 for the last)".replace("{n}", str(n)))
    return layer - 1
