"""``trainer.dry_run=true``: an experiment's real model, optimizer and schedule take a few steps
on a small slice of data, in ``<run_dir>/dry_run``, never touching the real run.

Prepares the slice itself when the experiment's data is missing (the one place where
training and preparation meet), then calls :func:`transformer_nmt.train.loop.train`.
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from transformer_nmt.config import Config
from transformer_nmt.train import distributed
from transformer_nmt.train.data import data_ready
from transformer_nmt.train.loop import train

log = logging.getLogger(__name__)

DRY_RUN_TRAIN_PAIRS = 2000
"""Training pairs of the slice a dry run prepares when the experiment's data is missing."""
DRY_RUN_VOCAB = 1000
"""SentencePiece vocabulary of that slice (the model still uses the experiment's size)."""


def dry_run_config(cfg: Config) -> Config:
    """The config of a dry run: a few steps in ``<run_dir>/dry_run``, writing no checkpoint.

    When the experiment's binarized data is missing, a slice is prepared instead under its
    own name (``<data.name>_dry_run``): the first ``DRY_RUN_TRAIN_PAIRS`` training pairs of
    the real corpus with a ``DRY_RUN_VOCAB`` SentencePiece vocabulary. The model is still
    built with the experiment's ``data.vocab_size`` (:func:`dry_run` passes it) so that
    parameter count, memory and speed are those of the real run.
    """
    cfg = copy.deepcopy(cfg)
    t = cfg.trainer
    t.dry_run = False
    t.max_steps = int(t.dry_run_steps)
    t.max_epochs = None
    t.max_time_minutes = None
    t.save_every_steps = None
    t.save_every_minutes = None
    t.validate_every_steps = None
    t.log_every_steps = 1
    t.keep_last = 1
    t.no_save = True  # a big model's checkpoint is 2.5 GB; the dry run is about the steps
    t.patience = None
    t.tokens_per_step = None  # a few steps of one micro-batch each: the step's size is not checked
    t.valid_bleu_sentences = min(int(t.valid_bleu_sentences), 16)
    cfg.run_dir = str(Path(cfg.run_dir) / "dry_run")
    if not data_ready(cfg):
        cfg.data.name = f"{cfg.data.name}_dry_run"
        limit = cfg.data.max_train_pairs
        cfg.data.max_train_pairs = min(limit, DRY_RUN_TRAIN_PAIRS) if limit else DRY_RUN_TRAIN_PAIRS
        cfg.data.vocab_size = min(int(cfg.data.vocab_size), DRY_RUN_VOCAB)
    return cfg


def dry_run(cfg: Config, poll_seconds: float = 5.0) -> dict[str, Any]:
    """Run the dry run of ``cfg`` (every rank calls it); returns the training summary.

    Rank 0 empties ``<run_dir>/dry_run`` and prepares the slice when needed; the other ranks
    poll the file system for the prepared data instead of waiting in a collective, so a
    slow preparation cannot run into the process group's timeout.

    Raises:
        transformer_nmt.data.corpora.DataError and others from ``prepare`` (rank 0).
    """
    full_vocab = int(cfg.data.vocab_size)
    cfg = dry_run_config(cfg)
    info = distributed.init_distributed()
    if info.is_main:
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
        if not data_ready(cfg):
            from transformer_nmt.data import prepare

            log.info("dry run: preparing %s under %s", cfg.data.name, cfg.data.root)
            prepare.prepare(cfg)
    else:
        while not data_ready(cfg):
            time.sleep(poll_seconds)
    distributed.barrier()
    return train(cfg, model_vocab_size=full_vocab, valid_max_batches=4)
