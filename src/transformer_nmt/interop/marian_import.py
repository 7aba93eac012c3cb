"""Import a Marian-architecture Hugging Face folder as our checkpoint (nmt-import).

    nmt-import export.source=path/to/marian_folder name=imported data.name=imported_spm
    nmt-translate name=imported data.name=imported_spm translate.input=in.en
    nmt-train experiment=multi30k_en_de trainer.init_from=runs/imported/checkpoints/averaged.pt

:func:`run_import` writes ``<run_dir>/checkpoints/averaged.pt`` (the model, the composed
config with the folder's architecture, ``imported_from``) and copies the shared
SentencePiece model to ``data/spm/<data.name>/spm.model``, where nmt-translate and
nmt-evaluate look for it.

opus-mt models (eos 0, pad last, decoder starting from the pad's zero embedding, no bos,
two SentencePiece models with a separate vocab.json) cannot be mapped onto a shared
SentencePiece model with our ids without changing the softmax; import refuses them.
"""


from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Config,
    ModelConfig,
    to_plain,
)

if TYPE_CHECKING:
    from transformers import MarianConfig
from transformer_nmt.checkpoint import (
    AVERAGED_NAME,
    checkpoint_dir,
    read_checkpoint,
    save_checkpoint,
)
from transformer_nmt.config import UnicodeForm
from transformer_nmt.data.bpe import meta_path, vocab_identity
from transformer_nmt.fileio import atomic_write, spm_model_path
from transformer_nmt.interop.common import SIDECAR, ExportError, piece_vocab, require
from transformer_nmt.interop.marian import from_marian_state_dict, model_config_of_marian
from transformer_nmt.model.transformer import Transformer

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# Import: Marian folder -> our checkpoint
# --------------------------------------------------------------------------------------


MAX_POSITION_EMBEDDINGS = 65_536
"""The most positions a config.json may give (``max_position_embeddings``): beyond any
translation model, and the sinusoid tables built for them are allocated whole."""
SIZE_KEYS = ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
             "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
             "decoder_ffn_dim", "max_position_embeddings")
"""The sizes of config.json that say how much memory the model takes."""


def _bytes(n: float) -> str:
    """``n`` bytes in the largest unit of 1000 that keeps a number of at least 1 (``256 TB``)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a dict, its sizes checked before anything is allocated.

    Raises:
        ExportError: no config.json; not JSON (truncated: the line and column); not an object;
            a size of :data:`SIZE_KEYS` that is not a whole number, below 1, or (positions)
            above :data:`MAX_POSITION_EMBEDDINGS`, named with the memory it implies.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise ExportError(f"{folder}: no config.json (not a transformers model folder)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text ({e}); the file is damaged") from e
    except ValueError as e:
        raise ExportError(f"{path}: not valid JSON ({e}); the file is truncated or damaged: "
                          "copy it again from the model's source") from e
    if not isinstance(raw, dict):
        raise ExportError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    problems = []
    for key in SIZE_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            problems.append(f"{key}={value!r} is not a whole number")
        elif key != "max_position_embeddings" and value < 1:
            problems.append(f"{key}={value!r} must be at least 1")
        elif key == "max_position_embeddings" and value > MAX_POSITION_EMBEDDINGS:
            d_model = raw.get("d_model")
            tables = (f"; its two position tables would take "
                      f"{_bytes(value * d_model * 4 * 2)} (x d_model={d_model}, float32)"
                      if isinstance(d_model, int) and d_model > 0 else "")
            problems.append(f"max_position_embeddings={value:g} is beyond any translation model "
                            f"(at most {MAX_POSITION_EMBEDDINGS:,} positions){tables}")
        elif isinstance(value, float):
            problems.append(f"{key}={value!r} is not an integer (write {int(value)})")
    if problems:
        raise ExportError(f"{path}: " + "; ".join(problems) + "; the config is wrong, not the "
                          "weights")
    return raw


def _pickled_code(error: BaseException) -> str | None:
    """The global a ``torch.load(weights_only=True)`` refused (``posix.system``), or
    ``"Python objects"`` when torch names none; None for any other error."""
    text = str(error)
    if "Weights only load failed" not in text:
        return None
    m = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global:? ([\w.]+)", text)
    return m.group(1) if m else "Python objects"


def weight_shapes(folder: Path) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """The weights file transformers reads (``model.safetensors``, else ``pytorch_model.bin``)
    and each tensor's shape, read without loading the tensors (the safetensors header; a
    ``.bin`` through ``torch.load(weights_only=True, mmap=True)``); None when the folder has
    neither (sharded weights: transformers reports them).

    Raises:
        ExportError: the file cannot be read (truncated, another format), or holds pickled
            code, which ``weights_only`` refused and nothing of which ran.
    """
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = folder / name
        if path.is_file():
            break
    else:
        return None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return name, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}

        state = read_checkpoint(path, mmap=True)
        return name, {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}
    except Exception as e:  # safetensors, pickle, torch and OS errors of a damaged file
        cause = e.__cause__ if e.__cause__ is not None else e
        code = _pickled_code(cause)
        if code is not None:
            raise ExportError(
                f"{folder}: cannot read the weights ({name}): the file holds pickled Python "
                f"code ({code}), which was not loaded: torch.load(weights_only=True) refused it, "
                "and nothing of it ran; get the weights as model.safetensors from a source "
                "you trust") from e
        detail = (str(cause).strip().splitlines() or [""])[0][:200]
        raise ExportError(f"{folder}: cannot read the weights ({name}): "
                          f"{type(cause).__name__}: {detail}") from e


def implied_shape(name: str, mcfg: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """The shape config.json gives the Marian tensor ``name`` and the config keys it comes
    from (``((64, 32), ("encoder_ffn_dim", "d_model"))``); None for a name not of a Marian
    model (transformers reports it as unexpected)."""
    d, vocab = mcfg.d_model, mcfg.vocab_size
    if name in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight", "lm_head.weight"):
        return (vocab, d), ("vocab_size", "d_model")
    if name == "final_logits_bias":
        return (1, vocab), ("vocab_size",)
    if name.endswith("embed_positions.weight"):
        return (mcfg.max_position_embeddings, d), ("max_position_embeddings", "d_model")
    m = re.fullmatch(r"model\.(encoder|decoder)\.layers\.\d+\.([\w.]+)\.(weight|bias)", name)
    if m is None:
        return ((d,), ("d_model",)) if re.fullmatch(
            r"model\.(encoder|decoder)\.(layer_norm|layernorm_embedding)\.(weight|bias)",
            name) else None
    side, module, kind = m.groups()
    ffn = f"{side}_ffn_dim"
    ff = getattr(mcfg, ffn)
    if module == "fc1":
        return ((ff, d), (ffn, "d_model")) if kind == "weight" else ((ff,), (ffn,))
    if module == "fc2":
        return ((d, ff), ("d_model", ffn)) if kind == "weight" else ((d,), ("d_model",))
    if module.endswith("_proj") and kind == "weight":
        return (d, d), ("d_model",)
    return (d,), ("d_model",)


def _check_shapes(mcfg: Any, folder: Path) -> None:
    """Check config.json's sizes against the shapes of the weights file before a model of
    that config is built: the layer counts, then every tensor's shape.

    Raises:
        ExportError: the file cannot be read (:func:`weight_shapes`); a layer count or a
            tensor's shape that config.json gets wrong, named with the file's shape and
            the config values.
    """
    found = weight_shapes(folder)
    if found is None:
        return
    name, shapes = found
    for side in ("encoder", "decoder"):
        layers = {int(m.group(1)) for k in shapes
                  if (m := re.match(rf"model\.{side}\.layers\.(\d+)\.", k))}
        want = getattr(mcfg, f"{side}_layers")
        if layers and max(layers) + 1 != want:
            raise ExportError(
                f"{folder}: config.json's {side}_layers={want}, but {name} holds "
                f"{max(layers) + 1} {side} layers (model.{side}.layers.0-{max(layers)}); "
                "config.json does not describe these weights")
    for key, shape in sorted(shapes.items()):
        implied = implied_shape(key, mcfg)
        if implied is None or tuple(implied[0]) == tuple(shape):
            continue
        values = ", ".join(f"{k}={getattr(mcfg, k)}" for k in implied[1])
        raise ExportError(
            f"{folder}: {key} is {list(shape)} in {name}, but config.json implies "
            f"{list(implied[0])} ({values}); config.json does not describe these weights")


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
    if int(getattr(mcfg, "max_position_embeddings", 0) or 0) < 2:
        problems.append(f"max_position_embeddings={mcfg.max_position_embeddings!r} (needs at "
                        "least 2: bos and one token)")
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
    pieces = piece_vocab(src)
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


def _load_exactly(transformers: Any, folder: Path) -> Any:
    """``MarianMTModel.from_pretrained(folder)`` with every parameter loaded from the folder.

    Raises:
        ExportError: unreadable weights (truncated, not safetensors or a torch file), or
            weights that do not fill the config's model exactly (missing, extra or
            mis-shaped tensors, which transformers would fill with random values or drop).
    """
    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    try:
        mm, info = transformers.MarianMTModel.from_pretrained(folder, output_loading_info=True)
    except Exception as e:  # safetensors, pickle, torch and OS errors of a damaged folder
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise ExportError(f"{folder}: cannot read the weights "
                          f"({', '.join(files) or 'none found'}): "
                          f"{type(e).__name__}: {detail}") from e
    problems = []
    for key, what in (("missing_keys", "missing"), ("unexpected_keys", "not in the config's model"),
                      ("mismatched_keys", "of another shape")):
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            problems.append(f"{len(names)} tensors {what} ({shown})")
    if info.get("error_msgs"):
        problems.append("; ".join(map(str, info["error_msgs"]))[:200])
    if problems:
        raise ExportError(f"{folder}: the weights ({', '.join(files)}) do not fill config.json's "
                          "model exactly: " + "; ".join(problems))
    return mm.eval()


def _sidecar(folder: Path) -> dict[str, Any]:
    """The folder's transformer_nmt.json (written by nmt-export), checked; {} without one.

    Raises:
        ExportError: not JSON, or a ``unicode_form`` that is not one of ours.
    """
    path = folder / SIDECAR
    if not path.is_file():
        return {}
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(sidecar, dict):
        raise ExportError(f"{path}: expected a JSON object, got {type(sidecar).__name__}")
    forms = [m.value for m in UnicodeForm]
    form = sidecar.get("unicode_form")
    if form is not None and form not in forms:
        raise ExportError(f"{path}: unicode_form={form!r} is not one of {forms}")
    return sidecar


def import_marian(folder: str | Path, run_cfg: Config, checkpoint_out: str | Path,
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
        ExportError: a folder that cannot be imported exactly (the reason named): a damaged
            config.json or one whose sizes the weights contradict (checked before anything
            of its size is allocated), missing, extra or mis-shaped tensors, unreadable
            weights or weights that hold pickled code (never run), a bad
            transformer_nmt.json.
    """
    transformers = require("transformers")
    folder, checkpoint_out, spm_out = Path(folder), Path(checkpoint_out), Path(spm_out)
    raw = read_config(folder)
    if raw.get("model_type") != "marian":
        raise ExportError(f"{folder}: model_type={raw.get('model_type')!r}, expected 'marian'")
    try:
        mcfg = transformers.AutoConfig.from_pretrained(folder)
    except Exception as e:  # a value transformers' config refuses (its type, its range)
        detail = " ".join(str(e).split())[:300]
        raise ExportError(f"{folder / 'config.json'}: transformers refuses it: "
                          f"{type(e).__name__}: {detail}") from e
    _check_importable(mcfg, folder)
    _check_shapes(mcfg, folder)
    mm = _load_exactly(transformers, folder)
    bias = mm.final_logits_bias
    if bool(bias.ne(0).any()):
        raise ExportError(f"{folder}: final_logits_bias is not zero (our pre-softmax layer has "
                          "no bias)")
    spm_src = _tokenizer_of(folder, mcfg.vocab_size)
    sidecar = _sidecar(folder)
    base = sidecar.get("config", {}).get("model") if sidecar else None
    fields = model_config_of_marian(mcfg, base if base is not None else run_cfg.model)
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = copy.deepcopy(run_cfg)
    cfg.model = ModelConfig(**{k: v for k, v in fields.items() if k in known})
    if spm_out.is_file() and spm_out.read_bytes() != spm_src.read_bytes():
        raise ExportError(f"{spm_out} exists and differs from {spm_src}; import under another "
                          "data.name (the SentencePiece model lives in data/spm/<data.name>/)")

    state = from_marian_state_dict(mm.state_dict(), cfg.model)
    Transformer(cfg.model, mcfg.vocab_size).load_state_dict(state)  # shapes and names check
    ckpt = {"model": state, "config": to_plain(cfg),
            "vocab_size": int(mcfg.vocab_size), "vocab": vocab_identity(spm_src),
            "step": sidecar.get("step"),
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


def run_import(cfg: Config) -> Path:
    """``nmt-import``: import ``cfg.export.source`` into ``cfg.run_dir``; returns the model
    file written (``<run_dir>/checkpoints/averaged.pt``).

    Raises:
        ExportError, FileNotFoundError, ValueError: no source, a target run that already
            holds checkpoints without ``export.overwrite``, a folder that cannot be imported
            exactly.
    """
    source = cfg.export.source
    if not source:
        raise ExportError("export.source=<folder> is required (a Marian transformers folder)")
    folder = checkpoint_dir(cfg.run_dir)
    out = folder / AVERAGED_NAME
    held = sorted(p.name for p in folder.glob("*.pt")) if folder.is_dir() else []
    if held and not cfg.export.overwrite:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ExportError(
            f"{cfg.run_dir} already holds checkpoints ({shown} in {folder}); import under "
            f"another name= (or run_dir=), or pass export.overwrite=true to replace {out.name}")
    import_marian(source, cfg, out, spm_model_path(cfg.data))
    return out
