"""The MFU denominator: each GPU part gets its own data-sheet peak, matched on the exact
``torch.cuda.get_device_name`` string, and says which peak it used; an unknown device gets
none (no MFU), never a neighbour's."""

from __future__ import annotations

import pytest

from transformer_nmt.model.flops import PEAK_FLOPS, device_part, peak_flops, peak_flops_source


@pytest.mark.parametrize("name, part, bf16_tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835),
    ("NVIDIA H200", "H200 SXM", 989),
    ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA GH200 480GB", "GH200", 989),
    ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100-PCIE-40GB", "A100", 312),
    ("NVIDIA A100 80GB PCIe", "A100", 312),
])
def test_each_part_gets_its_own_peak(name, part, bf16_tflops):
    assert device_part(name) == part
    assert peak_flops(name, "bf16") == bf16_tflops * 1e12
    assert peak_flops(name, "fp32") == PEAK_FLOPS[part]["fp32"] < peak_flops(name, "bf16")
    assert (part in peak_flops_source(name, "bf16")
            and f"{bf16_tflops:g}" in peak_flops_source(name, "bf16"))


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA H100 PCIe-like", "Tesla V100-SXM2-16GB",
                                  "cpu (x86_64, 2 threads)", "cpu (AMD EPYC, AVX512, 2 threads)",
                                  "NVIDIA H1000"])
def test_an_unknown_device_gets_no_peak(name):
    assert device_part(name) is None and peak_flops(name, "bf16") is None
    assert "no MFU" in peak_flops_source(name, "bf16")
