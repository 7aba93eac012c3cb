"""Stop signals that arrive while ``nmt-train`` starts up: importing torch, composing the
config, the rendezvous, building the sampler and the model, resuming (on WMT14, a sampler over
4.5M pairs). A pre-empted or requeued job gets its SIGTERM at any moment, also then.

``nmt-train`` calls :func:`record` first, before torch is imported (this module imports only
the standard library): each stop signal is recorded instead of ending the process. The
training loop's :class:`transformer_nmt.runtime.StopFlag` then takes the recorded signal over
(:func:`take_over`), and a run signalled before its first step stops there, without a step or
a new checkpoint, with ``stopped_by: "signal SIGTERM"`` in ``train_summary.json``, so
``scripts/cluster/slurm_train.sh`` requeues it (and submitit's SIGUSR2 handler runs). When nothing
takes the signal over (a dry run, an error before training), :func:`release` delivers it
again once the command has finished.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
"""The signals recorded: those of :data:`transformer_nmt.runtime.STOP_SIGNALS` (not imported:
that module imports torch)."""
INTERRUPT_EXIT = 130
"""Exit status after a second Ctrl-C during start-up (128 + SIGINT)."""


class _Recorder:
    """The handlers installed by :func:`record`: the first stop signal received, and the
    handlers they replaced."""

    def __init__(self) -> None:
        self.requested = 0
        self.previous: dict[int, Any] = {}
        self.taken_over = False

    def handler(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.requested == signal.SIGINT:
            with contextlib.suppress(Exception):
                sys.stderr.write("interrupted again: exiting now\n")
                sys.stderr.flush()
            os._exit(INTERRUPT_EXIT)
        if signum == signal.SIGINT:
            with contextlib.suppress(Exception):
                sys.stderr.write("interrupted during start-up: stopping before the first step "
                                 "(press Ctrl-C again to exit at once)\n")
                sys.stderr.flush()
        if not self.requested:
            self.requested = signum


_recorder: _Recorder | None = None


def record() -> None:
    """Record the stop signals from now on instead of ending the process (main thread only;
    a second call does nothing)."""
    global _recorder
    if _recorder is not None:
        return
    recorder = _Recorder()
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            recorder.previous[sig] = signal.signal(sig, recorder.handler)
        except ValueError:  # not the main thread: nothing is recorded
            return
    _recorder = recorder


def take_over(stop_flag: Any) -> int:
    """Hand the recorded signal to ``stop_flag`` (a :class:`transformer_nmt.runtime.StopFlag`
    installed just now, over the recorders): its ``requested`` becomes the first signal
    recorded (when it has none), and the handlers it will restore and hand over to are those
    the recorders replaced. Returns the recorded signal (0: none)."""
    recorder = _recorder
    if recorder is None or recorder.taken_over:
        return 0
    for sig, previous in recorder.previous.items():
        if stop_flag.previous.get(sig) == recorder.handler:
            stop_flag.previous[sig] = previous
    if recorder.requested and not stop_flag.requested:
        stop_flag.requested = recorder.requested
    recorder.taken_over = True
    return recorder.requested


def release() -> None:
    """Put back the handlers :func:`record` replaced. A signal recorded but never taken over
    ends the process now, as it would have when it came (Ctrl-C: exit status 130)."""
    global _recorder
    recorder, _recorder = _recorder, None
    if recorder is None:
        return
    for sig, previous in recorder.previous.items():
        if signal.getsignal(sig) == recorder.handler:
            signal.signal(sig, previous)
    if recorder.requested and not recorder.taken_over:
        if recorder.requested == signal.SIGINT:
            sys.exit(INTERRUPT_EXIT)
        os.kill(os.getpid(), recorder.requested)
