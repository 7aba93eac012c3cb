"""scripts/cluster/gpu_profile.py (the GPU measurement of the training step) on the CPU: the
helpers that sort kernels and measure the GPU's idle time hold on hand-made inputs, batches are
pinned and packed as nmt-train's are. Its smoke run (every part with a tiny model; the timed
pass compiles nothing) runs inside device_measure.py's: test_device_measure_script.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


def test_ranges_marked_on_the_gpu_timeline_are_not_kernels():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, annotation):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation)

    events = [event("ProfilerStep#3", cuda, True), event("Optimizer.step#Adam.step", cuda, True),
              event("nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT", cuda, False),
              event("Memcpy HtoD (Pinned -> Device)", cuda, False),
              event("aten::mm", cpu, False), event("ProfilerStep#3", cpu, True)]
    assert [e.name for e in gpu_profile.device_kernels(events)] == [
        "nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT", "Memcpy HtoD (Pinned -> Device)"]


def test_busy_fraction_counts_overlapping_kernels_once():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # 0-3 busy, 3-5 idle, 5-6 busy
    assert gpu_profile.busy_fraction(spans, (0.0, 10.0)) == pytest.approx(0.4)
    assert gpu_profile.busy_fraction([], (0.0, 1.0)) == 0.0
    assert gpu_profile.busy_fraction(spans, (2.0, 2.0)) == 0.0


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


def test_packed_batches_have_the_runs_one_shape_and_count_real_tokens(synthetic_corpus,
                                                                      monkeypatch):
    """``--packing`` measures the batches nmt-train packs (one (rows, pack_length) shape for
    the run) and counts their real tokens per sentence, not per row."""
    from transformer_nmt.config import PAD_ID, compose
    from transformer_nmt.data.collate import Batch

    cfg = compose(["experiment=multi30k_en_de", *synthetic_corpus.overrides])
    pinned = []
    monkeypatch.setattr(Batch, "pin_memory", lambda self: pinned.append(self) or self)
    batches = gpu_profile.batches_for(cfg, 256, 4, 1, pin=True, packing=True)
    assert len(batches) == 4 and pinned == batches
    assert all(b.packed for b in batches)
    assert len({tuple(b.src_tokens.shape) for b in batches}) == 1
    counts = gpu_profile.counts_of(batches)
    real = sum(int(b.tgt_out.ne(PAD_ID).sum()) for b in batches)
    assert counts.tgt == real == sum(b.ntokens for b in batches)
    lengths = torch.cat([b.tgt_lengths for b in batches])  # per sentence: squares differ by row
    assert counts.tgt_sq == int((lengths * lengths).sum())
    assert sum(b.nsentences for b in batches) > sum(b.src_tokens.size(0) for b in batches)
