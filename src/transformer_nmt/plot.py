"""Figures for reports: training curves, BLEU per checkpoint, attention maps (paper Figs. 3-5).

Pipeline position: train -> average -> evaluate, and **plot** from any run folder.

* :func:`read_metrics` reads ``runs/<name>/metrics.jsonl`` (the lines the training loop
  writes: ``{"split", "step", "time", ...values}``) into one history per split, with the
  records a resumed run re-did taken from the resumed segment only;
* :func:`plot_curves` draws train loss and valid perplexity against steps and against
  target tokens seen, the learning rate, tokens/s, the gradient norm and the skipped
  steps, one colour per run;
* :func:`checkpoint_bleu` decodes the validation set with every kept ``checkpoint_<step>.pt``
  and the averaged model (``averaged.pt``, else the in-memory average of the last
  ``average.last``), caching the scores in ``plots/checkpoint_bleu.json``;
  :func:`plot_checkpoint_bleu` draws them (what averaging buys, section 6.1);
* :func:`attention_maps` captures every attention module's inputs with forward hooks
  during the model's own teacher-forced forward pass over a source sentence and the
  translation beam search produced for it, and recomputes softmax(Q K^T / sqrt(d_k))
  (section 3.2.1) from the module's own projections and mask; :func:`attention_output`
  turns the weights back into the module's output (tested equal to it).
  :func:`plot_attention` draws one layer's heads as a grid of heatmaps labelled with the
  SentencePiece pieces.

Every figure is written through a temporary file and a rename (matplotlib's Agg backend;
no display needed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import Tensor, nn

from transformer_nmt.config import BOS_ID, EOS_ID, DecodeConfig
from transformer_nmt.fileio import atomic_path

if TYPE_CHECKING:
    from transformer_nmt.cli.plot import PlotAppConfig

log = logging.getLogger(__name__)

FORMATS = ("png", "svg")
BLEU_CACHE_NAME = "checkpoint_bleu.json"


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
        ValueError: naming the file and line of a line that is not a JSON object with an
            integer ``step`` and a ``split``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the training loop writes it; train first)")
    records: list[dict[str, Any]] = []
    last_step: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):  # a write cut short by a kill
                    log.warning("%s, line %d: incomplete last line ignored", path, n)
                    break
                raise ValueError(f"{path}, line {n}: not JSON ({e.msg}): {line.strip()[:80]!r}") from e
            if not isinstance(rec, dict) or not isinstance(rec.get("split"), str):
                raise ValueError(  # noqa: TRY004 - bad file content, not a caller's type
                    f"{path}, line {n}: expected an object with a 'split', got "
                    f"{line.strip()[:80]!r}")
            step = rec.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise ValueError(  # noqa: TRY004
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
# Writing figures
# --------------------------------------------------------------------------------------


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: .png or .svg) atomically.

    Raises:
        ValueError: for a suffix other than .png or .svg.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"{path}: figures are written as {list(FORMATS)}, not {fmt!r}")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi)
    log.info("wrote %s", path)
    return path


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
        ValueError: when no run has any train record.
    """
    if not any(h.get("train") for h in histories.values()):
        raise ValueError(f"no train records in {', '.join(histories)}: nothing to plot")
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
    :func:`transformer_nmt.translate.translate_lines` (``decode_cfg``'s beam settings) and
    scored with :func:`transformer_nmt.bleu.sacrebleu_score` against the raw validation
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
    from transformer_nmt.bleu import sacrebleu_score
    from transformer_nmt.checkpoint import (
        AVERAGED_NAME,
        average_checkpoints,
        checkpoint_dir,
        config_of,
        load_checkpoint,
        step_checkpoints,
    )
    from transformer_nmt.fileio import atomic_write, raw_path
    from transformer_nmt.model import Transformer
    from transformer_nmt.translate import load_tokenizer, read_lines, translate_lines

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
        score = sacrebleu_score(hyps, references)
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


# --------------------------------------------------------------------------------------
# Attention weights from the model's own forward pass
# --------------------------------------------------------------------------------------


@dataclass
class AttentionCall:
    """One call of an attention module, captured by :class:`AttentionCapture`.

    Attributes:
        name: the module's name in the model (``encoder_layers.2.self_attn``).
        module: the module itself (its projections are read, never changed).
        x: (B, t, D) queries (and keys/values for self-attention).
        memory: (B, S, D) encoder output for encoder-decoder attention, else None.
        attn_mask: bool mask broadcastable to (B, H, t, keys), True = may attend, or None.
        is_causal: True when the causal mask was left to the attention kernel.
        output: (B, t, D) what the module returned.
    """

    name: str
    module: nn.Module
    x: Tensor
    memory: Tensor | None
    attn_mask: Tensor | None
    is_causal: bool
    output: Tensor


def _is_attention(module: nn.Module) -> bool:
    from transformer_nmt.model import MultiHeadAttention

    return isinstance(module, MultiHeadAttention)


class AttentionCapture:
    """Context manager recording the inputs and output of every attention module call.

    Forward hooks (``with_kwargs=True``) on each
    :class:`~transformer_nmt.model.MultiHeadAttention` bind the call's arguments to the
    module's ``forward`` signature (``x, memory, attn_mask, is_causal, cache``), so the
    model's own code builds the masks and runs the attention. Only calls without a decoder
    cache are accepted: run a teacher-forced forward pass.

    Attributes:
        calls: :class:`AttentionCall` s in call order.

    Raises:
        RuntimeError: (from the forward pass) when a captured call used a decoder cache.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[AttentionCall] = []
        self._handles: list[Any] = []

    def __enter__(self) -> AttentionCapture:  # noqa: PYI034 - Self needs Python 3.11
        import inspect

        for name, module in self.model.named_modules():
            if not _is_attention(module):
                continue
            sig = inspect.signature(module.forward)

            def hook(mod, args, kwargs, output, _name=name, _sig=sig):
                bound = _sig.bind(*args, **kwargs)
                bound.apply_defaults()
                a = bound.arguments
                if a.get("cache") is not None:
                    raise RuntimeError(f"{_name}: attention maps need a forward pass without "
                                       "a decoder cache (teacher forcing)")
                self.calls.append(AttentionCall(
                    name=_name, module=mod, x=a["x"].detach(),
                    memory=None if a.get("memory") is None else a["memory"].detach(),
                    attn_mask=a.get("attn_mask"), is_causal=bool(a.get("is_causal", False)),
                    output=output.detach(),
                ))

            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def get(self, name: str) -> AttentionCall:
        """The last call of the module named ``name``.

        Raises:
            KeyError: listing the names that were captured.
        """
        for call in reversed(self.calls):
            if call.name == name:
                return call
        raise KeyError(f"no call of {name!r} captured; captured: {sorted({c.name for c in self.calls})}")


def _projections(call: AttentionCall) -> tuple[Tensor, Tensor, Tensor]:
    """Q (B, H, t, Dk), K (B, H, S, Dk), V (B, H, S, Dv) from the module's own weights."""
    m = call.module
    h, dk, dv = m.heads, m.d_k, m.d_v
    if m.self_attention:
        q, k, v = m.in_proj(call.x).split([h * dk, h * dk, h * dv], dim=-1)
    else:
        if call.memory is None:
            raise ValueError(f"{call.name}: encoder-decoder attention call without memory")
        q = m.q_proj(call.x)
        k, v = m.kv_proj(call.memory).split([h * dk, h * dv], dim=-1)

    def heads(t: Tensor, size: int) -> Tensor:
        b, n, _ = t.shape
        return t.reshape(b, n, h, size).transpose(1, 2)  # (B, n, H*size) -> (B, H, n, size)

    return heads(q, dk), heads(k, dk), heads(v, dv)


@torch.no_grad()
def attention_weights(call: AttentionCall) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) of one captured call, with the call's own mask (3.2.1).

    Returns:
        (B, H, t, S) float32; every row sums to 1 (masked keys get weight 0).
    """
    q, k, _ = _projections(call)
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
    mask = call.attn_mask
    if call.is_causal:
        t, s = scores.shape[-2:]
        causal = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril()
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


@torch.no_grad()
def attention_output(call: AttentionCall, weights: Tensor) -> Tensor:
    """MultiHead output Concat(weights_h V_h) W^O + b^O (section 3.2.2), (B, t, D).

    With the weights of :func:`attention_weights` this equals ``call.output`` (the
    module's own result, computed by SDPA), which is what makes the weights the model's.
    """
    _, _, v = _projections(call)
    out = torch.matmul(weights.to(v.dtype), v)  # (B, H, t, Dv)
    b, h, t, dv = out.shape
    return call.module.out_proj(out.transpose(1, 2).reshape(b, t, h * dv))


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Printable SentencePiece pieces of ``ids`` (``</s>`` for eos, ``<s>`` for bos)."""
    sp = getattr(tokenizer, "sp", None)
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            out.append("</s>")
        elif i == BOS_ID:
            out.append("<s>")
        elif sp is not None:
            out.append(sp.id_to_piece(i))
        else:
            out.append(str(i))
    return out


@torch.no_grad()
def attention_maps(
    model: nn.Module,
    tokenizer: Any,
    sentence: str,
    decode_cfg: DecodeConfig,
    target_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Translate ``sentence`` and capture every layer's attention weights for it.

    The source is ``pieces + eos`` as in training; the target is the best beam-search
    hypothesis (:func:`transformer_nmt.translate.search`, ``decode_cfg``'s settings) unless
    ``target_ids`` is given. One teacher-forced forward pass over ``bos + target`` then
    runs under :class:`AttentionCapture`; decoder position i is labelled with the piece it
    predicts (target piece i, ``</s>`` last).

    Returns:
        ``{"source": [S pieces], "target": [T pieces], "translation": str,
        "encoder": [per layer (H, S, S) tensors], "cross": [per layer (H, T, S)],
        "decoder": [per layer (H, T, T)], "calls": {module name: AttentionCall},
        "weights": {module name: (1, H, t, keys)}}``.

    Raises:
        ValueError: when the sentence has no pieces.
    """
    from transformer_nmt.translate import search

    ids = tokenizer.encode(sentence.strip())
    if not ids:
        raise ValueError(f"sentence {sentence!r} has no SentencePiece pieces to translate")
    device = next(model.parameters()).device
    src = torch.tensor([list(ids) + [EOS_ID]], dtype=torch.long, device=device)  # (1, S)
    was_training = model.training
    model.eval()
    try:
        if target_ids is None:
            target_ids = search(model, src, decode_cfg)[0][0].tokens
        tgt_in = torch.tensor([[BOS_ID, *target_ids]], dtype=torch.long, device=device)
        with AttentionCapture(model) as cap:
            model(src, tgt_in)
    finally:
        model.train(was_training)
    calls = {c.name: c for c in cap.calls}
    weights = {name: attention_weights(c) for name, c in calls.items()}

    def layers(prefix: str, kind: str) -> list[Tensor]:
        names = sorted((n for n in weights if n.startswith(prefix) and n.endswith(kind)),
                       key=lambda n: int(n.split(".")[1]))
        return [weights[n][0] for n in names]

    return {
        "source": _pieces(tokenizer, src[0].tolist()),
        "target": _pieces(tokenizer, [*target_ids, EOS_ID]),
        "translation": tokenizer.decode(target_ids),
        "encoder": layers("encoder_layers.", ".self_attn"),
        "cross": layers("decoder_layers.", ".cross_attn"),
        "decoder": layers("decoder_layers.", ".self_attn"),
        "calls": calls,
        "weights": weights,
    }


def plot_attention(
    weights: Tensor,
    rows: Sequence[str],
    cols: Sequence[str],
    path: str | Path,
    title: str,
    dpi: int = 100,
    mean_panel: bool = True,
) -> Any:
    """A grid of attention heatmaps, one per head (paper Figures 3-5), written to ``path``.

    Args:
        weights: (H, len(rows), len(cols)) attention weights, rows = queries.
        rows: query pieces (y axis); cols: key pieces (x axis).
        path: output .png or .svg.
        title: figure title.
        mean_panel: add a last panel with the mean over heads.

    Returns:
        The Figure; panel h shows ``weights[h]`` exactly (``axes[h].images[0]``).

    Raises:
        ValueError: when the weights' shape does not match the labels.
    """
    w = weights.detach().float().cpu().numpy()
    if w.ndim != 3 or w.shape[1:] != (len(rows), len(cols)):
        raise ValueError(f"attention weights of shape {tuple(w.shape)} do not match "
                         f"{len(rows)} row and {len(cols)} column labels")
    heads = w.shape[0]
    panels = [(f"head {h + 1}", w[h]) for h in range(heads)]
    if mean_panel and heads > 1:
        panels.append(("mean over heads", w.mean(axis=0)))
    ncols = min(len(panels), 3 if len(panels) in (5, 6, 9) else 4)
    nrows = math.ceil(len(panels) / ncols)
    cell = 0.26  # inches per token
    width = max(3.0, cell * len(cols) + 1.4)
    height = max(2.5, cell * len(rows) + 1.4)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.6),
                             squeeze=False)
    fontsize = 8 if max(len(rows), len(cols)) <= 30 else 6
    for ax, (name, matrix) in zip(axes.flat, panels):
        ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal",
                  interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels(cols, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(rows, fontsize=fontsize)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi)
    return fig


# --------------------------------------------------------------------------------------
# Table 3
# --------------------------------------------------------------------------------------


def plot_table3(experiment: str, lines: Sequence[Any], path: str | Path,
                kind: str = "paper_bleu") -> Path:
    """Each Table 3 row's dev BLEU difference to its base row, ours beside the paper's.

    Args:
        experiment: the base experiment's name (the title).
        lines: :class:`transformer_nmt.report.Table3Line` objects of one experiment; the one
            whose ``variant`` is ``base`` defines zero and, with two or more seeds, the
            seed-noise band (± one and two standard deviations of its BLEU).
        path: the figure (.png or .svg), written atomically.
        kind: the BLEU of results.json to draw (``paper_bleu`` or ``sacrebleu``).

    Returns:
        ``path``.

    Raises:
        ValueError: no base row among ``lines`` (nothing to take differences from).
    """
    base = next((x for x in lines if x.variant == "base"), None)
    if base is None or not base.values(kind):
        raise ValueError(f"{experiment}: no evaluated base row; Table 3 differences need table3=base")
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


def close(fig: Any) -> None:
    """Release a figure returned by the plot functions."""
    plt.close(fig)


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
        ValueError: unknown kind or format, a layer out of range, attention without a
            sentence, or bad metrics lines (named).
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
        from transformer_nmt.translate import resolve_device

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
    from transformer_nmt.translate import load_tokenizer, resolve_checkpoint

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


__all__ = [
    "AttentionCall", "AttentionCapture", "attention_maps", "attention_output",
    "attention_weights", "checkpoint_bleu", "make_plots", "plot_attention",
    "plot_checkpoint_bleu", "plot_curves", "read_metrics", "save_figure",
]
