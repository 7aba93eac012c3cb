"""The step-level checks of ``make gpu-check`` (scripts/cluster/gpu_step_checks.py) run on the
CPU with the same functions: eager and compiled steps give the same losses on the same batches,
a resumed run continues the uninterrupted run's loss curve exactly in fp32, and each check
fails when its property is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import gpu_step_checks  # noqa: E402  (found on the sys.path entry above)


@pytest.fixture(scope="module")
def overrides(synthetic_corpus, tiny_model) -> list[str]:
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
            "trainer.max_tokens=512", "trainer.warmup_steps=4", "trainer.lr_multiplier=1.0",
            "trainer.num_workers=0"]


def test_compiled_steps_equal_eager_steps_on_the_cpu(tmp_path, overrides):
    """aot_eager (the graph Inductor would be given, run with eager kernels) on the CPU."""
    result = gpu_step_checks.compiled_matches_eager(
        [*overrides, f"run_dir={tmp_path / 'run'}"], "cpu", backend="aot_eager", steps=3)
    assert result["passed"], result
    assert len(result["eager_losses"]) == 3 and result["rtol"] == 1e-4
    assert result["eager_losses"][-1] < result["eager_losses"][0]  # the steps were taken


def test_compiled_check_fails_when_the_compiled_graph_differs(tmp_path, overrides):
    """A backend whose graph changes the numbers (the logits scaled by 1.01) fails."""

    def off_by_one_percent(gm, example_inputs):
        def run(*args):
            outs = gm(*args)
            return [o * 1.01 if isinstance(o, torch.Tensor) and o.dim() == 2 else o
                    for o in outs] if isinstance(outs, (list, tuple)) else outs
        return run

    result = gpu_step_checks.compiled_matches_eager(
        [*overrides, f"run_dir={tmp_path / 'run'}"], "cpu", backend=off_by_one_percent,
        steps=1)
    assert not result["passed"] and "relative difference" in result["why"], result


def test_graphed_steps_equal_eager_packed_steps_on_the_cpu(tmp_path, overrides):
    """The whole step run eagerly on the CPU (what CUDA captures as a graph) against the
    eager packed step: the same parameters after 3 steps, the same losses."""
    result = gpu_step_checks.graphed_matches_eager(
        [*overrides, f"run_dir={tmp_path / 'run'}"], "cpu", compile=False, steps=3)
    assert result["passed"], result
    assert result["param_rel_diff"] < 1e-4 and len(result["graphed_losses"]) == 3
    assert result["eager_losses"][-1] < result["eager_losses"][0]  # the steps were taken


def test_resume_continues_the_loss_curve_exactly_in_fp32(tmp_path, overrides):
    result = gpu_step_checks.resume_continues_curve(overrides, tmp_path, "cpu",
                                                    precision="fp32", n=4, m=3)
    assert result["passed"], result
    assert result["first_step_exact"] and result["max_rel_diff"] == 0.0
    assert len(result["resumed"]) == 3 and result["resumed"] == result["uninterrupted"]
    with pytest.raises(ValueError, match="not on cuda"):
        if not torch.cuda.is_available():
            gpu_step_checks.resume_continues_curve(overrides, tmp_path, "cuda", n=1, m=1)
        else:
            raise ValueError("not on cuda (CUDA present: nothing to refuse)")


def test_resume_check_fails_when_the_resume_loses_state(tmp_path, overrides, monkeypatch):
    """A resume that restores the weights but not the RNG states (dropout draws differently
    after the resume) is caught at the first resumed step."""
    from transformer_nmt.train import resume

    monkeypatch.setattr(resume, "set_rng_state", lambda state: torch.manual_seed(12345))
    result = gpu_step_checks.resume_continues_curve(
        [*overrides, "model.dropout=0.1"], tmp_path, "cpu", precision="fp32", n=3, m=2)
    assert not result["passed"] and not result["first_step_exact"], result
    assert "step 4: resumed loss" in result["why"]


def test_gpu_check_runs_each_step_check_in_a_worker_process(tmp_path, overrides):
    """``gpu_check.py --step-check``: what ``make gpu-check`` launches for each precision
    (here on the CPU), its figures written as JSON."""
    result = tmp_path / "result.json"
    spec = {"precision": "fp32", "n": 2, "m": 2, "work": str(tmp_path / "runs")}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cluster" / "gpu_check.py"), "--step-check",
         "resume_continues_curve", "--step-check-args", json.dumps(spec),
         "--step-check-result", str(result), "--", *overrides],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(result.read_text())
    assert got["passed"] and got["n"] == 2 and len(got["resumed"]) == 2, got
