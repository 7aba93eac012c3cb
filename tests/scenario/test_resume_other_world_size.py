"""A run with a batch target resumed on another number of ranks and another micro-batch budget
(a requeued job on other GPUs): 2 gloo ranks, then 1 rank, then 2 again, through ``nmt-train``.
The epoch still gives each training sentence once: the tokens the run has processed when its
first epoch ends are those of the training split, counted once; the epoch figure (metrics.jsonl,
train_summary.json) counts the sentences given before a resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_nmt.checkpoint import latest_checkpoint, load_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix

TRAINER = [
    "model.dropout=0.0", "trainer.warmup_steps=8", "trainer.save_every_minutes=null",
    "trainer.validate_every_steps=null", "trainer.validate_every_epochs=null",
    "trainer.num_workers=0", "trainer.tokens_per_step=1200",
    "trainer.tokens_per_step_tolerance=0.3", "trainer.save_every_steps=100",
    "trainer.lr_scheduler=inverse_sqrt",  # the segments end at other step or epoch limits
    "trainer.log_every_steps=1",
]


def _run(args: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(args, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{args[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


def _train(ranks: int, common: list[str], *extra: str) -> str:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={ranks}"] if ranks > 1 else [sys.executable])
    return _run([*launcher, "-m", "transformer_nmt.cli.train", *common, *extra])


def test_two_ranks_then_one_then_two_see_each_sentence_of_the_epoch_once(
        tmp_path, synthetic_corpus, tiny_model):
    overrides = ["experiment=multi30k_en_de", *synthetic_corpus.overrides]
    d = compose(overrides).data
    src = TokenDataset(bin_prefix(d, "train", d.src_lang)).sizes.astype(np.int64)
    tgt = TokenDataset(bin_prefix(d, "train", d.tgt_lang)).sizes.astype(np.int64)
    common = [*overrides, *tiny_model, *TRAINER, f"run_dir={tmp_path / 'run'}"]

    _train(2, common, "trainer.max_tokens=400", "trainer.max_steps=3", "trainer.max_epochs=null")
    first = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    # another GPU count and another budget (another GPU memory)
    log = _train(1, common, "trainer.max_tokens=600", "trainer.max_steps=6",
                 "trainer.max_epochs=null")
    assert "continues with the sentences it has not given yet" in log
    second = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert second["sampler"]["epoch"] == 0  # still the first epoch
    assert second["sampler"]["sentences"] > first["sampler"]["sentences"] > 0
    before = np.unpackbits(first["sampler"]["consumed"].numpy(), count=len(src)).astype(bool)
    after = np.unpackbits(second["sampler"]["consumed"].numpy(), count=len(src)).astype(bool)
    assert (after >= before).all()  # the first segment's sentences stay consumed
    # the epoch figure counts the sentences given before the resume (log, metrics, summary)
    given = int(second["sampler"]["sentences"]) / len(src)
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["epochs"] == pytest.approx(given, abs=0.05)
    epochs = [json.loads(line)["epoch"] for line in
              (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if '"epoch"' in line]
    assert epochs == sorted(epochs) and epochs[-1] == pytest.approx(given, abs=0.1)
    _train(2, common, "trainer.max_tokens=400", "trainer.max_steps=null", "trainer.max_epochs=1")
    last = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert last["sampler"]["epoch"] == 1 and last["sampler"]["position"] == 0
    state = last["train_state"]
    # every training pair once: target and source tokens (eos included) and squared lengths
    assert state["tokens_seen"] == int((tgt + 1).sum())
    assert state["src_tokens_seen"] == int((src + 1).sum())
    assert state["src_sq_seen"] == int(((src + 1) ** 2).sum())
