"""Export a checkpoint to a Hugging Face Marian folder (nmt-export export.format=hf).

The folder loads with ``MarianMTModel.from_pretrained`` and ``MarianTokenizer``: safetensors
weights mapped by :mod:`transformer_nmt.interop.marian`, ``config.json``, the shared
SentencePiece model as ``source.spm`` = ``target.spm``, ``vocab.json`` and a model card.
"""


from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from transformer_nmt.checkpoint import checkpoint_step
from transformer_nmt.config import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Config,
    LenpenForm,
    as_plain,
)
from transformer_nmt.interop.common import (
    SIDECAR,
    SPECIAL_PIECES,
    atomic_export_folder,
    check_exportable,
    check_tokenizer,
    load_exported_model,
    model_card,
    piece_vocab,
    require,
    unicode_form_of,
)
from transformer_nmt.interop.marian import port_to_marian

log = logging.getLogger(__name__)


def write_tokenizer_files(spm_path: Path, folder: Path, run_cfg: Config,
                          max_length: int) -> None:
    """source.spm, target.spm, vocab.json, tokenizer_config.json for ``MarianTokenizer``."""
    pieces = piece_vocab(spm_path)
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
        DataError: ``spm_path`` is not the vocabulary the checkpoint was trained with.
    """
    transformers = require("transformers")
    require("safetensors")
    ckpt, run_cfg, model = load_exported_model(checkpoint)
    check_exportable(run_cfg.model, "hf")
    spm_path, out_dir = Path(spm_path), Path(out_dir)
    check_tokenizer(checkpoint, spm_path)
    mm = port_to_marian(model)
    decode = run_cfg.decode
    max_length = run_cfg.model.max_positions
    gen = transformers.GenerationConfig(
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, BOS_ID],
        num_beams=decode.beam_size, early_stopping=True,
        length_penalty=decode.lenpen if decode.lenpen_form == LenpenForm.fairseq else 1.0,
        max_length=min(512, max_length),
    )
    mm.generation_config = gen
    with atomic_export_folder(out_dir, overwrite) as tmp:
        mm.save_pretrained(tmp, safe_serialization=True)
        write_tokenizer_files(spm_path, tmp, run_cfg, max_length)
        (tmp / "README.md").write_text(
            model_card(run_cfg, ckpt, results, model.vocab_size), encoding="utf-8")
        (tmp / SIDECAR).write_text(json.dumps({
            "unicode_form": unicode_form_of(spm_path), "step": checkpoint_step(ckpt),
            "averaged_from": ckpt.get("averaged_from"), "config": as_plain(run_cfg),
        }, indent=2), encoding="utf-8")
    log.info("wrote %s", out_dir)
    return out_dir
