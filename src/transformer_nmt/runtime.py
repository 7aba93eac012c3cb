"""Where and how tensors run: device, precision, autocast, fp16 loss scaling, seeding, and the
stop signals of a training process.

Shared by training (:mod:`transformer_nmt.train.loop`) and decoding
(:mod:`transformer_nmt.decode.translate`, :mod:`transformer_nmt.evaluate.evaluate`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import random
import signal
import sys
from typing import Any

import numpy as np
import torch

from transformer_nmt.errors import UserError

log = logging.getLogger(__name__)

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
"""Signals that make training checkpoint and exit at the next step boundary (SIGINT: Ctrl-C;
SIGUSR2: Hydra's submitit launcher before the time limit)."""
HANDED_OVER_SIGNALS = ("SIGUSR2",)
"""Stop signals whose earlier handler still runs once the stop checkpoint is written
(:meth:`StopFlag.hand_over`): submitit's SIGUSR2 handler requeues the job."""
INTERRUPT_EXIT = 130
"""Exit status after a second Ctrl-C (128 + SIGINT, what shells report for an interrupt)."""
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each lower floating-point precision (``trainer.precision``,
``decode.precision``)."""


def resolve_device(name: str | torch.device | None, key: str = "decode.device") -> torch.device:
    """``auto`` (or None) -> ``cuda`` when available, else ``cpu``; anything else as given.

    ``key`` names the setting in error messages.

    Raises:
        UserError: a device name torch does not know, or a CUDA device that is not there
            (no CUDA build or GPU, or an index beyond the GPUs present).
    """
    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UserError(f"{key}={name} is not a torch device ({e}); use auto, cpu, cuda "
                        "or cuda:<index>") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{key}={name}: CUDA is not available here (torch "
                            f"{torch.__version__}, {torch.cuda.device_count()} GPUs visible); "
                            "use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"{key}={name}: only {torch.cuda.device_count()} CUDA GPUs "
                            "are visible")
    return device


def resolve_precision(requested: str, device: torch.device) -> str:
    """The training precision actually used: ``fp32``, ``bf16`` or ``fp16``.

    ``auto`` is bf16 on GPUs with native bf16 arithmetic (compute capability >= 8.0:
    Ampere and later), fp16 with dynamic loss scaling on older GPUs (P100, V100, T4:
    ``torch.cuda.is_bf16_supported()`` is True there too, but bf16 is emulated and slow),
    fp32 on CPU.

    Raises:
        UserError: fp16 requested on CPU (no loss-scaled fp16 training there).
    """
    if device.type != "cuda":
        if requested == "fp16":
            raise UserError(f"trainer.precision=fp16 needs a CUDA GPU, and this run's device is "
                            f"{device.type}; use trainer.precision=fp32 or bf16")
        return "fp32" if requested == "auto" else requested
    if requested == "auto":
        return "bf16" if native_bf16(device) else "fp16"
    return requested


BF16_MIN_CAPABILITY = (8, 0)
"""CUDA compute capability from which bf16 matmuls run natively (Ampere)."""


def native_bf16(device: torch.device) -> bool:
    """True when the CUDA ``device`` computes bf16 natively (capability >= 8.0)."""
    return tuple(torch.cuda.get_device_capability(device)) >= BF16_MIN_CAPABILITY


def autocast_context(precision: str, device: torch.device):
    """Autocast for ``bf16``/``fp16`` on ``device``; a no-op for ``fp32`` and for ``int8``
    (the quantized layers carry it: :mod:`transformer_nmt.decode.quantize`).

    Raises:
        ValueError: for an unknown precision.
    """
    if precision in ("fp32", "int8"):
        return contextlib.nullcontext()
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"decode.precision={precision!r} is not one of {list(PRECISIONS)}")
    return torch.autocast(device_type=device.type, dtype=PRECISION_DTYPES[precision])


def grad_scaler(enabled: bool):
    """A dynamic loss scaler for fp16 training (a disabled one, a no-op, otherwise)."""
    return torch.amp.GradScaler("cuda", enabled=enabled)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU and every GPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def cpu_model() -> str:
    """The CPU's model name (``model name`` in /proc/cpuinfo; elsewhere
    ``platform.processor()`` or the machine type)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    """Human-readable device: the GPU's name; for a CPU its model, the vector instructions
    PyTorch's kernels use (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...) and
    the torch thread count, e.g. ``cpu (AMD EPYC, AVX512, 2 threads)``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return str(device)
    return (f"cpu ({cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} threads)")


class StopFlag:
    """Installs SIGTERM / SIGUSR1 / SIGUSR2 / SIGINT handlers that only record that a stop was
    requested.

    ``requested`` is 0, or the number of the first signal received (the cause: under
    ``torchrun`` a Ctrl-C reaches the agent too, which then sends SIGTERM to its workers). A second
    SIGINT (Ctrl-C pressed again while the first stop waits for the step boundary) ends the process
    at once with exit status :data:`INTERRUPT_EXIT` (130) and one line on standard error, without a
    traceback and without a checkpoint.
    """

    def __init__(self) -> None:
        self.requested = 0
        self.previous: dict[int, Any] = {}
        self._replaced: dict[int, Any] = {}
        self._interrupts = 0

    def _handler(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts >= 2:
                with contextlib.suppress(Exception):
                    sys.stderr.write("interrupted again: exiting now without a checkpoint\n")
                    sys.stderr.flush()
                os._exit(INTERRUPT_EXIT)
            with contextlib.suppress(Exception):
                sys.stderr.write("interrupted: saving a checkpoint at the end of this step "
                                 "(press Ctrl-C again to exit at once, without one)\n")
                sys.stderr.flush()
        if not self.requested:
            self.requested = signum

    def install(self) -> None:
        """Install the handlers (in the main thread; elsewhere nothing is installed)."""
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                self.previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self._replaced.update(self.previous)
        self.previous.clear()

    def hand_over(self) -> bool:
        """After :meth:`restore` and the stop checkpoint: call the handler that was installed
        before ours for the signal received, when that signal is one of
        :data:`HANDED_OVER_SIGNALS` and the handler is a Python function (submitit's SIGUSR2
        handler, which requeues the job and exits). Returns whether it was called."""
        handler = self._replaced.get(self.requested)
        if (not self.requested or not callable(handler)
                or signal.Signals(self.requested).name not in HANDED_OVER_SIGNALS):
            return False
        handler(self.requested, None)
        return True


def _cuda_rng_state() -> torch.Tensor | list:
    """The RNG state of this process's current CUDA device ([] without CUDA).

    Only the current device's: a rank drives one GPU, and a run resumed with fewer visible
    GPUs (another ``CUDA_VISIBLE_DEVICES``) must not index devices it no longer has.
    """
    if not torch.cuda.is_available():
        return []
    return torch.cuda.get_rng_state(torch.cuda.current_device())


def _set_cuda_rng_state(saved: Any) -> None:
    """Restore :func:`_cuda_rng_state` on the current device. A list (checkpoints that held
    every visible device's state) gives its entry of the current device, or its first."""
    if not torch.cuda.is_available():
        return
    if isinstance(saved, (list, tuple)):
        if not saved:
            return
        index = torch.cuda.current_device()
        saved = saved[index] if index < len(saved) else saved[0]
    torch.cuda.set_rng_state(saved.cpu(), torch.cuda.current_device())


def rng_state() -> dict[str, Any]:
    """This process's RNG states in types ``torch.load(weights_only=True)`` accepts:
    ``torch`` (CPU), ``cuda`` (the current device's state only, [] without CUDA), ``numpy``,
    ``python``."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": _cuda_rng_state(),
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {"version": int(py_version), "state": list(py_state), "gauss_next": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state` (CUDA: on the current device only)."""
    torch.set_rng_state(state["torch"].cpu())
    _set_cuda_rng_state(state.get("cuda"))
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4


def retain_freed_memory() -> bool:
    """Let glibc malloc keep freed memory for reuse instead of handing it back to the OS.

    CPU tensors come from malloc. By default glibc serves large blocks (above a threshold
    that adapts up to 32 MiB) with fresh ``mmap`` pages and unmaps them when freed, and
    trims the heap's free top; a decoding step that allocates its (rows, vocabulary)
    log-probabilities, K/V and activations anew then pays a page fault (the kernel zeroing
    4 KiB) for every page of them, every step. With ``M_MMAP_MAX`` 0 (large blocks from the
    heap) and ``M_TRIM_THRESHOLD`` -1 (never trim), freed blocks are reused without faults;
    the process keeps its peak heap until it exits. The same as running with
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1`` in the environment, or preloading
    jemalloc / tcmalloc. ``nmt-translate`` and ``nmt-evaluate`` call it (docs/benchmarks.md:
    beam-search page faults and time with and without).

    Returns:
        True when applied; False where the C library is not glibc (macOS, musl), where
        nothing changes.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1
