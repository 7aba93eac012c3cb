"""scripts/micro/bench_prepack.py on small shapes: one timing row per shape and row count, the
packed product's difference at float32 rounding, and its rows independent of their batch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from transformer_nmt.decode.prepack import prepack_supported

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import bench_prepack  # noqa: E402


@pytest.mark.skipif(not prepack_supported(), reason="this PyTorch build has no oneDNN packing")
def test_bench_prepack_times_both_and_checks_the_rows(capsys):
    threads = torch.get_num_threads()
    try:
        bench_prepack.main(["--rows", "3,40", "--shapes", "32x48,64x16", "--rounds", "2",
                            "--alone", "1,2,7", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) \| (\d+) x (\d+) \| [\d,]+ \| [\d,]+ \| [\d.]+ \| (\S+) \|$",
                      out, re.M)
    assert [(r, k, n) for r, k, n, _ in rows] == [
        ("3", "32", "48"), ("40", "32", "48"), ("3", "64", "16"), ("40", "64", "16")]
    assert all(float(d) < 1e-4 for *_, d in rows)
    assert "32 x 48 packed: none" in out and "64 x 16 packed: none" in out
