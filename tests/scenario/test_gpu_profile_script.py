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
sys.path[:0] = [str(REPO / "scripts" / "cluster"), str(REPO / "scripts" / "bench")]
import bench_common  # noqa: E402  (found on the sys.path entries above)
import gpu_profile  # noqa: E402


def test_kernels_are_sorted_by_kind():
    assert bench_common.kind_of("void pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert bench_common.kind_of("fmha_cutlassB_bf16_aligned_64x64_k64_sm80") == "attention"
    assert bench_common.kind_of("nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT") == "matmul"
    assert bench_common.kind_of("multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>") \
        == "optimizer"
    assert bench_common.kind_of("triton_red_fused__log_softmax_sum_3") == "loss"
    assert bench_common.kind_of("triton_per_fused_native_layer_norm_7") == "other"


def test_ranges_marked_on_the_gpu_timeline_are_not_kernels():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, annotation):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation)

    events = [event("ProfilerStep#3", cuda, True), event("Optimizer.step#Adam.step", cuda, True),
              event("nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT", cuda, False),
              event("Memcpy HtoD (Pinned -> Device)", cuda, False),
              event("aten::mm", cpu, False), event("ProfilerStep#3", cpu, True)]
    assert [e.name for e in bench_common.device_kernels(events)] == [
        "nvjet_sm90_tst_128x128_64x6_4x2_h_bz_NNT", "Memcpy HtoD (Pinned -> Device)"]


def test_busy_fraction_counts_overlapping_kernels_once():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # 0-3 busy, 3-5 idle, 5-6 busy
    assert bench_common.busy_fraction(spans, (0.0, 10.0)) == pytest.approx(0.4)
    assert bench_common.busy_fraction([], (0.0, 1.0)) == 0.0
    assert bench_common.busy_fraction(spans, (2.0, 2.0)) == 0.0


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


def test_a_profile_is_summed_per_step_with_the_gpus_idle_time():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, start=0.0, end=0.0, own=0.0, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=start, end=end),
                               self_cpu_time_total=own)

    # two steps over 0-10,000 us: kernels busy 0-3,000 and 5,000-6,000 (the ProfilerStep range
    # on the GPU's timeline is not a kernel); the host's own time 800 + 200 us
    events = [event("nvjet_sm90_tst_128x128", cuda, 0, 2000),
              event("fmha_cutlassF_bf16", cuda, 1000, 3000),
              event("triton_poi_fused_add_0", cuda, 5000, 6000),
              event("ProfilerStep#1", cuda, 0, 10000, annotation=True),
              event("cudaLaunchKernel", cpu, own=800.0), event("aten::mm", cpu, own=200.0)]
    out = bench_common.summarize_profile(events, 2, 10000.0, cuda=True)
    assert out["steps"] == 2 and out["wall_ms_per_step"] == 5.0
    assert out["kernel_ms_per_step"] == 2.5 and out["kernels_per_step"] == 1.5
    assert out["share_by_kind"] == {"attention": 0.4, "matmul": 0.4, "other": 0.2}
    assert out["top_kernels"][0][1] == 1.0 and out["attention_kernels"] == ["fmha_cutlassF_bf16"]
    assert out["gpu_busy_share"] == pytest.approx(4000 / 6000, abs=1e-4)  # over 0-6,000 us
    assert out["host_gap_ms_per_step"] == pytest.approx(1.0, abs=1e-3)
    assert out["host_ms_per_step"] == 0.5
    assert out["top_host_ops"][0] == ["cudaLaunchKernel", 0.4]
    on_cpu = bench_common.summarize_profile(events[4:], 2, 10000.0, cuda=False)
    assert on_cpu["kernels_per_step"] is None and "gpu_busy_share" not in on_cpu
    assert on_cpu["kernel_ms_per_step"] == 0.1 and on_cpu["share_by_kind"] == {"matmul": 1.0}
