"""scripts/micro/bench_int8_kernels.py on small shapes: one timing row per shape and row count,
oneDNN's int8 form equal to Int8Linear's up to float32 rounding, its rows independent of their
batch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import bench_int8_kernels  # noqa: E402

from transformer_nmt.decode.quantize import quantized_engine  # noqa: E402


def _fbgemm() -> bool:
    try:
        return quantized_engine() in ("x86", "fbgemm")
    except Exception:
        return False


@pytest.mark.skipif(not bench_int8_kernels.onednn_available() or not _fbgemm(),
                    reason="needs oneDNN's int8 linear and fbgemm (x86)")
def test_bench_int8_kernels_times_both_forms_and_checks_the_rows(capsys):
    threads, engine = torch.get_num_threads(), torch.backends.quantized.engine
    try:
        bench_int8_kernels.main(["--rows", "3,40", "--shapes", "32x48,64x16", "--rounds", "2",
                                 "--alone", "1,2,7", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
        torch.backends.quantized.engine = engine
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) \| (\d+) x (\d+) \| [\d,]+ \| [\d,]+ \| [\d,]+ \| [\d.]+ \| "
                      r"(\S+) \|$", out, re.M)
    assert [(r, k, n) for r, k, n, _ in rows] == [
        ("3", "32", "48"), ("40", "32", "48"), ("3", "64", "16"), ("40", "64", "16")]
    assert all(float(d) < 1e-4 for *_, d in rows)  # the same codes and weights: rounding only
    assert "32 x 48: none" in out and "64 x 16: none" in out


def test_onednn_form_relu_and_no_bias_match_int8_linear():
    if not bench_int8_kernels.onednn_available() or not _fbgemm():
        pytest.skip("needs oneDNN's int8 linear and fbgemm (x86)")
    from torch import nn

    from transformer_nmt.decode.quantize import Int8Linear

    torch.manual_seed(1)
    engine = torch.backends.quantized.engine
    try:
        for bias in (True, False):
            layer = bench_int8_kernels._int8_layer(nn.Linear(24, 40, bias=bias))
            relu = Int8Linear(layer.weight(), layer.bias, relu=True)
            x = torch.randn(9, 24) * torch.logspace(-2, 2, 9).unsqueeze(1)
            for int8 in (layer, relu):
                got = bench_int8_kernels.OneDNNInt8(int8)(x)
                assert torch.allclose(got, int8(x), rtol=1e-5, atol=1e-5)
                assert not int8.relu or bool((got >= 0).all())
    finally:
        torch.backends.quantized.engine = engine
