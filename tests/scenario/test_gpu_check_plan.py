"""What ``make gpu-check`` runs: the base checks at the paper's peak learning rate, big with
the WMT14 big preset's settings (the batch it derives, its dropout), DDP on one GPU reported
as not run, and every command with ``TORCH_LOGS=recompiles``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from transformer_nmt.config import compose
from transformer_nmt.train.optim import inverse_sqrt_lr

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import gpu_check  # noqa: E402  (found on the sys.path entry above)


def test_base_checks_peak_at_the_papers_learning_rate():
    """Warm-up 100 with the check's multiplier peaks where the paper's warm-up 4000 does."""
    d_model, warmup = 512, 100
    peak = max(inverse_sqrt_lr(s, d_model, warmup, gpu_check.paper_lr_multiplier(warmup))
               for s in range(1, 3 * warmup))
    paper = max(inverse_sqrt_lr(s, d_model, 4000) for s in range(3000, 5000))
    assert peak == pytest.approx(paper, rel=1e-3)
    check = gpu_check.GpuCheck(argparse.Namespace(smoke=False, work="/tmp/unused-gpu-check",
                                                  steps=300))
    cmd, _ = check._train_cmd("x", "bf16", fresh=False)
    assert f"trainer.lr_multiplier={gpu_check.paper_lr_multiplier(100):.6g}" in cmd


def test_big_check_takes_the_presets_model_and_batch_settings():
    preset = compose([f"experiment={gpu_check.BIG_PRESET}"])
    cfg = compose(["experiment=multi30k_en_de", *gpu_check.preset_overrides()])
    assert cfg.model == preset.model  # dropout 0.3 and every size
    for key in ("tokens_per_step", "auto_max_tokens", "max_tokens", "clip_norm"):
        assert getattr(cfg.trainer, key) == getattr(preset.trainer, key), key
    assert cfg.trainer.tokens_per_step is not None and cfg.trainer.auto_max_tokens


def test_ddp_on_one_gpu_is_reported_as_not_run(tmp_path):
    check = gpu_check.GpuCheck(argparse.Namespace(smoke=False, work=str(tmp_path), steps=10))
    check.gpus = 1
    c = gpu_check.Check("2-process DDP (NCCL), bf16")
    check.ddp(c)
    assert c.status == "not run" and "1 GPU" in c.note


def test_every_command_logs_recompilations(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, cwd, env, stdout, stderr, timeout, check):
        seen.update(env)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    gpu_check._run(["true"], tmp_path / "log", timeout=1)
    assert seen["TORCH_LOGS"] == "recompiles"
