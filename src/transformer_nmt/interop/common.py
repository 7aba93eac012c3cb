"""What the export and import formats share: errors, special pieces, model card, atomic folders.

What a target cannot express exactly is refused with :class:`ExportError` (the CLI prints
it as one ``error:`` line and exits 2): pre-norm and learned positions for Marian, d_k or
d_v other than d_model / heads, untied embeddings for Marian.
"""


from __future__ import annotations

import errno
import glob
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from transformer_nmt.checkpoint import (
    check_vocab,
    checkpoint_step,
    config_of,
    load_checkpoint,
    load_model,
)
from transformer_nmt.choices import Engine, ExportFormat, Quantization
from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Config,
    ModelConfig,
    field_value,
)
from transformer_nmt.data.bpe import SentencePieceTokenizer, meta_path
from transformer_nmt.errors import ExportError, NotWritableError
from transformer_nmt.fileio import read_json, umask, write_error
from transformer_nmt.run.results import format_value

log = logging.getLogger(__name__)

SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
"""Pieces of our special ids in the shared SentencePiece model (bpe.py trains it so)."""
FORMATS = tuple(f.value for f in ExportFormat)
"""``export.format`` values (:class:`transformer_nmt.choices.ExportFormat`)."""
QUANTIZATIONS = tuple(q.value for q in Quantization)
"""``export.quantization`` values (:class:`transformer_nmt.choices.Quantization`)."""
ENGINES = tuple(e.value for e in Engine)
"""``decode.engine`` values: our beam search, CTranslate2 float32 (or the decode precision
on GPU), CTranslate2 with int8 weights and matrix products."""
LAYER_NORM_EPS = 1e-5
"""torch.nn.LayerNorm's default epsilon, which our model and MarianMTModel both use."""
SIDECAR = "transformer_nmt.json"
"""File in an exported folder recording what import needs beyond the weights (the text
normalisation of our tokenizer, the run's model config)."""


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


def check_exportable(model_cfg: ModelConfig, target: str) -> None:
    """Refuse a model that ``target`` (an ``export.format``: ``hf`` or ``ctranslate2``)
    cannot compute exactly.

    Raises:
        ExportError: naming the config field and value.
    """
    d, h = int(field_value(model_cfg, "d_model")), int(field_value(model_cfg, "heads"))
    d_k, d_v = field_value(model_cfg, "d_k"), field_value(model_cfg, "d_v")
    d_k = d // h if d_k is None else int(d_k)
    d_v = d // h if d_v is None else int(d_v)
    if d_k != d_v or d_k * h != d:
        raise ExportError(
            f"model.d_k={d_k} and model.d_v={d_v} with heads={h}, d_model={d}: {target} needs "
            "d_k = d_v = d_model / heads"
        )
    if target == "hf":
        if field_value(model_cfg, "norm") != "post":
            raise ExportError(
                f"model.norm={field_value(model_cfg, 'norm')}: MarianMTModel is post-norm only")
        if field_value(model_cfg, "positions") != "sinusoidal":
            raise ExportError(
                f"model.positions={field_value(model_cfg, 'positions')}: MarianMTModel rebuilds "
                "sinusoidal positions on load and cannot hold learned ones"
            )
        if field_value(model_cfg, "share_embeddings") != "all":
            raise ExportError(
                f"model.share_embeddings={field_value(model_cfg, 'share_embeddings')}: the Marian "
                "export writes one shared embedding (share_embeddings=all)"
            )


def piece_vocab(spm_path: Path) -> list[str]:
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


def unicode_form_of(spm_path: Path) -> str | None:
    """The Unicode normalization recorded beside a SentencePiece model (``spm.json``), or None."""
    meta = meta_path(spm_path)
    if meta.is_file():
        return read_json(meta)["params"].get("unicode_form")
    return None


def model_card(run_cfg: Config, ckpt: dict[str, Any], results: dict[str, Any] | None,
               vocab_size: int) -> str:
    """README.md of an exported folder: data, recipe, steps (of a training checkpoint or a
    model file: :func:`transformer_nmt.checkpoint.checkpoint_step`), measured BLEU with
    signatures."""
    data, model, trainer, decode = run_cfg.data, run_cfg.model, run_cfg.trainer, run_cfg.decode
    src, tgt = data.src_lang, data.tgt_lang
    lines = [
        "---", "library_name: transformers", "pipeline_tag: translation", "tags:",
        "- translation", "- marian", "- transformer-nmt", f"language:\n- {src}\n- {tgt}", "---",
        "", f"# {run_cfg.name} ({src} -> {tgt})", "",
        ("A Transformer (Vaswani et al., 2017) trained with transformer-nmt and exported to "
         "`MarianMTModel` with logits equal to the original's (channel order of the residual "
         "stream permuted to Marian's sinusoid layout; see `transformer_nmt.interop`)."), "",
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
         f"{data.spm_model_type} vocabulary of {vocab_size} pieces "
         f"(source.spm = target.spm), text normalised with {data.unicode_form} "
         "before SentencePiece by transformer-nmt (MarianTokenizer does not normalise)"),
        "",
        "## Recipe", "",
        (f"- model: {model.name}: {model.encoder_layers}+{model.decoder_layers} layers, "
         f"d_model {model.d_model}, d_ff {model.d_ff}, {model.heads} heads, {model.norm}-norm, "
         f"{model.positions} positions, embeddings shared ({model.share_embeddings}), "
         f"dropout {model.dropout}"),
        (f"- training: max_tokens {trainer.max_tokens} x update_freq {trainer.update_freq}, "
         f"warmup_steps {trainer.warmup_steps}, lr_multiplier {trainer.lr_multiplier} "
         f"({field_value(trainer, 'lr_scheduler', 'inverse_sqrt')}), "
         f"label_smoothing {trainer.label_smoothing}, Adam betas {list(trainer.adam_betas)}"),
        f"- steps: {format_value(checkpoint_step(ckpt))}"
        + (f", parameters averaged over {len(ckpt['averaged_from'])} checkpoints "
           f"({', '.join(ckpt['averaged_from'])})" if ckpt.get("averaged_from") else ""),
        (f"- decoding used for the scores below: beam {decode.beam_size}, length "
         f"penalty {decode.lenpen} ({decode.lenpen_form} form), "
         f"max length {decode.max_len_a} x source + {decode.max_len_b}"),
        "",
        "## Results", "",
    ]
    if results and results.get("test_sets"):
        lines += ["| test set | sentences | sacreBLEU | signature | tokenized BLEU |",
                  "|---|---:|---:|---|---:|"]
        for split, r in results["test_sets"].items():
            sacre = r.get("bleu", {}).get("sacrebleu", {})
            tok = r.get("bleu", {}).get("paper_bleu") or {}
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


EXPORT_MARKER = ".transformer_nmt_export"
"""Empty file that every folder written by :func:`atomic_export_folder` holds: only a folder with
it is ever replaced, so an export can never remove a run, a checkpoint folder or data."""


def _refuse_output(out_dir: Path, overwrite: bool) -> None:
    """Refuse to replace ``out_dir`` unless it is an earlier export of ours and ``overwrite``."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportError(f"export output {out_dir} exists and is a file, not an export folder; "
                          "choose another export.output")
    if not (out_dir / EXPORT_MARKER).is_file():
        raise ExportError(
            f"export output {out_dir} exists and is not an export folder written by nmt-export "
            f"(no {EXPORT_MARKER} in it); it is never replaced: choose another export.output "
            "(e.g. a new folder under <run_dir>/export/)")
    found = next((p for p in out_dir.rglob("*.pt")), None) or next(
        (p for p in (out_dir / "checkpoints", out_dir / ".hydra") if p.exists()), None)
    if found is not None:
        raise ExportError(f"export output {out_dir} holds {found}, which nmt-export did not write; "
                          "it is never replaced: choose another export.output")
    if not overwrite:
        raise ExportError(f"{out_dir} holds an earlier export; pass export.overwrite=true to "
                          "replace it")


def _umask_permissions(folder: Path) -> None:
    """Give ``folder``, its sub-folders and files the permissions a folder or file created
    under the process's umask gets (``mkdtemp`` makes 0700; some writers make 0600 files),
    so that a model handed to other users of a shared machine can be read."""
    mask = umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            path = os.path.join(root, f)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def check_tokenizer(checkpoint: str | Path, spm_path: Path) -> None:
    """Refuse to export ``checkpoint`` with a SentencePiece model other than the one it was
    trained with (by SHA-256, as nmt-translate checks:
    :func:`transformer_nmt.checkpoint.check_vocab`).

    Raises:
        ExportError: ``spm_path`` does not exist; DataError: another vocabulary (both named).
    """
    if not spm_path.is_file():
        raise ExportError(f"SentencePiece model {spm_path} not found (run nmt-prepare first)")
    check_vocab(checkpoint, SentencePieceTokenizer(spm_path))


_KILLED_EXPORT = re.compile(r"^(?:[a-z0-9_]{8}|old\.\d+)$")
"""What follows ``.<name>.`` in the temporary folders of an export (``tempfile.mkdtemp``'s
eight characters) and in the folder it replaces (``old.<pid>``)."""


def remove_killed_exports(out_dir: Path) -> list[Path]:
    """Remove the temporary folders that an export of ``out_dir`` killed before its end left
    beside it (``.<name>.<random>/``, ``.<name>.old.<pid>/``), each holding
    :data:`EXPORT_MARKER` or nothing but files an export writes; returns them. Called by the
    export that holds ``out_dir``'s lock (``nmt-export``), so none is another export's."""
    removed = []
    prefix = f".{out_dir.name}."
    for p in out_dir.parent.glob(f"{glob.escape(prefix)}*"):
        rest = p.name[len(prefix):]
        if p.is_dir() and not p.is_symlink() and _KILLED_EXPORT.match(rest):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if removed:
        log.warning("removed %d folder(s) left by an export killed before its end: %s",
                    len(removed), ", ".join(str(p) for p in removed))
    return removed


def atomic_export_folder(out_dir: Path, overwrite: bool):
    """Context: a temporary folder beside ``out_dir``, renamed to it on success.

    The folder gets :data:`EXPORT_MARKER` and the umask's permissions (not the temporary
    folder's 0700). An ``out_dir`` that is a symlink is replaced where it points, the link
    kept; the folders an earlier export killed before its end left beside it are removed
    first (:func:`remove_killed_exports`). An existing ``out_dir`` is replaced only when it
    holds that marker (an earlier export) and ``overwrite`` is true: an export never removes a
    folder it did not write.

    Raises:
        ExportError: ``out_dir`` exists and is not a replaceable export folder.
        WriteError: the device filled up (NoSpaceError), a quota or the file-size limit was
            reached while writing (nothing is left behind).
    """
    import contextlib

    @contextlib.contextmanager
    def ctx():
        _refuse_output(out_dir, overwrite)
        # an export folder reached through a symlink is replaced where the link points, and
        # the link kept
        target = out_dir.resolve() if out_dir.is_symlink() else out_dir
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_killed_exports(target)
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        except OSError as e:
            if isinstance(e, PermissionError) or e.errno == errno.EROFS:
                raise NotWritableError(
                    f"cannot write {out_dir}: {e.strerror} ({e.filename})") from e
            error = write_error(e, out_dir)
            if error is None:
                raise
            raise error from e
        try:
            yield tmp
            (tmp / EXPORT_MARKER).write_bytes(b"")
            _umask_permissions(tmp)
            _refuse_output(out_dir, True)  # written meanwhile by someone else?
            if target.exists():
                old = target.with_name(f".{target.name}.old.{os.getpid()}")
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
        except BaseException as e:
            error = write_error(e, out_dir) if isinstance(e, Exception) else None
            shutil.rmtree(tmp, ignore_errors=True)
            if error is not None:
                raise error from e
            raise
    return ctx()


def load_exported_model(checkpoint: str | Path):
    """The model file an export converts: ``(checkpoint dict, its config, the model on the
    CPU)``."""
    ckpt = load_checkpoint(checkpoint)
    model, _ = load_model(checkpoint, "cpu")
    return ckpt, config_of(ckpt), model
