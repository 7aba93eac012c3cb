"""Reading a checkpoint or model file: the one ``torch.load`` (:func:`read_checkpoint`,
``weights_only=True``), its one-line errors, its metadata without its tensors, and its
vocabulary against a tokenizer's."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.data.bpe import (
    SentencePieceTokenizer,
    describe_vocabulary,
    file_only_note,
    same_vocabulary,
    vocab_identity,
)
from transformer_nmt.errors import DataError, MissingFileError, UnreadableCheckpointError

log = logging.getLogger(__name__)


def checkpoint_step(ckpt: dict[str, Any]) -> int | None:
    """The optimizer step of a training checkpoint (``train_state.step``) or a model file
    (``step``); None when it has neither."""
    if "train_state" in ckpt:
        return int(ckpt["train_state"]["step"])
    step = ckpt.get("step")
    return int(step) if step is not None else None


def unreadable_checkpoint(path: str | os.PathLike, error: BaseException):
    """The one-line :class:`~transformer_nmt.errors.UnreadableCheckpointError` for ``path``
    after ``torch.load`` failed with ``error``: an empty file, Python objects that
    ``weights_only`` refuses (a pickle payload: nothing of it ran), or a truncated or foreign
    file (its size and torch's first sentence)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    detail = " ".join(str(error).split())
    detail = detail.split(". ")[0][:160] if detail else type(error).__name__
    if size == 0:
        what = "an empty file (0 bytes)"
    elif "Weights only load failed" in detail:
        what = (f"it holds Python objects other than tensors and plain values ({size:,} bytes), "
                "which are refused because loading them could run code; use a checkpoint "
                "written by this project")
    elif size is not None:
        what = f"truncated or not a checkpoint ({size:,} bytes; {type(error).__name__}: {detail})"
    else:
        what = f"{type(error).__name__}: {detail}"
    return UnreadableCheckpointError(f"cannot read checkpoint {path}: {what}")


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """The one way a checkpoint or model file is read: ``torch.load(weights_only=True)``
    (plain types and tensors only; a pickle payload is refused, never run).

    Args:
        map_location: where tensors go (``torch.load``'s argument).
        mmap: read tensors through a memory map (they stay on disk until touched).

    Raises:
        MissingFileError (a FileNotFoundError): ``checkpoint not found: <path>``.
        UnreadableCheckpointError (a UserError): an empty, truncated or foreign file, or one
            holding Python objects (:func:`unreadable_checkpoint`).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint not found: {path}")
    try:
        try:
            checkpoint = torch.load(path, map_location=map_location, mmap=mmap,
                                    weights_only=True)
        except RuntimeError as e:
            if not (mmap and "mmap can only be used" in str(e)):
                raise
            # not torch's zip format (an old torch.save or a bare pickle): read it whole
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated, another format, refused objects
        raise unreadable_checkpoint(path, e) from e
    if not isinstance(checkpoint, dict):
        raise unreadable_checkpoint(path, TypeError(
            f"holds a {type(checkpoint).__name__}, not a dict of named parts"))
    return checkpoint


def checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """``step`` and ``averaged_from`` of a training checkpoint or model file, read without
    loading its tensors (memory-mapped).

    Returns:
        ``{"step": int | None, "averaged_from": list[str] | None}``.

    Raises:
        FileNotFoundError: naming the path when it does not exist.
        UnreadableCheckpointError (a UserError): naming the path and its size when the file
            is empty, truncated or not a checkpoint.
    """
    ckpt = read_checkpoint(path, mmap=True)
    averaged = ckpt.get("averaged_from")
    return {
        "step": checkpoint_step(ckpt),
        "averaged_from": [str(p) for p in averaged] if averaged is not None else None,
    }


def check_vocab(checkpoint_path: str | os.PathLike, tokenizer: SentencePieceTokenizer) -> None:
    """Fail when ``tokenizer`` is not the vocabulary the checkpoint was trained with.

    Compares the checkpoint's ``"vocab"`` (:func:`~transformer_nmt.data.bpe.vocab_identity`,
    read through a memory map) with the tokenizer's model file
    (:func:`~transformer_nmt.data.bpe.same_vocabulary`); a checkpoint without it
    (older runs) is checked on ``vocab_size`` only, with a warning.

    Raises:
        DataError: the identities differ (names both files and the values).
        MissingFileError, UnreadableCheckpointError: the checkpoint is missing, empty,
            truncated or holds refused Python objects
            (:func:`read_checkpoint`).
    """
    checkpoint = read_checkpoint(checkpoint_path, mmap=True)
    saved = checkpoint.get("vocab")
    if saved is None:
        log.warning("%s records no vocabulary identity (older checkpoint): cannot check that %s "
                    "is the vocabulary it was trained with", checkpoint_path, tokenizer.model_path)
        n = checkpoint.get("vocab_size")
        if n is not None and int(n) < tokenizer.vocab_size:
            raise DataError(
                f"{checkpoint_path} was trained with {n} pieces but {tokenizer.model_path} has "
                f"{tokenizer.vocab_size}: another vocabulary (check the data= option)"
            )
        return
    here = vocab_identity(tokenizer.model_path)
    if not same_vocabulary(saved, here):
        note = file_only_note(saved, here)
        raise DataError(
            f"{checkpoint_path} was trained with another vocabulary than {tokenizer.model_path} "
            f"(checkpoint: {describe_vocabulary(saved, here)}; tokenizer: "
            f"{describe_vocabulary(here, saved)})"
            + (note or "; use the data= settings the model was trained with")
        )
