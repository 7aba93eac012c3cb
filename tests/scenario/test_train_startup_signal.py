"""A stop signal during the start-up of a (requeued) run, before its first step: before torch
is even imported (while the config is composed) or while the sampler and model are built.
The run stops before its first step without a new checkpoint, exit 0, and its summary says
`stopped_by: "signal SIGTERM"`, which scripts/cluster/slurm_train.sh requeues
(tests/scenario/test_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformer_nmt.checkpoint import step_checkpoints
from transformer_nmt.config import compose
from transformer_nmt.train.loop import train

# nmt-train's entry point with SIGTERM sent to itself at one moment of the start-up
WRAPPER = """
import os, signal, sys
import transformer_nmt.cli as cli
import transformer_nmt.cli.train as cli_train
where = sys.argv.pop(1)

def signalled(real):
    def wrapper(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    return wrapper

if where == "compose":  # before torch is imported
    assert "torch" not in sys.modules
    cli._preflight = signalled(cli._preflight)
else:  # while the run is built
    import transformer_nmt.train.loop as loop
    loop.setup = signalled(loop.setup)
sys.argv = ["nmt-train", *sys.argv[1:]]
cli_train.main()
"""


@pytest.mark.parametrize("where", ["compose", "setup"])
def test_sigterm_during_start_up_stops_before_the_first_step(tmp_path, synthetic_corpus,
                                                              tiny_model, where):
    run = tmp_path / "run"
    overrides = ["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
                 f"run_dir={run}", "trainer.max_tokens=512", "trainer.save_every_steps=2",
                 "trainer.validate_every_steps=null", "trainer.num_workers=0",
                 "trainer.lr_scheduler=inverse_sqrt"]  # resumed to a later max_steps
    train(compose([*overrides, "trainer.max_steps=4"]))
    before = {p.name: p.stat().st_mtime_ns for p in step_checkpoints(run)}

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", WRAPPER, where, *overrides,
                           "trainer.max_steps=8"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["stopped_by"] == "signal SIGTERM" and summary["steps"] == 4
    assert {p.name: p.stat().st_mtime_ns for p in step_checkpoints(run)} == before
    assert "SIGTERM during start-up: stopping before the first step" in proc.stdout + proc.stderr


def test_a_signal_nothing_took_over_ends_the_process_once_the_command_is_done():
    """A dry run (or a command that fails before training) never hands the recorded signal to
    the loop: the process still ends by it, after the command."""
    from transformer_nmt.runtime import STOP_SIGNALS
    from transformer_nmt.train import startup_signals

    assert startup_signals.STOP_SIGNALS == STOP_SIGNALS
    code = ("import os, signal, sys\n"
            "from transformer_nmt.train import startup_signals\n"
            "startup_signals.record()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('still running', flush=True)\n"
            "startup_signals.release()\n"
            "print('not reached', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.stdout.split() == ["still", "running"] and proc.returncode == -15
