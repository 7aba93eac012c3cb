"""BLEU of every kept checkpoint and of the average: what averaging buys (section 6.1).

:func:`checkpoint_bleu` decodes the validation set with every kept ``checkpoint_<step>.pt``
and the averaged model (``averaged.pt``, else the in-memory average of the last
``average.last``), caching the scores in ``plots/checkpoint_bleu.json``;
:func:`plot_checkpoint_bleu` draws them.
"""


from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
import torch

from transformer_nmt.config import DecodeConfig
from transformer_nmt.plot.common import save_figure

log = logging.getLogger(__name__)

BLEU_CACHE_NAME = "checkpoint_bleu.json"


# --------------------------------------------------------------------------------------
# BLEU against checkpoint step
# --------------------------------------------------------------------------------------


def _file_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _decode_key(decode_cfg: DecodeConfig) -> dict[str, Any]:
    keys = ("beam_size", "lenpen", "lenpen_form", "stopping", "max_len_a", "max_len_b",
            "max_input_tokens", "precision")
    return {k: getattr(decode_cfg, k) for k in keys}


def _cache_id(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]


def _read_cache(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        log.warning("%s: not valid JSON (line %d: %s); decoding again", path, e.lineno, e.msg)
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_bleu(
    run_dir: str | Path,
    decode_cfg: DecodeConfig,
    device: str | torch.device = "cpu",
    max_sentences: int | None = None,
    cache_dir: str | Path | None = None,
    average_last: int = 5,
) -> list[dict[str, Any]]:
    """sacreBLEU on the validation set of every kept checkpoint of a run and of its average.

    Each ``checkpoint_<step>.pt`` and the averaged model are decoded with
    :func:`transformer_nmt.decode.translate.translate_lines` (``decode_cfg``'s beam settings) and
    scored with :func:`transformer_nmt.evaluate.bleu.sacrebleu_score` against the raw validation
    references of the data config stored in the checkpoint. The averaged model is
    ``checkpoints/averaged.pt`` when it exists, else the average of the last
    ``average_last`` kept checkpoints (``average.last``) computed in memory (section 6.1). Scores
    are cached in ``<cache_dir>/checkpoint_bleu.json`` keyed by the file names, sizes and
    modification times and the decode settings, so re-plotting decodes nothing new.

    Args:
        run_dir: ``runs/<name>``.
        decode_cfg: :class:`transformer_nmt.config.DecodeConfig`.
        device: where to decode.
        max_sentences: decode only the first N validation sentences (None = all).
        cache_dir: folder of the cache (default ``<run_dir>/plots``).

    Returns:
        One dict per model, checkpoints by step then the average: ``{"label", "step",
        "averaged_from" (names or None), "bleu", "sentences", "signature"}``.

    Raises:
        FileNotFoundError: no step checkpoint in the run, or missing validation files
            (named).
    """
    from transformer_nmt.checkpoint import (
        AVERAGED_NAME,
        average_checkpoints,
        checkpoint_dir,
        config_of,
        load_checkpoint,
        step_checkpoints,
    )
    from transformer_nmt.decode.translate import load_tokenizer, read_lines, translate_lines
    from transformer_nmt.evaluate.bleu import sacrebleu_score
    from transformer_nmt.fileio import atomic_write, raw_path
    from transformer_nmt.model.transformer import Transformer

    run_dir = Path(run_dir)
    paths = step_checkpoints(run_dir)
    if not paths:
        raise FileNotFoundError(f"no checkpoint_<step>.pt in {checkpoint_dir(run_dir)}")
    cache_path = Path(cache_dir or run_dir / "plots") / BLEU_CACHE_NAME
    cache = _read_cache(cache_path)

    models: list[dict[str, Any]] = []  # {label, step, sources: [Path], averaged}
    for p in paths:
        models.append({"label": p.name, "files": [p], "averaged": False})
    averaged = checkpoint_dir(run_dir) / AVERAGED_NAME
    if averaged.is_file():
        models.append({"label": AVERAGED_NAME, "files": [averaged], "averaged": True})
    else:
        last = paths[-int(average_last):]
        models.append({"label": f"average of {len(last)}", "files": last, "averaged": True,
                       "in_memory": True})

    first = load_checkpoint(paths[-1])
    run_cfg = config_of(first)
    vocab_size = int(first["vocab_size"])
    del first
    data = run_cfg.data
    src_file = raw_path(data, data.valid_split, data.src_lang)
    ref_file = raw_path(data, data.valid_split, data.tgt_lang)
    for f in (src_file, ref_file):
        if not f.is_file():
            raise FileNotFoundError(f"validation file {f} not found (run nmt-prepare first)")
    sources, references = read_lines(src_file), read_lines(ref_file)
    if max_sentences is not None:
        sources, references = sources[:max_sentences], references[:max_sentences]
    tokenizer = None

    results = []
    for m in models:
        key = {"files": [_file_key(p) for p in m["files"]], "decode": _decode_key(decode_cfg),
               "sentences": len(sources), "valid": str(src_file),
               "in_memory": bool(m.get("in_memory"))}
        cid = _cache_id(key)
        if cid in cache:
            results.append(cache[cid]["result"])
            continue
        if tokenizer is None:
            tokenizer = load_tokenizer(data)
        if m.get("in_memory"):
            state = average_checkpoints(m["files"])
            step = max(_step_of(load_checkpoint(p)) or 0 for p in m["files"])
            names = [p.name for p in m["files"]]
        else:
            ckpt = load_checkpoint(m["files"][0])
            state, step = ckpt["model"], _step_of(ckpt)
            names = ckpt.get("averaged_from")
            names = [str(n) for n in names] if names is not None else (
                [m["files"][0].name] if m["averaged"] else None)
        model = Transformer(run_cfg.model, vocab_size=vocab_size)
        model.load_state_dict(state)
        model = model.to(device).eval()
        log.info("decoding %d validation sentences with %s", len(sources), m["label"])
        hyps, _ = translate_lines(model, tokenizer, sources, decode_cfg, device)
        # the validation file is the prepared text: Moses-tokenized under data.pretokenize=moses,
        # where the hypotheses come out detokenized
        score = sacrebleu_score(hyps, tokenizer.detokenize(references))
        result = {"label": m["label"], "step": step,
                  "averaged_from": names if m["averaged"] else None,
                  "bleu": score["score"], "sentences": len(sources),
                  "signature": score["signature"]}
        cache[cid] = {"key": key, "result": result}
        with atomic_write(cache_path) as f:  # after each model: an interrupted run keeps them
            json.dump(cache, f, indent=1)
        results.append(result)
        del model, state
    return results


def _step_of(ckpt: Mapping[str, Any]) -> int | None:
    from transformer_nmt.checkpoint import checkpoint_step

    return checkpoint_step(dict(ckpt))


def plot_checkpoint_bleu(
    results: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, dpi: int = 100
) -> Any:
    """BLEU of each kept checkpoint against its step, and of the averaged model, per run.

    The checkpoints are a line with dots; the averaged model is a star at the step of its
    newest input, with a dashed line across the steps it averages.

    Args:
        results: run label -> :func:`checkpoint_bleu` result.
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
