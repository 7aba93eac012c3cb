"""Checkpoints: reading a file (``read``: the one ``torch.load``, metadata, the vocabulary check),
named parts, save, load, find, keep-last-N (``core``) and parameter averaging (``average``); all
re-exported here.

A training checkpoint is one ``torch.save`` file of plain types and tensors, loadable with
``torch.load(weights_only=True)``, made of named parts, each stored once::

    {
      "model":       state_dict of the plain (unwrapped, uncompiled) Transformer,
      "optimizer":   optimizer.state_dict(),
      "scheduler":   the learning-rate schedule's state_dict(),
      "scaler":      the fp16 GradScaler's state_dict() (empty when disabled),
      "sampler":     {"epoch", "position", "seed"}: the data position, in batches per rank
                     consumed by the training loop this epoch, and "sentences" and
                     "consumed" (np.packbits of the sentences consumed this epoch, a uint8
                     tensor): the same position in any batch layout,
      "rng":         a list indexed by rank of {"torch", "cuda", "numpy", "python"} RNG states,
      "train_state": the loop's counters (transformer_nmt.train.state.TrainState.state_dict():
                     step, micro_step, tokens_seen, train_seconds, skipped_steps, best
                     validation results, world_size, ...),
      "config":      the resolved run config as a plain dict,
      "vocab_size":  size of the shared vocabulary the model was built with,
      "data":        {"name", "split", "pairs", "sha256"}: the training data's identity,
    }

A model file (``averaged.pt``, written by :func:`average_run`) holds only ``"model"``,
``"config"``, ``"vocab_size"``, ``"step"`` (of the newest input) and ``"averaged_from"``
(the input file names). :func:`checkpoint_step` reads the step of either kind.

Files live in ``runs/<experiment>/checkpoints/``: ``checkpoint_<step>.pt`` (kept: the last
``trainer.keep_last`` periodic ones and the newest, :func:`prune_checkpoints`),
``checkpoint_best.pt`` and ``averaged.pt``. Every write goes through a temporary file and a rename.
"""

from transformer_nmt.checkpoint.average import (
    average_checkpoints,
    average_model,
    average_run,
    check_no_average,
    check_same_run,
)
from transformer_nmt.checkpoint.core import (
    AVERAGED_NAME,
    BEST_NAME,
    RESUME_HARMLESS_KEYS,
    TEMP_PATTERN,
    TRAINING_PARTS,
    UNREADABLE_SUFFIX,
    check_same_model,
    check_training_checkpoint,
    checkpoint_dir,
    config_differences,
    config_of,
    latest_checkpoint,
    latest_finite_checkpoint,
    load_checkpoint,
    load_initial_weights,
    load_model,
    model_from,
    non_finite_parameters,
    prune_checkpoints,
    recorded_save_every_steps,
    remove_killed_saves,
    restore_modules,
    save_checkpoint,
    step_checkpoints,
    training_checkpoint,
    unreadable,
)
from transformer_nmt.checkpoint.read import (
    check_vocab,
    checkpoint_metadata,
    checkpoint_step,
    read_checkpoint,
)
from transformer_nmt.errors import UnreadableCheckpointError

__all__ = [
    "UnreadableCheckpointError",
    "AVERAGED_NAME",
    "BEST_NAME",
    "RESUME_HARMLESS_KEYS",
    "TEMP_PATTERN",
    "TRAINING_PARTS",
    "UNREADABLE_SUFFIX",
    "average_checkpoints",
    "average_model",
    "average_run",
    "check_no_average",
    "check_same_model",
    "check_same_run",
    "check_vocab",
    "check_training_checkpoint",
    "checkpoint_dir",
    "checkpoint_metadata",
    "checkpoint_step",
    "config_differences",
    "config_of",
    "latest_checkpoint",
    "latest_finite_checkpoint",
    "load_checkpoint",
    "load_initial_weights",
    "load_model",
    "model_from",
    "non_finite_parameters",
    "prune_checkpoints",
    "read_checkpoint",
    "recorded_save_every_steps",
    "remove_killed_saves",
    "restore_modules",
    "save_checkpoint",
    "step_checkpoints",
    "training_checkpoint",
    "unreadable",
]
