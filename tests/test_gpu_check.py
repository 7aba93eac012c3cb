"""scripts/gpu_check.py on the CPU: without CUDA every GPU part is reported as skipped, and
--smoke runs each of its commands with a tiny model so the list stays runnable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_every_gpu_part_is_skipped(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "report"),
                           "--work", str(tmp_path / "work")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["checks"]) == 7
    assert {c["status"] for c in report["checks"]} == {"skipped"}
    assert all(c["note"] == "no CUDA device" for c in report["checks"])
    md = (tmp_path / "report.md").read_text()
    assert "| base, bf16 training | skipped |" in md and report["versions"]["torch"] in md


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU stand-in")
def test_smoke_runs_every_command(tmp_path, multi30k_mirror):
    env = {**os.environ, "NMT_MULTI30K_MIRROR": str(multi30k_mirror), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out",
                           str(tmp_path / "report"), "--work", str(tmp_path / "work")],
                          check=False, capture_output=True, text=True, timeout=600, env=env)
    report = json.loads((tmp_path / "report.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert proc.returncode == 0, (status, proc.stdout[-3000:])
    assert status == {
        "GPU tests (pytest -m gpu)": "skipped",
        "base, bf16 training": "passed",
        "base, fp16 training": "passed",
        "2-process DDP (NCCL)": "passed",
        "big at WMT14 max_tokens: peak memory": "passed",
        "beam 4 decoding of test_2016_flickr": "passed",
        "training benchmark vs fairseq and Marian": "skipped",
    }
    figures = {c["name"]: c["figures"] for c in report["checks"]}
    assert figures["base, bf16 training"]["last_loss"] < figures["base, bf16 training"]["first_loss"]
    assert figures["2-process DDP (NCCL)"]["world_size"] == 2
    assert figures["beam 4 decoding of test_2016_flickr"]["sentences"] == 1000
