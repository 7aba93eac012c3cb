"""The default run is a fixed amount of work: the same command gives the same model anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_nmt.checkpoint import checkpoint_step, load_checkpoint
from transformer_nmt.config import compose

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("experiment", ["multi30k_en_de", "multi30k_en_fr"])
def test_default_experiment_stops_after_a_fixed_number_of_steps(experiment):
    cfg = compose([f"experiment={experiment}"])
    t = cfg.trainer
    assert t.max_steps == 3000 and t.max_time_minutes is None and t.max_epochs is None
    assert t.save_every_minutes is None  # no wall-clock checkpoints either
    assert t.lr_scheduler == "linear"  # the rate reaches 0 after the last step
    # The run ends on a periodic checkpoint, so the last-N average is evenly spaced.
    assert t.max_steps % t.save_every_steps == 0
    assert t.keep_last >= cfg.average.last == 5
    # The time budget stays available as an override, with the paper's schedule (the
    # linear one needs the step count it ends at).
    assert compose([f"experiment={experiment}", "trainer.max_steps=null",
                    "trainer.max_time_minutes=60", "trainer.lr_scheduler=inverse_sqrt"]
                   ).trainer.max_time_minutes == 60
    with pytest.raises(ValueError, match="lr_scheduler=linear decays to 0 at trainer.max_steps"):
        compose([f"experiment={experiment}", "trainer.max_steps=null",
                 "trainer.max_time_minutes=60"])


@pytest.mark.slow
def test_two_runs_give_bit_identical_checkpoints(tmp_path, synthetic_corpus, tiny_model):
    """Two `nmt-train` processes of the default experiment (shrunk: tiny model, 6 steps, dropout
    on; the synthetic corpus) with the same torch build and thread count write the same bits."""
    common = [
        "experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
        "model.dropout=0.1", "trainer.max_tokens=512", "trainer.max_steps=6",
        "trainer.save_every_steps=3", "trainer.validate_every_steps=3",
        "trainer.log_every_steps=3", "trainer.num_workers=0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    subprocess.run([str(BIN / "nmt-prepare"), *common], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=300)
    states = []
    for name in ("a", "b"):
        run = tmp_path / "runs" / name
        proc = subprocess.run([str(BIN / "nmt-train"), *common, f"name={name}", f"run_dir={run}"],
                              check=False, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        states.append(load_checkpoint(run / "checkpoints" / "checkpoint_6.pt"))
    a, b = states
    assert checkpoint_step(a) == checkpoint_step(b) == 6
    assert a["model"].keys() == b["model"].keys()
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), f"{key} differs between the two runs"
    # Adam's moments too: the next step would be identical as well.
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        for name, value in opt_a[k].items():
            assert torch.equal(value, opt_b[k][name]), f"optimizer state {k}.{name} differs"
