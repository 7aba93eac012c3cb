"""Export to CTranslate2, and the ``decode.engine=ctranslate2`` decoding engine.

CTranslate2's transformers converter for Marian drops the last vocabulary entry (``<pad>``)
and starts the decoder from a zero embedding, which our vocabulary does not follow, so
:func:`export_ctranslate2` fills CTranslate2's own ``TransformerSpec`` from our state dict
(its fused layouts are ours), with our position table (sinusoidal or learned), ``<s>`` as
decoder start token, post- or pre-norm. :func:`cached_ctranslate2` converts a checkpoint
once for decoding; :class:`CTranslate2Engine` decodes with it behind the same interface as
our model.
"""


from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Config,
    DecodeConfig,
    field_value,
)
from transformer_nmt.data.bpe import meta_path
from transformer_nmt.decode.progress import decode_progress
from transformer_nmt.decode.translate import input_limit, warn_truncated
from transformer_nmt.fileio import atomic_write, file_digest, spm_model_path
from transformer_nmt.interop.common import (
    ENGINES,
    EXPORT_MARKER,
    LAYER_NORM_EPS,
    SPECIAL_PIECES,
    ExportError,
    NotWritableError,
    atomic_export_folder,
    check_exportable,
    check_tokenizer,
    load_exported_model,
    piece_vocab,
    require,
)
from transformer_nmt.runtime import device_name

log = logging.getLogger(__name__)


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
        (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=pre,
        activation=common_spec.Activation.RELU)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    n = cfg.max_positions
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
        quantization: an ``export.quantization`` (:class:`transformer_nmt.choices.Quantization`):
            ``none`` (float32 weights), ``int8``, ``int8_float32``, ``float16``.
        overwrite: replace an existing folder.

    Raises:
        ExportError: unknown quantization, an inexpressible model, a missing file.
        DataError: ``spm_path`` is not the vocabulary the checkpoint was trained with.
    """
    ctranslate2 = require("ctranslate2")
    spm_path, out_dir = Path(spm_path), Path(out_dir)
    check_tokenizer(checkpoint, spm_path)
    _, _, model = load_exported_model(checkpoint)
    spec = ctranslate2_spec(model, piece_vocab(spm_path))

    class _OurConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    with atomic_export_folder(out_dir, overwrite) as tmp:
        _OurConverter().convert(str(tmp), quantization=None if quantization == "none"
                                else quantization, force=True)
        shutil.copyfile(spm_path, tmp / "spm.model")

        if meta_path(spm_path).is_file():
            shutil.copyfile(meta_path(spm_path), tmp / "spm.json")
    log.info("wrote %s (quantization %s)", out_dir, quantization)
    return out_dir


CONVERTER_VERSION = 2
"""Version of :func:`ctranslate2_spec`'s mapping; part of the cache key, so a cache written
by an older mapping is converted again."""


def cache_key(checkpoint: str | Path, spm_path: str | Path, quantization: str = "none") -> str:
    """Hex SHA-256 of everything a conversion depends on: the checkpoint's and the
    SentencePiece model's bytes, the quantization, CTranslate2's version and ours."""
    ctranslate2 = require("ctranslate2")
    parts = {"checkpoint": file_digest(checkpoint), "spm": file_digest(spm_path),
             "quantization": quantization, "ctranslate2": ctranslate2.__version__,
             "converter": CONVERTER_VERSION}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_roots(checkpoint: str | Path) -> list[Path]:
    """Where converted models are cached, in order: ``<checkpoint folder>/ctranslate2/``, then
    ``$XDG_CACHE_HOME/transformer_nmt/ctranslate2/`` (``~/.cache`` by default) for a
    checkpoint folder that cannot be written."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return [Path(checkpoint).parent / "ctranslate2", user / "transformer_nmt" / "ctranslate2"]


def cached_ctranslate2(checkpoint: str | Path, spm_path: str | Path) -> Path:
    """The float32 CTranslate2 export of ``checkpoint`` with ``spm_path``, converted on first use.

    The tokenizer is checked against the checkpoint's vocabulary before anything is
    converted. Cached in ``<root>/<first 16 hex digits of>`` :func:`cache_key` (so another
    checkpoint, tokenizer, quantization or converter is converted again), the root being the
    first of :func:`cache_roots` that holds it or can be written; written through a
    temporary folder and a rename, so a cache folder is complete or absent. After a
    conversion the root keeps one model per checkpoint file (:func:`prune_cache`).

    Raises:
        DataError: the tokenizer is not the checkpoint's vocabulary.
        ExportError: no cache folder can be written; NoSpaceError: the device is full.
    """
    checkpoint, spm_path = Path(checkpoint), Path(spm_path)
    check_tokenizer(checkpoint, spm_path)
    digest = cache_key(checkpoint, spm_path)[:16]
    roots = cache_roots(checkpoint)
    for root in roots:
        if (root / digest / "model.bin").is_file():
            return root / digest
    refused = []
    for root in roots:
        out = root / digest
        log.info("converting %s for CTranslate2 into %s", checkpoint, out)
        try:
            export_ctranslate2(checkpoint, spm_path, out, "none", overwrite=True)
        except NotWritableError as e:
            log.warning("%s; trying the next cache folder", e)
            refused.append(str(e))
            continue
        with atomic_write(out / CACHE_SOURCE) as f:
            json.dump({"checkpoint": str(checkpoint.resolve())}, f)
        prune_cache(root, checkpoint, keep=out)
        return out
    raise ExportError("cannot write a CTranslate2 cache folder: " + "; ".join(refused)
                      + " (decode with decode.engine=native, or make one of them writable)")


CACHE_SOURCE = "source.json"
"""File in a cache folder naming the checkpoint it was converted from (its resolved path)."""


def prune_cache(root: Path, checkpoint: Path, keep: Path) -> list[Path]:
    """Delete the stale conversions in a cache ``root``: those of ``checkpoint`` other than
    ``keep`` (the file was rewritten, e.g. averaged again), those of checkpoint files that no
    longer exist (pruned by ``trainer.keep_last``), and export folders that record no source
    (an earlier layout). Conversions of other checkpoints that still exist are kept; a
    folder that is not a finished export of ours is never touched. Returns what was deleted.
    """
    removed = []
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if folder == keep or not (folder / EXPORT_MARKER).is_file():
            continue
        try:
            source = Path(json.loads((folder / CACHE_SOURCE).read_text(encoding="utf-8"))
                          ["checkpoint"])
        except (OSError, ValueError, KeyError, TypeError):
            source = None
        if source is None or source == checkpoint.resolve() or not source.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if removed:
        log.info("removed %d stale CTranslate2 conversions from %s: %s", len(removed), root,
                 ", ".join(p.name for p in removed))
    return removed


class CTranslate2Engine:
    """Our translate_lines contract, decoded by a ``ctranslate2.Translator``.

    Search settings map one to one: ``beam_size``, ``nbest`` (num_hypotheses), ``lenpen``
    (CTranslate2 divides by |Y|^alpha, our ``lenpen_form=fairseq``), stopping once K
    hypotheses have finished (``patience`` 1, our ``stopping=beam``), ``pad`` and ``bos``
    never generated, at least one token before ``eos``. Sentences are decoded in groups of
    equal source length so that each has its own maximum output length
    ``max_len_a * src_len + max_len_b``. Differences that remain (docs/export.md):
    CTranslate2 bars ``pad``, ``bos`` (and ``eos`` at the first step) on the logits before its
    softmax, which renormalises the scores, where ours masks the log-probabilities after it
    (no CTranslate2 option masks after the softmax); a hypothesis that reaches the length
    limit ends there without the forced ``eos`` of our search; ``lenpen_form=gnmt`` and
    ``stopping=bound`` have no CTranslate2 counterpart (a warning says so once).

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
        if (decode_cfg.beam_size > 1 and decode_cfg.lenpen != 0
                and decode_cfg.lenpen_form != "fairseq"):
            log.warning("decode.engine=ctranslate2 divides scores by |Y|^%s (lenpen_form=fairseq), "
                        "not by the %s form", decode_cfg.lenpen, decode_cfg.lenpen_form)
        if decode_cfg.beam_size > 1 and decode_cfg.stopping != "beam":
            log.warning("decode.engine=ctranslate2 stops a sentence once beam_size hypotheses "
                        "have finished (stopping=beam), not with stopping=%s", decode_cfg.stopping)

    def translate_lines(self, tokenizer: Any, lines: Sequence[str], decode_cfg: DecodeConfig,
                        return_hypotheses: bool = False) -> tuple[list[Any], dict[str, Any]]:
        """Same inputs, outputs and stats as
        :func:`transformer_nmt.decode.translate.translate_lines`."""
        self._warn(decode_cfg)
        start = time.perf_counter()

        limit, why = input_limit(decode_cfg, max_positions=self.max_positions)
        sp = tokenizer.sp
        empty = truncated = 0
        groups: dict[int, list[tuple[int, list[str]]]] = {}
        for i, line in enumerate(lines):
            text = line.strip()
            ids = tokenizer.encode(text) if text else []
            if len(ids) > limit:
                log.warning("line %d has %d source tokens, more than the %d allowed (%s); "
                            "truncated", i + 1, len(ids), limit, why)
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
        with decode_progress(sum(len(items) for items in groups.values())) as progress:
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
                    progress.update(len(chunk))
        warn_truncated(truncated, len(lines), limit, why)
        seconds = time.perf_counter() - start
        stats = {
            "sentences": len(lines), "empty": empty, "truncated": truncated,
            "target_tokens": target_tokens, "seconds": seconds,
            "sentences_per_second": len(lines) / seconds if seconds > 0 else float("nan"),
            "target_tokens_per_second": target_tokens / seconds if seconds > 0 else float("nan"),
            "batches": n_batches, "device": self.device, "hardware": device_name(self.device),
            "precision": self.compute_type,
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
        ExportError: an unknown engine, the export extra missing, ``decode.precision``
            bf16 / fp16 with ``ctranslate2`` on a CPU (it would run float32), or int8 with
            ``ctranslate2`` (CTranslate2's int8 is ``decode.engine=ctranslate2_int8``).
    """
    engine = str(field_value(cfg.decode, "engine", "native") or "native")
    if engine == "native":
        return model
    if engine not in ENGINES:
        raise ExportError(f"decode.engine={engine!r} is not one of {list(ENGINES)}")

    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    if engine == "ctranslate2_int8":
        compute = "int8"
    elif cfg.decode.precision == "int8":
        raise ExportError(
            f"decode.engine={engine} decode.precision=int8: decode.precision=int8 quantizes "
            "our engine's model; for CTranslate2's int8 use decode.engine=ctranslate2_int8 "
            "(with decode.precision=fp32)")
    else:
        compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[cfg.decode.precision]
        if dev == "cpu" and compute != "float32":
            raise ExportError(
                f"decode.engine={engine} decode.precision={cfg.decode.precision} needs a GPU: "
                "CTranslate2 computes in float32 on a CPU; use decode.precision=fp32 (or "
                "decode.engine=ctranslate2_int8)")
    folder = cached_ctranslate2(checkpoint, spm_model_path(cfg.data))
    return CTranslate2Engine(folder, dev, compute, int(model.cfg.max_positions))
