"""scripts/cluster/gpu_profile.py (the GPU measurement of the training step) on the CPU: every
part runs with a tiny model, the timed pass compiles nothing (every shape is compiled in the
untimed pass before it), and the helpers that sort kernels and measure the GPU's idle time
hold on hand-made inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import gpu_profile  # noqa: E402  (found on the sys.path entry above)


def test_kernels_are_sorted_by_kind():
    assert gpu_profile.kind_of("void pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert gpu_profile.kind_of("fmha_cutlassB_bf16_aligned_64x64_k64_sm80") == "attention"
    assert gpu_profile.kind_of("nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT") == "matmul"
    assert gpu_profile.kind_of("multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>") \
        == "optimizer"
    assert gpu_profile.kind_of("triton_red_fused__log_softmax_sum_3") == "loss"
    assert gpu_profile.kind_of("triton_per_fused_native_layer_norm_7") == "other"


def test_busy_fraction_counts_overlapping_kernels_once():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # 0-3 busy, 3-5 idle, 5-6 busy
    assert gpu_profile.busy_fraction(spans, (0.0, 10.0)) == pytest.approx(0.4)
    assert gpu_profile.busy_fraction([], (0.0, 1.0)) == 0.0
    assert gpu_profile.busy_fraction(spans, (2.0, 2.0)) == 0.0


def test_smoke_run_measures_every_part(tmp_path, synthetic_corpus):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cluster" / "gpu_profile.py"), "--smoke",
         "--sizes", "base", "--out", str(out), *synthetic_corpus.overrides],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_profile.json").read_text())
    assert "failed" not in report and report["environment"]["device"] == "cpu"
    (size,) = report["sizes"]
    speed = size["speed"]
    assert speed["steps"] == 3 and speed["target_tokens"] > 0
    assert speed["graphs_compiled"] >= 1 and speed["graphs_compiled_while_timed"] == 0
    assert size["profile"]["steps"] == 2  # the profiler's warm-up steps are left out
    shares = size["profile"]["share_by_kind"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) and shares["matmul"] > 0
    assert size["loss"]["ms_fwd_bwd"] > 0 and size["loss"]["vocab"] == synthetic_corpus.vocab_size
    rows = size["memory"]["rows"]
    assert [r["max_tokens"] for r in rows] == [256, 512]
    assert all(0 < r["padded_tokens"] <= r["max_tokens"] for r in rows)
    assert "| base |" in proc.stdout
    host = size["profile"]["top_host_ops"]
    assert host and all(ms >= 0 for _, ms in host) and size["profile"]["host_ms_per_step"] > 0
    markdown = (out / "gpu_profile.md").read_text()
    assert "| base |" in markdown and "host time by op, base" in markdown
    assert f"| `{host[0][0]}` |" in markdown


def test_without_a_gpu_the_script_says_so_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cluster" / "gpu_profile.py"), "--out",
         str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no CUDA device")


def test_batches_are_pinned_on_a_gpu_as_the_loader_pins_them(synthetic_corpus, monkeypatch):
    """Unpinned batches make every host-to-device copy wait for the GPU; the script pins them
    as nmt-train's DataLoader does (on a CPU-only torch, pinning itself is counted)."""
    from transformer_nmt.config import compose
    from transformer_nmt.data.collate import Batch

    cfg = compose(["experiment=multi30k_en_de", *synthetic_corpus.overrides])
    if torch.cuda.is_available():
        batches = gpu_profile.batches_for(cfg, 256, 3, 8, pin=True)
        assert all(b.src_tokens.is_pinned() and b.tgt_out.is_pinned() for b in batches)
        return
    pinned = []
    monkeypatch.setattr(Batch, "pin_memory", lambda self: pinned.append(self) or self)
    batches = gpu_profile.batches_for(cfg, 256, 3, 1, pin=True)
    assert len(batches) == 3 and pinned == batches
    pinned.clear()
    gpu_profile.batches_for(cfg, 256, 3, 1)
    assert pinned == []
