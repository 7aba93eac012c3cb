"""Attention maps (the paper's Figs. 3-5).

:func:`attention_maps` captures every attention module's inputs with forward hooks during
the model's own teacher-forced forward pass over a source sentence and the translation
beam search produced for it, and recomputes softmax(Q K^T / sqrt(d_k)) (section 3.2.1)
from the module's own projections and mask; :func:`attention_output` turns the weights back
into the module's output (tested equal to it). :func:`plot_attention` draws one layer's
heads as a grid of heatmaps labelled with the SentencePiece pieces.
"""


from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
import torch
from torch import Tensor, nn

from transformer_nmt.config import BOS_ID, EOS_ID, DecodeConfig
from transformer_nmt.decode.translate import search
from transformer_nmt.errors import ConfigError
from transformer_nmt.model.transformer import MultiHeadAttention
from transformer_nmt.plot.common import save_figure

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
    return isinstance(module, MultiHeadAttention)


class AttentionCapture:
    """Context manager recording the inputs and output of every attention module call.

    Forward hooks (``with_kwargs=True``) on each
    :class:`~transformer_nmt.model.transformer.MultiHeadAttention` bind the call's arguments to the
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
        raise KeyError(f"no call of {name!r} captured; "
                       f"captured: {sorted({c.name for c in self.calls})}")


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
    hypothesis (:func:`transformer_nmt.decode.translate.search`, ``decode_cfg``'s settings) unless
    ``target_ids`` is given. One teacher-forced forward pass over ``bos + target`` then
    runs under :class:`AttentionCapture`; decoder position i is labelled with the piece it
    predicts (target piece i, ``</s>`` last).

    Returns:
        ``{"source": [S pieces], "target": [T pieces], "translation": str,
        "encoder": [per layer (H, S, S) tensors], "cross": [per layer (H, T, S)],
        "decoder": [per layer (H, T, T)], "calls": {module name: AttentionCall},
        "weights": {module name: (1, H, t, keys)}}``.

    Raises:
        ConfigError (a UserError, a ValueError): when the sentence has no pieces.
    """
    ids = tokenizer.encode(sentence.strip())
    if not ids:
        raise ConfigError(f"sentence {sentence!r} has no SentencePiece pieces to translate")
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
