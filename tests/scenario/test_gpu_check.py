"""scripts/cluster/gpu_check.py on the CPU: without CUDA every GPU part is reported as skipped, and
--smoke runs each of its commands with a tiny model so the list stays runnable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check


def _records(losses: list[float]) -> list[dict]:
    return [{"loss": x, "skipped_steps": 0} for x in losses]


def test_pass_rule_rejects_a_collapsed_model():
    """A falling loss alone passed a model that says the same thing for every input; the
    validation BLEU of a real run does not let it through."""
    falling = _records([9.0, 6.0, 4.5])
    assert gpu_check.training_passed(falling, {"bleu": 21.3}, smoke=False) == (True, "")
    ok, why = gpu_check.training_passed(falling, {"bleu": 0.4}, smoke=False)
    assert not ok and "collapsed" in why
    assert not gpu_check.training_passed(falling, {}, smoke=False)[0]
    assert not gpu_check.training_passed(_records([5.0, 4.6]), {"bleu": 30.0}, smoke=False)[0]
    assert gpu_check.training_passed(_records([5.0, 4.9]), {}, smoke=True)[0]


def test_big_check_uses_the_presets_max_tokens_and_vocabulary():
    from transformer_nmt.config import compose

    cfg = compose(["experiment=wmt14_en_de_big"])
    assert gpu_check.preset_figures() == (cfg.trainer.max_tokens, cfg.data.vocab_size)
    assert cfg.data.vocab_size > 30_000  # the output layer of the real run, not an 8k one


def test_peers_are_looked_for_in_the_bench_environment(tmp_path):
    assert gpu_check.BENCH_PYTHON == REPO / ".venv-bench" / "bin" / "python"
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("#!/bin/sh\nexit 0\n")
    bad.write_text("#!/bin/sh\nexit 1\n")  # fairseq or transformers missing
    for f in (good, bad):
        f.chmod(0o755)
    assert gpu_check.bench_python(good) == good
    assert gpu_check.bench_python(bad) is None and gpu_check.bench_python(tmp_path / "no") is None


def test_each_check_starts_from_an_empty_run_directory(tmp_path):
    """A second gpu-check resumed the first one's finished runs and passed on their figures."""
    import argparse

    check = gpu_check.GpuCheck(argparse.Namespace(smoke=True, work=str(tmp_path), steps=10))
    old = tmp_path / "runs" / "gpu_check_bf16"
    (old / "checkpoints").mkdir(parents=True)
    (old / "train_summary.json").write_text("{}")
    check._train_cmd("gpu_check_bf16", "fp32", fresh=False)
    assert (old / "train_summary.json").exists()  # the resume and decode checks reuse it
    _, run_dir = check._train_cmd("gpu_check_bf16", "fp32")
    assert run_dir == old and not old.exists()


def test_every_test_that_needs_cuda_is_marked_gpu():
    """``pytest -m gpu`` (the first check) selects every test that skips without CUDA."""
    import ast

    needs_cuda, marked = [], []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if any("skipif(not torch.cuda.is_available()" in d for d in decorators):
                needs_cuda.append(f"{path.name}::{node.name}")
            if "pytest.mark.gpu" in decorators:
                marked.append(f"{path.name}::{node.name}")
    assert needs_cuda and set(needs_cuda) <= set(marked), sorted(set(needs_cuda) - set(marked))
    assert len(marked) >= 5, marked


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_every_gpu_part_is_skipped(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "report"),
                           "--work", str(tmp_path / "work")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["checks"]) == len(gpu_check.CHECK_KEYS)
    assert {c["status"] for c in report["checks"]} == {"skipped"}
    assert all(c["note"] == "no CUDA device" for c in report["checks"])
    md = (tmp_path / "report.md").read_text()
    assert "| base, bf16 training | skipped |" in md and report["versions"]["torch"] in md


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU stand-in")
@pytest.mark.heavy
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
        "base, fp16 training": "skipped",  # fp32 on the CPU: the bf16 command again
        "base, bf16, compiled, update_freq 2": "passed",
        "resume the bf16 run from its GPU checkpoint": "skipped",  # the SIGTERM check resumes
        "compiled steps equal eager steps on the same batches": "passed",  # aot_eager, fp32
        "a resumed run continues the uninterrupted loss curve": "passed",  # fp32, exact
        "the whole step as a CUDA graph equals the eager packed step": "passed",  # uncompiled
        "SIGTERM: stop checkpoint, then resume": "passed",
        "2-process DDP (NCCL), bf16": "passed",
        "2-process DDP (NCCL), fp16": "skipped",
        "big at the WMT14 preset's max_tokens and vocabulary: peak memory": "passed",
        "beam 4 decoding of test_2016_flickr": "passed",
        "training benchmark vs fairseq and Marian": "skipped",
    }
    figures = {c["name"]: c["figures"] for c in report["checks"]}
    base = figures["base, bf16 training"]
    assert base["last_loss"] < base["first_loss"]
    assert figures["2-process DDP (NCCL), bf16"]["world_size"] == 2
    for name, fig in figures.items():  # every training check reports its speed
        if status[name] == "passed" and name.startswith(("base", "resume", "SIGTERM", "2-process",
                                                         "big")):
            assert fig["target_tokens_per_s"] > 0 and "mfu" in fig and "peak_gpu_mem_gib" in fig
    assert figures["SIGTERM: stop checkpoint, then resume"]["stopped_by"] == "signal SIGTERM"
    big = figures["big at the WMT14 preset's max_tokens and vocabulary: peak memory"]
    assert (big["max_tokens"], big["model_vocab_size"]) == gpu_check.preset_figures()
    assert figures["beam 4 decoding of test_2016_flickr"]["sentences"] == 1000
