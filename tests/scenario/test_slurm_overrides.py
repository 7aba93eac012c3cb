"""scripts/cluster/slurm_train.sh with a bad override stops before anything runs: the overrides
are checked as nmt-train checks them (``python -m transformer_nmt.cli.check_overrides``), so
a misspelt key is one ``error:`` line naming the closest valid key, exit status 2, without
Hydra's advice to add the key with ``+``; ``srun``, ``scontrol`` and ``sbatch`` (stand-ins on
PATH that record each call) are never called and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster" / "slurm_train.sh"

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$FAKE_LOG/calls"
if [ "$(basename "$0")" = scontrol ] && [ "$1" = show ]; then echo node001; fi
exit 0
"""


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "sbatch"):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "VENV": str(Path(sys.executable).parent.parent),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node001", "SLURM_JOB_NUM_NODES": "1",
        "FAKE_LOG": str(tmp_path), "OMP_NUM_THREADS": "1",
    }


def _nmt_train_error(tmp_path: Path, overrides: list[str]) -> str:
    """The one ``error:`` line nmt-train gives for these overrides."""
    proc = subprocess.run([sys.executable, "-m", "transformer_nmt.cli.train", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    return line


@pytest.mark.parametrize("override, expected", [
    ("trainer.max_stepz=10",
     "error: Could not override 'trainer.max_stepz'. Key 'max_stepz' not in 'TrainerConfig' "
     "(did you mean trainer.max_steps?)"),
    ("+trainer.max_stepz=10",
     "error: unknown key: trainer.max_stepz is not a setting of TrainerConfig (did you mean "
     "trainer.max_steps?)"),
    ("model.d_model=-3", "error: invalid configuration: model.d_model=-3 must be a positive "
     "integer"),
])
def test_a_bad_override_is_nmt_trains_one_line_exit_2_before_anything_runs(
        tmp_path, override, expected):
    run_dir = tmp_path / "run"
    overrides = ["experiment=multi30k_en_de", override, f"run_dir={run_dir}"]
    proc = subprocess.run(["bash", str(SCRIPT), *overrides], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [expected]
    assert proc.stdout == ""
    assert "append" not in proc.stderr and "+trainer" not in proc.stderr
    assert not (tmp_path / "calls").exists()  # no srun, scontrol or sbatch
    assert not run_dir.exists()
    assert _nmt_train_error(tmp_path, overrides) == expected


def test_check_overrides_prints_the_run_directory_of_good_overrides(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "transformer_nmt.cli.check_overrides",
                           "experiment=multi30k_en_de", "trainer.max_steps=10"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "runs/multi30k_en_de\n"
    assert not (tmp_path / "runs").exists()
