"""A diverging run (a huge learning rate, no clipping) ends with one line, exit status
DIVERGED_EXIT (3), and a train_summary.json that says `stopped_by: divergence` and names the
last checkpoint whose parameters are all finite; no non-finite checkpoint is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from transformer_nmt.checkpoint import load_checkpoint, step_checkpoints
from transformer_nmt.train.step import DIVERGED_EXIT


def test_a_diverging_run_is_one_line_exit_3_and_a_summary(tmp_path, synthetic_corpus,
                                                          tiny_model):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.train", "experiment=multi30k_en_de",
         *synthetic_corpus.overrides, *tiny_model, f"run_dir={run}", "trainer.max_steps=200",
         "trainer.max_tokens=512", "trainer.warmup_steps=1", "trainer.lr_multiplier=1e9",
         "trainer.clip_norm=0", "trainer.max_bad_steps=2", "trainer.save_every_steps=1",
         "trainer.keep_last=50", "trainer.validate_every_steps=null", "trainer.num_workers=0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == DIVERGED_EXIT, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "consecutive steps had a non-finite loss or gradient" in errors[0]

    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["stopped_by"] == "divergence"
    finite = [p for p in step_checkpoints(run) if all(
        torch.isfinite(v).all() for v in load_checkpoint(p)["model"].values()
        if v.is_floating_point())]
    assert finite == step_checkpoints(run)  # no non-finite checkpoint was written
    assert summary["last_finite_checkpoint"] == str(finite[-1])
    assert f"the last checkpoint whose parameters are all finite is {finite[-1]}" in errors[0]
    assert (run / ".hydra" / "train").is_dir()  # the run's record stays
