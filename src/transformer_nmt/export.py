"""Our checkpoint <-> Hugging Face Marian folder, and our checkpoint -> CTranslate2 model.

Pipeline position: train -> average -> **export** (nmt-export), and a Marian-architecture
transformers folder -> **import** (nmt-import) -> translate / evaluate / fine-tune.

Both peers compute the network of the paper (sections 3.1-3.5) when it is post-norm, ReLU,
sqrt(d_model)-scaled embeddings shared three ways, sinusoidal positions, one LayerNorm
epsilon (1e-5), no output bias. What differs, and how it is made exact:

* Positions. ``MarianMTModel`` does not save its sinusoidal table; it rebuilds it on load
  with the sines in channels 0 .. D/2-1 and the cosines in D/2 .. D-1, where the paper
  (and :func:`transformer_nmt.model.sinusoidal_table`) interleaves them (sin in even,
  cos in odd channels, same frequencies). Every d_model-sized axis of the network (the
  residual stream) is therefore permuted by :func:`marian_channel_order`: embedding
  columns, the input columns of every layer that reads the stream, the output rows and
  biases of every layer that writes it, the LayerNorm parameters. LayerNorm, attention and
  the tied pre-softmax product are invariant under such a permutation, so the permuted
  network computes the same logits (up to float summation order) with Marian's own table.
  Import applies the inverse permutation, so ours -> Marian -> ours is bit-identical.
* Special ids and the decoder start. Ours: pad 0, unk 1, bos 2, eos 3, the decoder starts
  from ``bos``. ``decoder_start_token_id`` is written as 2 (not Marian's usual pad).
  opus-mt models (eos 0, pad last, decoder starting from the pad's zero embedding, no bos,
  two SentencePiece models with a separate vocab.json) cannot be mapped onto a shared
  SentencePiece model with our ids without changing the softmax; import refuses them.
* Fused projections. Our self-attention stores [W^Q | W^K | W^V] in one Linear and the
  encoder-decoder attention [W^K | W^V]; Marian keeps q_proj, k_proj, v_proj.
* CTranslate2. Its transformers converter for Marian drops the last vocabulary entry
  (``<pad>``) and starts the decoder from a zero embedding, which our vocabulary does
  not follow, so :func:`export_ctranslate2` fills CTranslate2's own
  ``TransformerSpec`` from our state dict (its fused layouts are ours), with our position
  table (sinusoidal or learned), ``<s>`` as decoder start token, post- or pre-norm.

What cannot be expressed exactly is refused with :class:`ExportError` (the CLI prints it
as one ``error:`` line and exits 2): pre-norm and learned positions for Marian, d_k or
d_v other than d_model / heads, untied embeddings for Marian.

The peers (``transformers``, ``ctranslate2``, ``safetensors``) are the optional ``export``
extra (``pip install -e ".[export]"``) and are imported lazily.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Config,
    DecodeConfig,
    ModelConfig,
    to_plain,
)
from transformer_nmt.errors import UserError

if TYPE_CHECKING:
    from transformers import MarianConfig

log = logging.getLogger(__name__)

SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
"""Pieces of our special ids in the shared SentencePiece model (bpe.py trains it so)."""
FORMATS = ("hf", "ctranslate2")
QUANTIZATIONS = ("none", "int8", "int8_float32", "float16")
ENGINES = ("native", "ctranslate2", "ctranslate2_int8")
"""``decode.engine`` values: our beam search, CTranslate2 float32 (or the decode precision
on GPU), CTranslate2 with int8 weights and matrix products."""
LAYER_NORM_EPS = 1e-5
"""torch.nn.LayerNorm's default epsilon, which our model and MarianMTModel both use."""
SIDECAR = "transformer_nmt.json"
"""File in an exported folder recording what import needs beyond the weights (the text
normalisation of our tokenizer, the run's model config)."""


class ExportError(UserError):
    """A model or folder that cannot be converted exactly; the message says why."""


def require(module: str):
    """Import an optional dependency of the ``export`` extra, or raise ExportError naming it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ExportError(
            f"{module} is not installed: install the export extra with "
            f"pip install -e \".[export]\" ({e})"
        ) from e


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------


def _get(cfg: ModelConfig | DecodeConfig | DictConfig | dict[str, Any], key: str,
         default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, (dict, DictConfig)) else getattr(cfg, key, default)


def check_exportable(model_cfg: ModelConfig | DictConfig, target: str) -> None:
    """Refuse a model that ``target`` (``hf`` or ``ctranslate2``) cannot compute exactly.

    Raises:
        ExportError: naming the config field and value.
    """
    d, h = int(_get(model_cfg, "d_model")), int(_get(model_cfg, "heads"))
    d_k, d_v = _get(model_cfg, "d_k"), _get(model_cfg, "d_v")
    d_k = d // h if d_k is None else int(d_k)
    d_v = d // h if d_v is None else int(d_v)
    if d_k != d_v or d_k * h != d:
        raise ExportError(
            f"model.d_k={d_k} and model.d_v={d_v} with heads={h}, d_model={d}: {target} needs "
            "d_k = d_v = d_model / heads"
        )
    if target == "hf":
        if _get(model_cfg, "norm") != "post":
            raise ExportError(f"model.norm={_get(model_cfg, 'norm')}: MarianMTModel is post-norm only")
        if _get(model_cfg, "positions") != "sinusoidal":
            raise ExportError(
                f"model.positions={_get(model_cfg, 'positions')}: MarianMTModel rebuilds "
                "sinusoidal positions on load and cannot hold learned ones"
            )
        if _get(model_cfg, "share_embeddings") != "all":
            raise ExportError(
                f"model.share_embeddings={_get(model_cfg, 'share_embeddings')}: the Marian export "
                "writes one shared embedding (share_embeddings=all)"
            )
    elif target != "ctranslate2":
        raise ExportError(f"export.format={target!r} is not one of {list(FORMATS)}")


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
        if key.endswith("embed_tokens.weight") or key in ("model.shared.weight", "lm_head.weight") or name.endswith(("q_proj", "k_proj", "v_proj", "fc1")) and key.endswith(".weight"):
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


def layer_name_pairs(cfg: ModelConfig | DictConfig, enc_prefix: str, dec_prefix: str
                     ) -> Iterator[tuple[str, str, tuple[str, ...] | None]]:
    """``(our prefix, the peer's prefix, parts)`` of every layer parameter of ``cfg``'s model
    (:data:`SELF_ATTN_FFN_NAMES`, :data:`CROSS_ATTN_NAMES`), encoder layers first.

    Args:
        cfg: a model config (layer counts).
        enc_prefix, dec_prefix: where the peer keeps its layers, e.g. ``encoder.layers``.
    """
    for i in range(int(_get(cfg, "encoder_layers"))):
        for ours, peer, parts in SELF_ATTN_FFN_NAMES:
            yield f"encoder_layers.{i}.{ours}", f"{enc_prefix}.{i}.{peer}", parts
    for i in range(int(_get(cfg, "decoder_layers"))):
        for ours, peer, parts in SELF_ATTN_FFN_NAMES + CROSS_ATTN_NAMES:
            yield f"decoder_layers.{i}.{ours}", f"{dec_prefix}.{i}.{peer}", parts


def layer_state_dict(
    ours: dict[str, torch.Tensor], cfg: ModelConfig | DictConfig, enc_prefix: str, dec_prefix: str
) -> dict[str, torch.Tensor]:
    """Our encoder/decoder layer weights under fairseq's layer names (Marian uses the same).

    W^Q, W^K, W^V (and the cross-attention W^K, W^V) are split out of our fused projections.

    Args:
        ours: our model's state dict (detached tensors).
        cfg: its model config (layer counts, d_model).
        enc_prefix, dec_prefix: where the peer keeps its layers, e.g. ``encoder.layers``.
    """
    d = int(_get(cfg, "d_model"))
    sd: dict[str, torch.Tensor] = {}
    for src, dst, parts in layer_name_pairs(cfg, enc_prefix, dec_prefix):
        if parts is None:
            sd[f"{dst}.weight"], sd[f"{dst}.bias"] = ours[f"{src}.weight"], ours[f"{src}.bias"]
            continue
        weights, biases = ours[f"{src}.weight"].split(d, 0), ours[f"{src}.bias"].split(d, 0)
        for part, w, b in zip(parts, weights, biases):
            sd[f"{dst}.{part}.weight"], sd[f"{dst}.{part}.bias"] = w, b
    return sd


def marian_config(model_cfg: ModelConfig | DictConfig, vocab_size: int,
                  dropout: float | None = None):
    """The ``MarianConfig`` of our architecture: post-norm, ReLU, sqrt(D) scale, tied, our ids.

    Args:
        model_cfg: our ModelConfig (sizes, dropouts, max_positions).
        vocab_size: V.
        dropout: residual dropout to write (default: the model's own).
    """
    transformers = require("transformers")
    d = int(_get(model_cfg, "d_model"))
    return transformers.MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d,
        encoder_layers=int(_get(model_cfg, "encoder_layers")),
        decoder_layers=int(_get(model_cfg, "decoder_layers")),
        encoder_ffn_dim=int(_get(model_cfg, "d_ff")), decoder_ffn_dim=int(_get(model_cfg, "d_ff")),
        encoder_attention_heads=int(_get(model_cfg, "heads")),
        decoder_attention_heads=int(_get(model_cfg, "heads")),
        activation_function="relu", normalize_before=False, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        dropout=float(_get(model_cfg, "dropout") if dropout is None else dropout),
        attention_dropout=float(_get(model_cfg, "attention_dropout", 0.0)),
        activation_dropout=float(_get(model_cfg, "activation_dropout", 0.0)),
        max_position_embeddings=int(_get(model_cfg, "max_positions")),
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID,
    )


def to_marian_state_dict(ours: dict[str, torch.Tensor], model_cfg: ModelConfig | DictConfig
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
    return _permute_marian(sd, marian_channel_order(int(_get(model_cfg, "d_model"))))


def port_to_marian(model: Any, dropout: float | None = None):
    """A ``MarianMTModel`` computing our model's logits (eval mode, CPU, float32).

    Args:
        model: our :class:`~transformer_nmt.model.Transformer`.
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


def _piece_vocab(spm_path: Path) -> list[str]:
    """Pieces of the shared SentencePiece model in id order; checks our special ids."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    for i, piece in SPECIAL_PIECES.items():
        if i >= len(pieces) or pieces[i] != piece:
            got = pieces[i] if i < len(pieces) else None
            raise ExportError(f"{spm_path}: id {i} is {got!r}, expected {piece!r}")
    if len(set(pieces)) != len(pieces):
        raise ExportError(f"{spm_path}: duplicate pieces; a vocab.json cannot map them")
    return pieces


def _unicode_form(spm_path: Path) -> str | None:
    from transformer_nmt.bpe import meta_path

    meta = meta_path(spm_path)
    if meta.is_file():
        return json.loads(meta.read_text(encoding="utf-8"))["params"].get("unicode_form")
    return None


def _plain(node: Any) -> Any:
    """A config node (DictConfig or dataclass) as plain types; anything else unchanged."""
    if isinstance(node, DictConfig) or dataclasses.is_dataclass(node):
        return to_plain(node)
    return node


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def model_card(run_cfg: DictConfig, ckpt: dict[str, Any], results: dict[str, Any] | None,
               vocab_size: int) -> str:
    """README.md of an exported folder: data, recipe, steps, measured BLEU with signatures."""
    data, model, trainer = run_cfg.data, run_cfg.model, run_cfg.get("trainer", {})
    decode = run_cfg.get("decode", {})
    src, tgt = data.src_lang, data.tgt_lang
    lines = [
        "---", "library_name: transformers", "pipeline_tag: translation", "tags:",
        "- translation", "- marian", "- transformer-nmt", f"language:\n- {src}\n- {tgt}", "---",
        "", f"# {run_cfg.get('name', 'transformer-nmt')} ({src} -> {tgt})", "",
        ("A Transformer (Vaswani et al., 2017) trained with transformer-nmt and exported to "
         "`MarianMTModel` with logits equal to the original's (channel order of the residual "
         "stream permuted to Marian's sinusoid layout; see `transformer_nmt.export`)."), "",
        "```python",
        "from transformers import MarianMTModel, MarianTokenizer",
        "model = MarianMTModel.from_pretrained(\"path/to/this/folder\")",
        "tokenizer = MarianTokenizer.from_pretrained(\"path/to/this/folder\")",
        "batch = tokenizer([\"A dog runs on the beach.\"], return_tensors=\"pt\", padding=True)",
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```", "",
        ("transformers 4.x also runs `pipeline(\"translation\", model=folder)`; transformers 5 "
         "removed the translation pipeline."), "",
        "## Training data", "",
        (f"- corpus: {data.name} ({data.corpus}), {src} -> {tgt}; shared SentencePiece "
         f"{data.get('spm_model_type', 'bpe')} vocabulary of {vocab_size} pieces "
         f"(source.spm = target.spm), text normalised with {data.get('unicode_form')} "
         "before SentencePiece by transformer-nmt (MarianTokenizer does not normalise)"),
        "",
        "## Recipe", "",
        (f"- model: {model.get('name')}: {model.encoder_layers}+{model.decoder_layers} layers, "
         f"d_model {model.d_model}, d_ff {model.d_ff}, {model.heads} heads, {model.norm}-norm, "
         f"{model.positions} positions, embeddings shared ({model.share_embeddings}), "
         f"dropout {model.dropout}"),
        (f"- training: max_tokens {_fmt(trainer.get('max_tokens'))} x update_freq "
         f"{_fmt(trainer.get('update_freq'))}, warmup_steps {_fmt(trainer.get('warmup_steps'))}, "
         f"lr_multiplier {_fmt(trainer.get('lr_multiplier'))}, label_smoothing "
         f"{_fmt(trainer.get('label_smoothing'))}, Adam betas "
         f"{_fmt(_plain(trainer.get('adam_betas')))}"),
        f"- steps: {_fmt(ckpt.get('step'))}"
        + (f", parameters averaged over {len(ckpt['averaged_from'])} checkpoints "
           f"({', '.join(ckpt['averaged_from'])})" if ckpt.get("averaged_from") else ""),
        (f"- decoding used for the scores below: beam {_fmt(decode.get('beam_size'))}, length "
         f"penalty {_fmt(decode.get('lenpen'))} ({_fmt(decode.get('lenpen_form'))} form), "
         f"max length {_fmt(decode.get('max_len_a'))} x source + {_fmt(decode.get('max_len_b'))}"),
        "",
        "## Results", "",
    ]
    if results and results.get("test_sets"):
        lines += ["| test set | sentences | sacreBLEU | signature | tokenized BLEU |",
                  "|---|---:|---:|---|---:|"]
        for split, r in results["test_sets"].items():
            sacre = r.get("bleu", {}).get("sacrebleu", {})
            tok = r.get("bleu", {}).get("tokenized_bleu", {})
            score = sacre.get("score")
            tok_score = tok.get("score")
            lines.append(
                f"| {split} | {r.get('sentences')} | "
                f"{'-' if score is None else f'{score:.2f}'} | `{sacre.get('signature', '-')}` | "
                f"{'-' if tok_score is None else f'{tok_score:.2f}'} |")
        lines += ["", (f"Measured by `nmt-evaluate` on {results.get('date', '-')} with "
                       f"{results.get('checkpoint', '-')}.")]
    else:
        lines.append("No results.json in the run folder: run `nmt-evaluate` before exporting to "
                     "record BLEU here.")
    lines += ["", ("Hugging Face `generate` uses the length penalty |Y|^alpha; the transformer-nmt "
                   "default is the paper's ((5 + |Y|) / 6)^alpha, so beam outputs can differ "
                   "slightly from the scores above."), ""]
    return "\n".join(lines)


def _atomic_dir(out_dir: Path, overwrite: bool):
    """Context: a temporary folder beside ``out_dir``, renamed to it on success."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists() and not overwrite:
            raise ExportError(f"{out_dir} exists; pass export.overwrite=true to replace it")
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
        try:
            yield tmp
            if out_dir.exists():
                old = out_dir.with_name(f".{out_dir.name}.old.{os.getpid()}")
                os.replace(out_dir, old)
                os.replace(tmp, out_dir)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return ctx()


def _load(checkpoint: str | Path):
    from transformer_nmt.checkpoint import config_of, load_checkpoint, load_model

    ckpt = load_checkpoint(checkpoint)
    model, _ = load_model(checkpoint, "cpu")
    return ckpt, config_of(ckpt), model


def write_tokenizer_files(spm_path: Path, folder: Path, run_cfg: DictConfig,
                          max_length: int) -> None:
    """source.spm, target.spm, vocab.json, tokenizer_config.json for ``MarianTokenizer``."""
    pieces = _piece_vocab(spm_path)
    shutil.copyfile(spm_path, folder / "source.spm")
    shutil.copyfile(spm_path, folder / "target.spm")
    (folder / "vocab.json").write_text(
        json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False, indent=0),
        encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "MarianTokenizer", "source_lang": run_cfg.data.src_lang,
        "target_lang": run_cfg.data.tgt_lang, "pad_token": SPECIAL_PIECES[PAD_ID],
        "unk_token": SPECIAL_PIECES[UNK_ID], "eos_token": SPECIAL_PIECES[EOS_ID],
        "separate_vocabs": False, "model_max_length": max_length,
    }, indent=2), encoding="utf-8")


def export_hf(checkpoint: str | Path, spm_path: str | Path, out_dir: str | Path,
              results: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
    """Write a folder that ``MarianMTModel``/``MarianTokenizer.from_pretrained`` load as is.

    Files: config.json, generation_config.json, model.safetensors, source.spm, target.spm
    (both our shared model), vocab.json (piece -> id), tokenizer_config.json, README.md
    (model card) and transformer_nmt.json (what nmt-import needs to restore our tokenizer).

    Args:
        checkpoint: our checkpoint or averaged model file.
        spm_path: the run's shared SentencePiece model.
        out_dir: the folder to write (through a temporary folder and a rename).
        results: the run's results.json contents, for the model card.
        overwrite: replace an existing folder.

    Raises:
        ExportError: a model Marian cannot express, a SentencePiece model without our
            special ids, or an existing ``out_dir`` without ``overwrite``.
    """
    transformers = require("transformers")
    require("safetensors")
    ckpt, run_cfg, model = _load(checkpoint)
    check_exportable(run_cfg.model, "hf")
    spm_path, out_dir = Path(spm_path), Path(out_dir)
    if not spm_path.is_file():
        raise ExportError(f"SentencePiece model {spm_path} not found (run nmt-prepare first)")
    mm = port_to_marian(model)
    decode = run_cfg.get("decode", {})
    max_length = int(run_cfg.model.max_positions)
    gen = transformers.GenerationConfig(
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, BOS_ID],
        num_beams=int(decode.get("beam_size", 4)), early_stopping=True,
        length_penalty=float(decode.get("lenpen", 1.0))
        if decode.get("lenpen_form") == "fairseq" else 1.0,
        max_length=min(512, max_length),
    )
    mm.generation_config = gen
    with _atomic_dir(out_dir, overwrite) as tmp:
        mm.save_pretrained(tmp, safe_serialization=True)
        write_tokenizer_files(spm_path, tmp, run_cfg, max_length)
        (tmp / "README.md").write_text(
            model_card(run_cfg, ckpt, results, model.vocab_size), encoding="utf-8")
        (tmp / SIDECAR).write_text(json.dumps({
            "unicode_form": _unicode_form(spm_path), "step": ckpt.get("step"),
            "averaged_from": ckpt.get("averaged_from"), "config": _plain(run_cfg),
        }, indent=2), encoding="utf-8")
    log.info("wrote %s", out_dir)
    return out_dir


# --------------------------------------------------------------------------------------
# Import: Marian folder -> our checkpoint
# --------------------------------------------------------------------------------------


def _check_importable(mcfg: MarianConfig, folder: Path) -> None:
    """Refuse a Marian config that our Transformer cannot compute exactly."""
    problems = []
    want = {"pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": BOS_ID,
            "activation_function": "relu", "scale_embedding": True,
            "share_encoder_decoder_embeddings": True}
    for key, value in want.items():
        got = getattr(mcfg, key, None)
        if got != value:
            problems.append(f"{key}={got!r} (needs {value!r})")
    if getattr(mcfg, "tie_word_embeddings", True) is False:
        problems.append("tie_word_embeddings=False (needs True)")
    if getattr(mcfg, "normalize_before", False) or getattr(mcfg, "normalize_embedding", False):
        problems.append("normalize_before/normalize_embedding set (needs post-norm, no "
                        "embedding LayerNorm)")
    if mcfg.encoder_attention_heads != mcfg.decoder_attention_heads or (
            mcfg.encoder_ffn_dim != mcfg.decoder_ffn_dim):
        problems.append("encoder and decoder differ in heads or ffn size")
    if mcfg.d_model % mcfg.encoder_attention_heads:
        problems.append(f"d_model={mcfg.d_model} not divisible by heads")
    if problems:
        hint = (" (an opus-mt model: eos 0, pad last, decoder starting from pad, swish; "
                "not expressible with our special ids)" if mcfg.pad_token_id != PAD_ID else "")
        raise ExportError(f"{folder}: cannot import exactly: " + "; ".join(problems) + hint)


def _tokenizer_of(folder: Path, vocab_size: int) -> Path:
    """The shared SentencePiece model of a Marian folder whose vocab.json equals its ids."""
    src, tgt, vocab = folder / "source.spm", folder / "target.spm", folder / "vocab.json"
    for f in (src, tgt, vocab):
        if not f.is_file():
            raise ExportError(f"{folder}: {f.name} not found (a Marian folder holds source.spm, "
                              "target.spm and vocab.json)")
    if src.read_bytes() != tgt.read_bytes():
        raise ExportError(f"{folder}: source.spm and target.spm differ; our pipeline uses one "
                          "shared SentencePiece model")
    pieces = _piece_vocab(src)
    mapping = json.loads(vocab.read_text(encoding="utf-8"))
    expected = {p: i for i, p in enumerate(pieces)}
    if mapping != expected:
        bad = next((p for p in expected if mapping.get(p) != expected[p]), None)
        raise ExportError(
            f"{vocab}: ids differ from source.spm's piece ids (first: {bad!r} is "
            f"{mapping.get(bad)} in vocab.json, {expected.get(bad)} in source.spm)")
    if len(pieces) != vocab_size:
        raise ExportError(f"{folder}: source.spm has {len(pieces)} pieces, the model "
                          f"vocab_size is {vocab_size}")
    return src


def from_marian_state_dict(sd: dict[str, torch.Tensor], model_cfg: ModelConfig | DictConfig
                           ) -> dict[str, torch.Tensor]:
    """MarianMTModel's state dict -> ours (inverse of :func:`to_marian_state_dict`)."""
    d = int(_get(model_cfg, "d_model"))
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


def model_config_of_marian(mcfg: MarianConfig, base: ModelConfig | DictConfig | dict | None = None
                           ) -> dict[str, Any]:
    """Our ModelConfig fields (a dict) for a MarianConfig; other fields from ``base``."""
    fields = dict(_plain(base)) if base is not None else {}
    fields.update(
        name=fields.get("name", "imported"), encoder_layers=mcfg.encoder_layers,
        decoder_layers=mcfg.decoder_layers, d_model=mcfg.d_model, d_ff=mcfg.encoder_ffn_dim,
        heads=mcfg.encoder_attention_heads, d_k=None, d_v=None, dropout=mcfg.dropout,
        attention_dropout=mcfg.attention_dropout, activation_dropout=mcfg.activation_dropout,
        norm="post", share_embeddings="all", positions="sinusoidal",
        max_positions=mcfg.max_position_embeddings,
    )
    return fields


def import_marian(folder: str | Path, run_cfg: Config | DictConfig, checkpoint_out: str | Path,
                  spm_out: str | Path) -> dict[str, Any]:
    """A Marian-architecture transformers folder -> our model file + shared SentencePiece model.

    Args:
        folder: holds config.json, the weights, source.spm = target.spm and vocab.json.
        run_cfg: the composed run config stored in the checkpoint (its ``model`` is
            replaced by the folder's architecture; a folder written by nmt-export restores
            the exported run's config and text normalisation).
        checkpoint_out: model file to write (``runs/<name>/checkpoints/averaged.pt``).
        spm_out: where the data config expects the SentencePiece model
            (``data/spm/<data.name>/spm.model``); an existing different file is refused.

    Returns:
        The checkpoint dict written (``model``, ``config``, ``vocab_size``, ``step``,
        ``imported_from``).

    Raises:
        ExportError: a folder that cannot be imported exactly (the reason named).
    """
    transformers = require("transformers")
    folder, checkpoint_out, spm_out = Path(folder), Path(checkpoint_out), Path(spm_out)
    if not (folder / "config.json").is_file():
        raise ExportError(f"{folder}: no config.json (not a transformers model folder)")
    mcfg = transformers.AutoConfig.from_pretrained(folder)
    if mcfg.model_type != "marian":
        raise ExportError(f"{folder}: model_type={mcfg.model_type!r}, expected 'marian'")
    _check_importable(mcfg, folder)
    mm = transformers.MarianMTModel.from_pretrained(folder).eval()
    bias = mm.final_logits_bias
    if bool(bias.ne(0).any()):
        raise ExportError(f"{folder}: final_logits_bias is not zero (our pre-softmax layer has "
                          "no bias)")
    spm_src = _tokenizer_of(folder, mcfg.vocab_size)
    sidecar = json.loads((folder / SIDECAR).read_text(encoding="utf-8")) if (
        folder / SIDECAR).is_file() else {}
    cfg = OmegaConf.create(_plain(run_cfg))
    base = sidecar.get("config", {}).get("model") if sidecar else None
    cfg.model = model_config_of_marian(mcfg, base if base is not None else cfg.model)
    if spm_out.is_file() and spm_out.read_bytes() != spm_src.read_bytes():
        raise ExportError(f"{spm_out} exists and differs from {spm_src}; import under another "
                          "data.name (the SentencePiece model lives in data/spm/<data.name>/)")
    from transformer_nmt.bpe import meta_path
    from transformer_nmt.checkpoint import save_checkpoint
    from transformer_nmt.fileio import atomic_write
    from transformer_nmt.model import Transformer

    state = from_marian_state_dict(mm.state_dict(), cfg.model)
    Transformer(cfg.model, mcfg.vocab_size).load_state_dict(state)  # shapes and names check
    ckpt = {"model": state, "config": to_plain(cfg),
            "vocab_size": int(mcfg.vocab_size), "step": sidecar.get("step"),
            "imported_from": str(folder.resolve())}
    spm_out.parent.mkdir(parents=True, exist_ok=True)
    if not spm_out.is_file():
        with atomic_write(spm_out, "wb") as f:
            f.write(spm_src.read_bytes())
    form = sidecar.get("unicode_form")
    if form is not None and not meta_path(spm_out).is_file():
        with atomic_write(meta_path(spm_out)) as f:
            json.dump({"params": {"unicode_form": form}, "imported_from": str(folder)}, f)
    save_checkpoint(checkpoint_out, ckpt)
    log.info("imported %s into %s (tokenizer %s)", folder, checkpoint_out, spm_out)
    return ckpt


def load_initial_weights(model: Any, path: str | Path) -> None:
    """``trainer.init_from``: copy a model file's weights into a freshly built model.

    For fine-tuning from an imported (or any) model; optimizer, schedule and counters start
    from scratch. The run's model config must describe the same architecture.

    Raises:
        ExportError: a different vocabulary size, or parameters missing, extra or of
            another shape (named).
    """
    from transformer_nmt.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    if int(ckpt["vocab_size"]) != model.vocab_size:
        raise ExportError(f"trainer.init_from={path}: vocabulary of {ckpt['vocab_size']} pieces, "
                          f"the run's model has {model.vocab_size}")
    own = model.state_dict()
    bad = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in ckpt["model"].items()
           if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(ckpt["model"]))
    extra = sorted(set(ckpt["model"]) - set(own))
    if bad or missing or extra:
        raise ExportError(f"trainer.init_from={path} does not fit the run's model config: "
                          f"shapes {bad[:3]}, missing {missing[:3]}, extra {extra[:3]}")
    model.load_state_dict(ckpt["model"])


# --------------------------------------------------------------------------------------
# CTranslate2
# --------------------------------------------------------------------------------------


def ctranslate2_spec(model: Any, pieces: Sequence[str]):
    """CTranslate2 ``TransformerSpec`` filled from our model (no copy of Marian involved).

    Layouts: our fused [W^Q | W^K | W^V] is CTranslate2's self-attention ``linear[0]``,
    our [W^K | W^V] its encoder-decoder ``linear[1]``; positions are our own table
    (sinusoidal or learned), embeddings scaled by sqrt(D), decoder start ``<s>``, LayerNorm
    epsilon 1e-5, post- or pre-norm (with the final LayerNorms).

    Raises:
        ExportError: d_k != d_v or d_k * heads != d_model.
    """
    require("ctranslate2")
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    check_exportable(cfg, "ctranslate2")
    pre = cfg.norm == "pre"
    spec = transformer_spec.TransformerSpec.from_config(
        (int(cfg.encoder_layers), int(cfg.decoder_layers)), int(cfg.heads), pre_norm=pre,
        activation=common_spec.Activation.RELU)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    n = int(cfg.max_positions)
    with torch.no_grad():
        src_pos = model.src_positions(n, 0).float().numpy()
        tgt_pos = model.tgt_positions(n, 0).float().numpy()

    def linear(s, prefix, bias=True):
        s.weight = sd[f"{prefix}.weight"]
        if bias:
            s.bias = sd[f"{prefix}.bias"]

    def norm(s, prefix):
        s.gamma, s.beta = sd[f"{prefix}.weight"], sd[f"{prefix}.bias"]

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = sd["embed_tokens.weight"]
    enc.scale_embeddings = math.sqrt(model.d_model)
    enc.position_encodings.encodings = src_pos
    dec.embeddings.weight = sd["tgt_embed_tokens.weight"]
    dec.scale_embeddings = math.sqrt(model.d_model)
    dec.position_encodings.encodings = tgt_pos
    dec.projection.weight = sd["output_projection.weight"]
    if pre:
        norm(enc.layer_norm, "encoder_norm")
        norm(dec.layer_norm, "decoder_norm")
    def self_attention_and_ffn(layer: Any, o: str) -> None:  # shared by encoder and decoder layers
        linear(layer.self_attention.linear[0], f"{o}.self_attn.in_proj")
        linear(layer.self_attention.linear[1], f"{o}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{o}.self_attn_norm")
        linear(layer.ffn.linear_0, f"{o}.ffn.w_1")
        linear(layer.ffn.linear_1, f"{o}.ffn.w_2")
        norm(layer.ffn.layer_norm, f"{o}.ffn_norm")

    for i, layer in enumerate(enc.layer):
        self_attention_and_ffn(layer, f"encoder_layers.{i}")
    for i, layer in enumerate(dec.layer):
        o = f"decoder_layers.{i}"
        self_attention_and_ffn(layer, o)
        linear(layer.attention.linear[0], f"{o}.cross_attn.q_proj")
        linear(layer.attention.linear[1], f"{o}.cross_attn.kv_proj")
        linear(layer.attention.linear[2], f"{o}.cross_attn.out_proj")
        norm(layer.attention.layer_norm, f"{o}.cross_attn_norm")
    vocab = ["<blank>" if i == PAD_ID else p for i, p in enumerate(pieces)]
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.unk_token = SPECIAL_PIECES[UNK_ID]
    spec.config.bos_token = SPECIAL_PIECES[BOS_ID]
    spec.config.eos_token = SPECIAL_PIECES[EOS_ID]
    spec.config.decoder_start_token = SPECIAL_PIECES[BOS_ID]
    spec.config.add_source_eos = False  # our engine appends </s> itself, as the batcher does
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    return spec


def export_ctranslate2(checkpoint: str | Path, spm_path: str | Path, out_dir: str | Path,
                       quantization: str = "none", overwrite: bool = False) -> Path:
    """Write a CTranslate2 model directory (model.bin, vocabularies, config) plus spm.model.

    Args:
        checkpoint: our checkpoint or averaged model file.
        spm_path: the shared SentencePiece model (copied as ``spm.model``, with ``spm.json``).
        out_dir: the folder to write (temporary folder + rename).
        quantization: ``none`` (float32 weights), ``int8``, ``int8_float32``, ``float16``.
        overwrite: replace an existing folder.

    Raises:
        ExportError: unknown quantization, an inexpressible model, a missing file.
    """
    ctranslate2 = require("ctranslate2")
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"export.quantization={quantization!r} is not one of {list(QUANTIZATIONS)}")
    spm_path, out_dir = Path(spm_path), Path(out_dir)
    if not spm_path.is_file():
        raise ExportError(f"SentencePiece model {spm_path} not found (run nmt-prepare first)")
    _, _, model = _load(checkpoint)
    spec = ctranslate2_spec(model, _piece_vocab(spm_path))

    class _OurConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    with _atomic_dir(out_dir, overwrite) as tmp:
        _OurConverter().convert(str(tmp), quantization=None if quantization == "none"
                                else quantization, force=True)
        shutil.copyfile(spm_path, tmp / "spm.model")
        from transformer_nmt.bpe import meta_path

        if meta_path(spm_path).is_file():
            shutil.copyfile(meta_path(spm_path), tmp / "spm.json")
    log.info("wrote %s (quantization %s)", out_dir, quantization)
    return out_dir


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_ctranslate2(checkpoint: str | Path, spm_path: str | Path) -> Path:
    """The float32 CTranslate2 export of ``checkpoint``, converted on first use.

    Cached in ``<checkpoint folder>/ctranslate2/<first 16 hex digits of the checkpoint's
    SHA-256>/``; a changed checkpoint (another hash) is converted again.
    """
    checkpoint = Path(checkpoint)
    digest = file_sha256(checkpoint)[:16]
    out = checkpoint.parent / "ctranslate2" / digest
    if not (out / "model.bin").is_file():
        log.info("converting %s for CTranslate2 into %s", checkpoint, out)
        export_ctranslate2(checkpoint, spm_path, out, "none", overwrite=True)
    return out


class CTranslate2Engine:
    """Our translate_lines contract, decoded by a ``ctranslate2.Translator``.

    Search settings map one to one: ``beam_size``, ``nbest`` (num_hypotheses), ``lenpen``
    (CTranslate2 divides by |Y|^alpha, our ``lenpen_form=fairseq``), stopping once K
    hypotheses have finished (``patience`` 1, our ``stopping=beam``), ``pad`` and ``bos``
    never generated, at least one token before ``eos``. Sentences are decoded in groups of
    equal source length so that each has its own maximum output length
    ``max_len_a * src_len + max_len_b``. Differences that remain: a hypothesis that reaches
    the length limit ends there without the forced ``eos`` of our search; ``lenpen_form=gnmt``
    and ``stopping=bound`` have no CTranslate2 counterpart (a warning says so once).

    Args:
        model_dir: a CTranslate2 model directory of ours (:func:`export_ctranslate2`).
        device: ``cpu`` or ``cuda``.
        compute_type: CTranslate2 compute type (``float32``, ``int8``, ``bfloat16``, ...).
        max_positions: the model's position table size (caps the output length).
    """

    is_ctranslate2 = True

    def __init__(self, model_dir: str | Path, device: str = "cpu", compute_type: str = "float32",
                 max_positions: int = 1024, threads: int | None = None) -> None:
        ctranslate2 = require("ctranslate2")
        self.model_dir = Path(model_dir)
        self.device, self.compute_type = device, compute_type
        self.max_positions = int(max_positions)
        self.translator = ctranslate2.Translator(
            str(model_dir), device=device, compute_type=compute_type,
            intra_threads=threads or torch.get_num_threads())
        self._warned = False

    def _warn(self, decode_cfg: DecodeConfig) -> None:
        if self._warned:
            return
        self._warned = True
        if decode_cfg.beam_size > 1 and decode_cfg.lenpen != 0 and decode_cfg.lenpen_form != "fairseq":
            log.warning("decode.engine=ctranslate2 divides scores by |Y|^%s (lenpen_form=fairseq), "
                        "not by the %s form", decode_cfg.lenpen, decode_cfg.lenpen_form)
        if decode_cfg.beam_size > 1 and decode_cfg.stopping != "beam":
            log.warning("decode.engine=ctranslate2 stops a sentence once beam_size hypotheses "
                        "have finished (stopping=beam), not with stopping=%s", decode_cfg.stopping)

    def translate_lines(self, tokenizer: Any, lines: Sequence[str], decode_cfg: DecodeConfig,
                        return_hypotheses: bool = False) -> tuple[list[Any], dict[str, Any]]:
        """Same inputs, outputs and stats as :func:`transformer_nmt.translate.translate_lines`."""
        self._warn(decode_cfg)
        start = time.perf_counter()
        limit = max(1, min(int(decode_cfg.max_input_tokens), int(decode_cfg.max_tokens) - 1))
        sp = tokenizer.sp
        empty = truncated = 0
        groups: dict[int, list[tuple[int, list[str]]]] = {}
        for i, line in enumerate(lines):
            text = line.strip()
            ids = tokenizer.encode(text) if text else []
            if len(ids) > limit:
                log.warning("line %d has %d source tokens, more than the %d allowed; truncated",
                            i + 1, len(ids), limit)
                ids, truncated = ids[:limit], truncated + 1
            if not ids:
                empty += 1
                continue
            pieces = [sp.id_to_piece(t) for t in ids] + [SPECIAL_PIECES[EOS_ID]]
            groups.setdefault(len(pieces), []).append((i, pieces))
        outputs: list[Any] = [[("", 0.0)] if return_hypotheses else "" for _ in lines]
        target_tokens = n_batches = 0
        k, nbest = int(decode_cfg.beam_size), int(decode_cfg.nbest)
        per_batch = max(1, int(decode_cfg.max_tokens))
        for src_len, items in sorted(groups.items()):
            max_len = math.floor(decode_cfg.max_len_a * src_len + decode_cfg.max_len_b)
            max_len = min(max(max_len, 1), self.max_positions - 1)
            step = max(1, per_batch // src_len)
            for b in range(0, len(items), step):
                chunk = items[b:b + step]
                results = self.translator.translate_batch(
                    [p for _, p in chunk], beam_size=k, patience=1,
                    num_hypotheses=nbest if return_hypotheses else 1,
                    length_penalty=float(decode_cfg.lenpen) if k > 1 else 0.0,
                    max_decoding_length=max_len, min_decoding_length=1,
                    suppress_sequences=[["<blank>"], [SPECIAL_PIECES[BOS_ID]]],
                    return_scores=True, max_input_length=0)
                n_batches += 1
                for (i, _), r in zip(chunk, results):
                    hyps = [([sp.piece_to_id(p) for p in h], float(s))
                            for h, s in zip(r.hypotheses, r.scores)]
                    target_tokens += len(hyps[0][0]) + 1
                    if return_hypotheses:
                        outputs[i] = [(tokenizer.decode(t), s) for t, s in hyps]
                    else:
                        outputs[i] = tokenizer.decode(hyps[0][0])
        seconds = time.perf_counter() - start
        stats = {
            "sentences": len(lines), "empty": empty, "truncated": truncated,
            "target_tokens": target_tokens, "seconds": seconds,
            "sentences_per_second": len(lines) / seconds if seconds > 0 else float("nan"),
            "target_tokens_per_second": target_tokens / seconds if seconds > 0 else float("nan"),
            "batches": n_batches, "device": self.device, "precision": self.compute_type,
            "beam_size": k, "engine": f"ctranslate2 ({self.compute_type})",
        }
        log.info("translated %d sentences with CTranslate2 (%s, beam %d) in %.2f s: %.1f "
                 "sentences/s", len(lines), self.compute_type, k, seconds,
                 stats["sentences_per_second"])
        return outputs, stats


def decode_engine(model: Any, checkpoint: str | Path, cfg: Config, device: Any) -> Any:
    """The decoder for ``cfg.decode.engine``: ``model`` itself, or a CTranslate2 engine.

    ``ctranslate2`` converts the checkpoint on first use (:func:`cached_ctranslate2`) and
    decodes in float32 (bfloat16 / float16 on a GPU with that ``decode.precision``);
    ``ctranslate2_int8`` with int8 weights and products.

    Raises:
        ExportError: an unknown engine, or the export extra missing.
    """
    engine = str(_get(cfg.decode, "engine", "native") or "native")
    if engine == "native":
        return model
    if engine not in ENGINES:
        raise ExportError(f"decode.engine={engine!r} is not one of {list(ENGINES)}")
    from transformer_nmt.fileio import spm_model_path

    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    if engine == "ctranslate2_int8":
        compute = "int8"
    else:
        compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[cfg.decode.precision]
        if dev == "cpu" and compute != "float32":
            compute = "float32"
    folder = cached_ctranslate2(checkpoint, spm_model_path(cfg.data))
    return CTranslate2Engine(folder, dev, compute, int(model.cfg.max_positions))
