"""``gpu_check.py --only``: the checks named run (here: reported without a GPU), the others are
reported as not run, and an unknown key is refused in one line, exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster" / "gpu_check.py"
sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import gpu_check  # noqa: E402  (found on the sys.path entry above)


def test_unknown_check_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "bf16,nope", "--work",
                           str(tmp_path), "--out", str(tmp_path / "r")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert "--only: unknown check(s) nope" in proc.stderr
    assert not (tmp_path / "r.md").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report without a GPU")
def test_only_runs_the_named_checks(tmp_path):
    args = argparse.Namespace(
        smoke=False, work=str(tmp_path), steps=10, only=["bf16", "decode"])
    report = gpu_check.GpuCheck(args).run()
    notes = {c["name"]: c["note"] for c in report["checks"]}
    assert len(notes) == len(gpu_check.CHECK_KEYS)
    assert notes["base, bf16 training"] == "no CUDA device"
    assert notes["beam 4 decoding of test_2016_flickr"] == "no CUDA device"
    assert notes["base, fp16 training"] == "not run (--only)"
    assert sum(n == "not run (--only)" for n in notes.values()) == len(gpu_check.CHECK_KEYS) - 2
