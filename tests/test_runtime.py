"""Device, precision and autocast resolution (transformer_nmt.runtime), GPUs mocked."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
import torch

from transformer_nmt import runtime


def test_precision_on_cpu_and_on_mocked_gpus(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert runtime.resolve_precision("auto", cpu) == "fp32"
    assert runtime.resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        runtime.resolve_precision("fp16", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert runtime.resolve_precision("auto", gpu) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert runtime.resolve_precision("auto", gpu) == "fp16"  # V100 class: loss-scaled fp16
    assert runtime.resolve_precision("fp32", gpu) == "fp32"


def test_autocast_context():
    cpu = torch.device("cpu")
    assert isinstance(runtime.autocast_context("fp32", cpu), contextlib.nullcontext)
    with runtime.autocast_context("bf16", cpu):
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'fp8'"):
        runtime.autocast_context("fp8", cpu)


def test_device_scaler_seed_and_stop_flag():
    assert runtime.resolve_device("cpu") == torch.device("cpu")
    assert runtime.resolve_device(None).type in ("cpu", "cuda")
    assert not runtime.grad_scaler(False).is_enabled()
    runtime.seed_everything(4)
    a = torch.rand(2)
    runtime.seed_everything(4)
    assert torch.equal(a, torch.rand(2))
    flag = runtime.StopFlag()
    previous = signal.getsignal(signal.SIGUSR1)
    flag.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert flag.requested == signal.SIGUSR1
    flag.restore()
    assert signal.getsignal(signal.SIGUSR1) == previous
