"""scripts/micro/bench_row_topk.py on a small matrix: it checks the two top-k equal and prints
both timings."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import bench_row_topk  # noqa: E402


def test_bench_row_topk_times_both(capsys):
    threads = torch.get_num_threads()
    try:
        bench_row_topk.main(["--rows", "6", "--vocab", "2048", "--k", "8", "--rounds", "2",
                             "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "6 x 2048, k 8, block width 32" in out
    assert "torch.topk + row max (before)" in out and "row_topk (after)" in out
