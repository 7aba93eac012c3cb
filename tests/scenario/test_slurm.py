"""scripts/cluster/slurm_train.sh without SLURM: `srun` and `scontrol` are stand-ins on PATH that
record their arguments, so what the script does after the run (requeue or not, exit status) is
checked for each way a run can end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster" / "slurm_train.sh"

FAKE_SRUN = """#!/bin/bash
echo "$@" > "$FAKE_LOG/srun.args"
if [ -n "$FAKE_STOPPED_BY" ]; then
  mkdir -p "$FAKE_RUN_DIR"
  printf '{"stopped_by": "%s", "step": 7}' "$FAKE_STOPPED_BY" > "$FAKE_RUN_DIR/train_summary.json"
fi
exit "$FAKE_EXIT"
"""

FAKE_SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then echo node001; echo node002; exit 0; fi
echo "$@" >> "$FAKE_LOG/scontrol.calls"
"""


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """A 60-pair custom corpus (train/valid/test); its data root is shared, so it is prepared
    once."""
    root = tmp_path_factory.mktemp("corpus")
    words = ["cat", "dog", "house", "tree", "red", "blue", "runs", "sleeps", "big", "small"]
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        src = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 4)) for i in range(n)]
        (root / f"{split}.en").write_text("\n".join(src) + "\n")
        (root / f"{split}.de").write_text("\n".join(s.upper() for s in src) + "\n")
    return root


def _run(tmp_path: Path, corpus: Path, stopped_by: str, exit_code: int,
         stale_summary: bool = False) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    if stale_summary:  # left by an earlier job: must not be read as this job's outcome
        run_dir.mkdir()
        (run_dir / "train_summary.json").write_text(json.dumps({"stopped_by": "signal SIGTERM"}))
        os.utime(run_dir / "train_summary.json", (1_000_000_000, 1_000_000_000))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "VENV": str(Path(sys.executable).parent.parent),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_PER_TASK": "12",
        "FAKE_LOG": str(tmp_path), "FAKE_RUN_DIR": str(run_dir),
        "FAKE_STOPPED_BY": stopped_by, "FAKE_EXIT": str(exit_code),
    }
    overrides = [
        "data=custom", "data.name=slurm_tiny", f"data.root={corpus / 'data'}",
        "data.vocab_size=40", f"+data.custom_files.train={corpus / 'train'}",
        f"+data.custom_files.valid={corpus / 'valid'}",
        f"+data.custom_files.test={corpus / 'test'}",
        f"run_dir={run_dir}",
    ]
    proc = subprocess.run(["bash", str(SCRIPT), *overrides], cwd=tmp_path, env=env,
                          check=False, capture_output=True, text=True, timeout=300)
    return proc, tmp_path


def test_signal_stop_requeues_and_exits_zero(tmp_path, tiny_corpus):
    proc, log = _run(tmp_path, tiny_corpus, "signal SIGTERM", exit_code=1)
    assert proc.returncode == 0, proc.stderr
    assert (log / "scontrol.calls").read_text().split() == ["requeue", "4242"]
    srun_args = (log / "srun.args").read_text()
    assert "--cpus-per-task=12" in srun_args
    assert "--rdzv_endpoint=node001:29500" in srun_args and "--nnodes=2" in srun_args
    # The data was prepared before the workers started.
    assert (tiny_corpus / "data" / "bin" / "slurm_tiny").is_dir()


def test_finished_run_is_not_requeued(tmp_path, tiny_corpus):
    proc, log = _run(tmp_path, tiny_corpus, "max_steps", exit_code=0)
    assert proc.returncode == 0, proc.stderr
    assert not (log / "scontrol.calls").exists()


def test_crash_keeps_exit_status_and_ignores_stale_summary(tmp_path, tiny_corpus):
    proc, log = _run(tmp_path, tiny_corpus, "", exit_code=3, stale_summary=True)
    assert proc.returncode == 3
    assert not (log / "scontrol.calls").exists()
    assert "stopped by: unknown" in proc.stdout


def test_diverged_run_is_not_requeued_and_exits_3(tmp_path, tiny_corpus):
    proc, log = _run(tmp_path, tiny_corpus, "divergence", exit_code=1)
    assert proc.returncode == 3
    assert not (log / "scontrol.calls").exists()
    assert "the run diverged: not requeued" in proc.stdout


@pytest.mark.parametrize("status, signal", [(143, "SIGTERM"), (138, "SIGUSR1")])
def test_a_signal_before_the_worker_started_requeues(tmp_path, tiny_corpus, status, signal):
    # the signal reached the torchrun agent before its worker started: srun ends with
    # 128 + the signal and this job wrote no summary (an earlier job's is stale)
    proc, log = _run(tmp_path, tiny_corpus, "", exit_code=status, stale_summary=True)
    assert proc.returncode == 0, proc.stderr
    assert (log / "scontrol.calls").read_text().split() == ["requeue", "4242"]
    assert (f"srun ended by {signal} (exit status {status}) before the run wrote a summary"
            in proc.stdout)


def test_a_step_killed_with_sigkill_keeps_its_status(tmp_path, tiny_corpus):
    proc, log = _run(tmp_path, tiny_corpus, "", exit_code=137)  # the OOM killer, say
    assert proc.returncode == 137
    assert not (log / "scontrol.calls").exists()
