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
    # is_bf16_supported() is True on V100 / T4 / P100 too (emulated bf16): the capability decides
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    for capability, expected in [((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 0), "fp16"),
                                 ((7, 5), "fp16"), ((6, 0), "fp16")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: c)
        assert runtime.resolve_precision("auto", gpu) == expected, capability
    assert runtime.resolve_precision("fp32", gpu) == "fp32"
    assert runtime.resolve_precision("bf16", gpu) == "bf16"  # explicit request is kept


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


class _FakeCuda:
    """torch.cuda's RNG functions for ``count`` visible devices, without a GPU."""

    def __init__(self, count: int, current: int = 0):
        self.count, self.current = count, current
        self.states = {i: torch.full((8,), i, dtype=torch.uint8) for i in range(count)}
        self.set_calls: list[int] = []

    def _check(self, device):
        index = (torch.device("cuda", device).index if isinstance(device, (int, str))
                 else device.index)
        index = self.current if index is None else index
        if index >= self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return index

    def get_rng_state(self, device="cuda"):
        return self.states[self._check(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        index = self._check(device)
        self.set_calls.append(index)
        self.states[index] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.count)]

    def set_rng_state_all(self, states):
        for i, s in enumerate(states):
            self.set_rng_state(s, i)

    def install(self, monkeypatch):
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)


def test_cuda_rng_state_is_the_current_devices_and_resumes_on_fewer_gpus(monkeypatch):

    saving = _FakeCuda(count=4, current=2)  # local rank 2 of a 4-GPU node
    saving.install(monkeypatch)
    state = runtime.rng_state()
    assert torch.equal(state["cuda"], torch.full((8,), 2, dtype=torch.uint8))

    resuming = _FakeCuda(count=1, current=0)  # the same rank resumed with one visible GPU
    resuming.install(monkeypatch)
    runtime.set_rng_state(state)
    assert resuming.set_calls == [0]
    assert torch.equal(resuming.states[0], torch.full((8,), 2, dtype=torch.uint8))

    # a checkpoint that held every device's state restores the current device's entry only
    old = dict(state, cuda=saving.get_rng_state_all())
    resuming.set_calls.clear()
    runtime.set_rng_state(old)
    assert resuming.set_calls == [0]
    assert torch.equal(resuming.states[0], torch.zeros(8, dtype=torch.uint8))


def test_sigusr2_stops_like_sigterm_then_goes_to_the_handler_before_ours():
    """Hydra's submitit launcher signals SIGUSR2 before the time limit; its handler (here a
    stand-in) requeues the job. Ours records the stop; submitit's runs only when
    hand_over() is called after the stop checkpoint, and only for SIGUSR2."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        flag = runtime.StopFlag()
        flag.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.requested == signal.SIGUSR2 and calls == []
        flag.restore()
        assert flag.hand_over() is True and calls == [signal.SIGUSR2]
        sigint = runtime.StopFlag()  # Python's SIGINT handler would raise KeyboardInterrupt
        sigint.install()
        sigint.requested = signal.SIGINT
        sigint.restore()
        assert sigint.hand_over() is False and runtime.StopFlag().hand_over() is False
    finally:
        signal.signal(signal.SIGUSR2, previous)
