"""Our state dict <-> Hugging Face ``MarianMTModel``'s, exact in both directions.

Both compute the network of the paper (sections 3.1-3.5) when it is post-norm, ReLU,
sqrt(d_model)-scaled embeddings shared three ways, sinusoidal positions, one LayerNorm
epsilon (1e-5), no output bias. What differs, and how it is made exact:

* Positions. ``MarianMTModel`` does not save its sinusoidal table; it rebuilds it on load
  with the sines in channels 0 .. D/2-1 and the cosines in D/2 .. D-1, where the paper
  (and :func:`transformer_nmt.model.transformer.sinusoidal_table`) interleaves them (sin in
  even, cos in odd channels, same frequencies). Every d_model-sized axis of the network
  (the residual stream) is therefore permuted by :func:`marian_channel_order`: embedding
  columns, the input columns of every layer that reads the stream, the output rows and
  biases of every layer that writes it, the LayerNorm parameters. LayerNorm, attention and
  the tied pre-softmax product are invariant under such a permutation, so the permuted
  network computes the same logits (up to float summation order) with Marian's own table.
  Import applies the inverse permutation, so ours -> Marian -> ours is bit-identical.
* Special ids and the decoder start. Ours: pad 0, unk 1, bos 2, eos 3, the decoder starts
  from ``bos``. ``decoder_start_token_id`` is written as 2 (not Marian's usual pad).
* Fused projections. Our self-attention stores [W^Q | W^K | W^V] in one Linear and the
  encoder-decoder attention [W^K | W^V]; Marian keeps q_proj, k_proj, v_proj.
"""


from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    ModelConfig,
    as_plain,
    field_value,
)
from transformer_nmt.interop.common import check_exportable, require

if TYPE_CHECKING:
    from transformers import MarianConfig

# --------------------------------------------------------------------------------------
# Hugging Face Marian
# --------------------------------------------------------------------------------------


def marian_channel_order(d_model: int) -> torch.Tensor:
    """(D,) long: channel c of Marian's residual stream is channel ``order[c]`` of ours.

    Our sinusoid puts sin(pos / 10000^(2i/D)) in channel 2i and the cosine in 2i + 1;
    Marian's puts the sines in channels 0 .. ceil(D/2)-1 and the cosines after them.
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permute_marian(sd: dict[str, torch.Tensor], order: torch.Tensor) -> dict[str, torch.Tensor]:
    """Index every d_model axis of a Marian-named state dict by ``order``.

    Axes: embeddings and lm_head columns; q/k/v_proj and fc1 input columns; out_proj and
    fc2 output rows and biases; LayerNorm weights and biases.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        name = key.rsplit(".", 1)[0]
        if (key.endswith("embed_tokens.weight")
                or key in ("model.shared.weight", "lm_head.weight")
                or (name.endswith(("q_proj", "k_proj", "v_proj", "fc1"))
                    and key.endswith(".weight"))):
            value = value[:, order]
        elif name.endswith(("out_proj", "fc2", "layer_norm")):
            value = value[order]
        out[key] = value.contiguous()
    return out


# One table of per-layer parameter names, read in both directions (export splits our fused
# projections, import concatenates them back): (our name, the peer's name, parts). ``parts``
# None: the weight and bias are the same tensors under another name; a tuple: our fused
# projection is the peer's projections ``<peer>.<part>`` stacked along dim 0, in that order.
LayerNames = tuple[tuple[str, str, tuple[str, ...] | None], ...]
SELF_ATTN_FFN_NAMES: LayerNames = (
    ("self_attn.in_proj", "self_attn", ("q_proj", "k_proj", "v_proj")),
    ("self_attn.out_proj", "self_attn.out_proj", None),
    ("self_attn_norm", "self_attn_layer_norm", None),
    ("ffn.w_1", "fc1", None),
    ("ffn.w_2", "fc2", None),
    ("ffn_norm", "final_layer_norm", None),
)
"""Every encoder and decoder layer: self-attention and feed-forward sub-layers."""
CROSS_ATTN_NAMES: LayerNames = (
    ("cross_attn.q_proj", "encoder_attn.q_proj", None),
    ("cross_attn.kv_proj", "encoder_attn", ("k_proj", "v_proj")),
    ("cross_attn.out_proj", "encoder_attn.out_proj", None),
    ("cross_attn_norm", "encoder_attn_layer_norm", None),
)
"""Decoder layers only: the encoder-decoder attention sub-layer."""


def layer_name_pairs(cfg: ModelConfig, enc_prefix: str, dec_prefix: str
                     ) -> Iterator[tuple[str, str, tuple[str, ...] | None]]:
    """``(our prefix, the peer's prefix, parts)`` of every layer parameter of ``cfg``'s model
    (:data:`SELF_ATTN_FFN_NAMES`, :data:`CROSS_ATTN_NAMES`), encoder layers first.

    Args:
        cfg: a model config (layer counts).
        enc_prefix, dec_prefix: where the peer keeps its layers, e.g. ``encoder.layers``.
    """
    for i in range(int(field_value(cfg, "encoder_layers"))):
        for ours, peer, parts in SELF_ATTN_FFN_NAMES:
            yield f"encoder_layers.{i}.{ours}", f"{enc_prefix}.{i}.{peer}", parts
    for i in range(int(field_value(cfg, "decoder_layers"))):
        for ours, peer, parts in SELF_ATTN_FFN_NAMES + CROSS_ATTN_NAMES:
            yield f"decoder_layers.{i}.{ours}", f"{dec_prefix}.{i}.{peer}", parts


def layer_state_dict(
    ours: dict[str, torch.Tensor], cfg: ModelConfig, enc_prefix: str, dec_prefix: str
) -> dict[str, torch.Tensor]:
    """Our encoder/decoder layer weights under fairseq's layer names (Marian uses the same).

    W^Q, W^K, W^V (and the cross-attention W^K, W^V) are split out of our fused projections.

    Args:
        ours: our model's state dict (detached tensors).
        cfg: its model config (layer counts, d_model).
        enc_prefix, dec_prefix: where the peer keeps its layers, e.g. ``encoder.layers``.
    """
    d = int(field_value(cfg, "d_model"))
    sd: dict[str, torch.Tensor] = {}
    for src, dst, parts in layer_name_pairs(cfg, enc_prefix, dec_prefix):
        if parts is None:
            sd[f"{dst}.weight"], sd[f"{dst}.bias"] = ours[f"{src}.weight"], ours[f"{src}.bias"]
            continue
        weights, biases = ours[f"{src}.weight"].split(d, 0), ours[f"{src}.bias"].split(d, 0)
        for part, w, b in zip(parts, weights, biases):
            sd[f"{dst}.{part}.weight"], sd[f"{dst}.{part}.bias"] = w, b
    return sd


def marian_config(model_cfg: ModelConfig, vocab_size: int,
                  dropout: float | None = None):
    """The ``MarianConfig`` of our architecture: post-norm, ReLU, sqrt(D) scale, tied, our ids.

    Args:
        model_cfg: our ModelConfig (sizes, dropouts, max_positions).
        vocab_size: V.
        dropout: residual dropout to write (default: the model's own).
    """
    transformers = require("transformers")
    d = int(field_value(model_cfg, "d_model"))
    return transformers.MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d,
        encoder_layers=int(field_value(model_cfg, "encoder_layers")),
        decoder_layers=int(field_value(model_cfg, "decoder_layers")),
        encoder_ffn_dim=int(field_value(model_cfg, "d_ff")),
        decoder_ffn_dim=int(field_value(model_cfg, "d_ff")),
        encoder_attention_heads=int(field_value(model_cfg, "heads")),
        decoder_attention_heads=int(field_value(model_cfg, "heads")),
        activation_function="relu", normalize_before=False, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        dropout=float(field_value(model_cfg, "dropout") if dropout is None else dropout),
        attention_dropout=float(field_value(model_cfg, "attention_dropout", 0.0)),
        activation_dropout=float(field_value(model_cfg, "activation_dropout", 0.0)),
        max_position_embeddings=int(field_value(model_cfg, "max_positions")),
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID,
    )


def to_marian_state_dict(ours: dict[str, torch.Tensor], model_cfg: ModelConfig
                         ) -> dict[str, torch.Tensor]:
    """Our state dict -> MarianMTModel's (names, split projections, channel order).

    Returns:
        Every key of MarianMTModel's state dict except the position tables (Marian builds
        them itself) and ``final_logits_bias`` (zero).
    """
    check_exportable(model_cfg, "hf")
    ours = {k: v.detach() for k, v in ours.items()}
    sd: dict[str, torch.Tensor] = {}
    emb = ours["embed_tokens.weight"]
    for k in ("model.shared.weight", "model.encoder.embed_tokens.weight",
              "model.decoder.embed_tokens.weight", "lm_head.weight"):
        sd[k] = emb
    sd.update(layer_state_dict(ours, model_cfg, "model.encoder.layers", "model.decoder.layers"))
    return _permute_marian(sd, marian_channel_order(int(field_value(model_cfg, "d_model"))))


def port_to_marian(model: Any, dropout: float | None = None):
    """A ``MarianMTModel`` computing our model's logits (eval mode, CPU, float32).

    Args:
        model: our :class:`~transformer_nmt.model.transformer.Transformer`.
        dropout: residual dropout of the Marian config (training benchmarks); default ours.

    Raises:
        ExportError: a model Marian cannot express (see :func:`check_exportable`).
    """
    transformers = require("transformers")
    cfg = model.cfg
    check_exportable(cfg, "hf")
    mm = transformers.MarianMTModel(marian_config(cfg, model.vocab_size, dropout))
    sd = to_marian_state_dict(model.state_dict(), cfg)
    own = mm.state_dict()
    unexpected = [k for k in sd if k not in own]
    missing = [k for k in own if k not in sd and k != "final_logits_bias"
               and not k.endswith("embed_positions.weight")]
    if missing or unexpected:
        raise RuntimeError(f"Marian port: missing {missing[:8]}, unexpected {unexpected[:8]}")
    with torch.no_grad():
        for k, v in sd.items():
            own[k].copy_(v)
        mm.final_logits_bias.zero_()
    return mm.eval()


def from_marian_state_dict(sd: dict[str, torch.Tensor], model_cfg: ModelConfig
                           ) -> dict[str, torch.Tensor]:
    """MarianMTModel's state dict -> ours (inverse of :func:`to_marian_state_dict`)."""
    d = int(field_value(model_cfg, "d_model"))
    order = marian_channel_order(d)
    sd = _permute_marian({k: v.detach() for k, v in sd.items()}, torch.argsort(order))
    ours: dict[str, torch.Tensor] = {}
    emb = sd["model.shared.weight"]
    for k in ("embed_tokens.weight", "tgt_embed_tokens.weight", "output_projection.weight"):
        ours[k] = emb
    for dst, src, parts in layer_name_pairs(model_cfg, "model.encoder.layers",
                                            "model.decoder.layers"):
        for suffix in ("weight", "bias"):
            ours[f"{dst}.{suffix}"] = (sd[f"{src}.{suffix}"] if parts is None else
                                       torch.cat([sd[f"{src}.{p}.{suffix}"] for p in parts], 0))
    return {k: v.contiguous() for k, v in ours.items()}


def model_config_of_marian(mcfg: MarianConfig, base: ModelConfig | dict | None = None
                           ) -> dict[str, Any]:
    """Our ModelConfig fields (a dict) for a MarianConfig; other fields from ``base``."""
    fields = dict(as_plain(base)) if base is not None else {}
    fields.update(
        name=fields.get("name", "imported"), encoder_layers=mcfg.encoder_layers,
        decoder_layers=mcfg.decoder_layers, d_model=mcfg.d_model, d_ff=mcfg.encoder_ffn_dim,
        heads=mcfg.encoder_attention_heads, d_k=None, d_v=None, dropout=mcfg.dropout,
        attention_dropout=mcfg.attention_dropout, activation_dropout=mcfg.activation_dropout,
        norm="post", share_embeddings="all", positions="sinusoidal",
        max_positions=mcfg.max_position_embeddings,
    )
    return fields
