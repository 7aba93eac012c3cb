"""What ``nmt-plot`` draws for one or more runs (:func:`make_plots`).

Its options are the ``plot`` group of the config (:class:`transformer_nmt.config.PlotConfig`):
the figures (``plot.kinds``), the runs drawn together (``plot.runs``), format and folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import torch

from transformer_nmt.checkpoint import load_model
from transformer_nmt.choices import PlotKind
from transformer_nmt.config import Config
from transformer_nmt.data.bpe import load_tokenizer
from transformer_nmt.decode.quantize import check_int8_device
from transformer_nmt.errors import ConfigError
from transformer_nmt.evaluate.checkpoint_bleu import checkpoint_bleu
from transformer_nmt.plot.attention import attention_maps, plot_attention
from transformer_nmt.plot.checkpoint_bleu import plot_checkpoint_bleu
from transformer_nmt.plot.common import close
from transformer_nmt.plot.curves import plot_curves, read_metrics
from transformer_nmt.run.lock import folder_lock
from transformer_nmt.run.model_file import resolve_checkpoint
from transformer_nmt.runtime import resolve_device

# --------------------------------------------------------------------------------------
# One command
# --------------------------------------------------------------------------------------


def _run_dirs(cfg: Config) -> list[Path]:
    """The run folders named by ``plot.runs`` (names under runs/, or paths), else ``run_dir``."""
    base = Path(cfg.run_dir).parent
    names = list(cfg.plot.runs)
    if not names:
        return [Path(cfg.run_dir)]
    dirs = []
    for n in names:
        p = Path(str(n))
        dirs.append(p if (p.is_dir() or len(p.parts) > 1) else base / p)
    return dirs


def make_plots(cfg: Config) -> list[Path]:
    """``nmt-plot``: the figures ``cfg.plot.kinds`` asks for, from one or more run folders.

    ``curves``: ``curves.<fmt>`` (one run) or ``curves_<a>_vs_<b>.<fmt>`` (``plot.runs=[a,b]``);
    ``bleu``: ``checkpoint_bleu.<fmt>`` likewise; ``attention`` (needs ``plot.sentence``,
    first run's model: ``decode.checkpoint``, else averaged.pt, else the latest checkpoint):
    ``attention_encoder_layer<L>.<fmt>`` and ``attention_cross_layer<L>.<fmt>``. Layers
    count from 1; ``plot.layer`` / ``plot.cross_layer`` 0 mean the last.

    Holds the lock (:func:`transformer_nmt.run.lock.folder_lock`) of every folder it writes
    into: the figures' folder and, for ``bleu``, each run's ``plots/`` (its BLEU cache). The
    runs themselves are only read, so a run that is still training can be drawn.

    Returns:
        The files written, in ``plot.dir`` or else ``<first run>/plots``.

    Raises:
        ConfigError: ``bleu_sentences`` below 1, a layer out of range, attention without a
            sentence. DataError: bad metrics lines (named). Both are UserErrors (ValueErrors).
        FileNotFoundError: a run folder without metrics.jsonl or checkpoints (named).
        UserError: another command holds the lock of a folder it writes into (named).
    """
    p = cfg.plot
    kinds = list(p.kinds)
    if p.sentence and PlotKind.attention not in kinds:
        kinds.append(PlotKind.attention)
    fmt = str(p.format)
    if p.bleu_sentences is not None and p.bleu_sentences <= 0:
        raise ConfigError(f"plot.bleu_sentences={p.bleu_sentences} must be positive (or null for "
                         "every validation sentence)")
    if "attention" in kinds and not p.sentence:
        raise ConfigError('plot.kinds has attention but plot.sentence is unset '
                         '(plot.sentence="A man rides a bike.")')
    run_dirs = _run_dirs(cfg)
    for d in run_dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"run folder {d} does not exist")
    out_dir = Path(p.dir) if p.dir else run_dirs[0] / "plots"
    # the folders written: the figures' and, for BLEU, each run's cache; the runs are only read
    written_dirs = [out_dir] + ([d / "plots" for d in run_dirs] if "bleu" in kinds else [])
    with contextlib.ExitStack() as locks:
        for folder in dict.fromkeys(Path(os.path.abspath(f)) for f in written_dirs):
            locks.enter_context(folder_lock(folder, "nmt-plot"))
        written = _draw(cfg, kinds, run_dirs, out_dir, fmt)
    for path in written:
        print(path)
    return written


def _draw(cfg: Config, kinds: list[PlotKind], run_dirs: list[Path], out_dir: Path, fmt: str
          ) -> list[Path]:
    """The figures of :func:`make_plots`, written into ``out_dir``; returns their paths."""
    p = cfg.plot
    labels = [d.name for d in run_dirs]
    suffix = "" if len(run_dirs) == 1 else "_" + "_vs_".join(labels)
    dpi = p.dpi
    written: list[Path] = []

    if "curves" in kinds:
        histories = {d.name: read_metrics(d / "metrics.jsonl") for d in run_dirs}
        fig = plot_curves(histories, out_dir / f"curves{suffix}.{fmt}", dpi)
        written.append(out_dir / f"curves{suffix}.{fmt}")
        close(fig)

    if "bleu" in kinds or "attention" in kinds:
        device = resolve_device(cfg.decode.device)
        if "bleu" in kinds and cfg.decode.precision == "int8":
            check_int8_device(device)  # before any checkpoint is read
    if "bleu" in kinds:
        results = {
            d.name: checkpoint_bleu(d, cfg.decode, device, p.bleu_sentences,
                                     average_last=cfg.average.last)
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
    return written


def _plot_attention_files(cfg: Config, run_dir: Path, out_dir: Path, fmt: str, dpi: int,
                          device: torch.device) -> list[Path]:
    p = cfg.plot
    run_cfg = cfg
    if Path(cfg.run_dir) != run_dir:
        run_cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    ckpt = resolve_checkpoint(run_cfg)
    model, model_cfg = load_model(ckpt, device)
    tokenizer = load_tokenizer(model_cfg.data)
    maps = attention_maps(model, tokenizer, p.sentence, cfg.decode)
    enc_l = _layer_index(p.layer, len(maps["encoder"]), "plot.layer")
    dec_l = _layer_index(p.cross_layer, len(maps["cross"]), "plot.cross_layer")
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
        raise ConfigError(f"{key}={layer} is out of range: the model has {n} layers "
                         "(1..{n}, or 0 for the last)".replace("{n}", str(n)))
    return layer - 1
