"""A local sweep: ``nmt-train -m ...`` under Hydra's basic launcher, which runs the jobs (the
Table 3 rows and seeds) one after another in this process.

Whatever ends one job ends the whole sweep, and says which jobs never ran:

* a user error (a Table 3 row that does not apply to the experiment, a missing file):
  ``error: <message>; rows not run: C_N4, C_N8, ...`` (:func:`name_jobs_not_run`), exit 2;
* a stop signal (Ctrl-C, SIGTERM): training stops at the next step boundary with a
  checkpoint, the row is evaluated (its results.json marked short) and no further row
  starts: ``interrupted: ...; rows not run: ...`` (:func:`stop_if_signalled`), exit 128 +
  the signal's number (130 for Ctrl-C). A second Ctrl-C skips that evaluation.

Under another launcher (SLURM through submitit) every job is a process of its own, and none of
this applies.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from transformer_nmt.cli import INTERRUPTED_EXIT, USER_ERRORS, error_message
from transformer_nmt.config.help import sweep_jobs
from transformer_nmt.errors import UserError

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


class SweepStopped(KeyboardInterrupt):
    """A stop signal ended a local sweep; :func:`transformer_nmt.cli.run_app` prints
    ``interrupted: <message>`` and exits with ``exit_status``."""

    def __init__(self, message: str, exit_status: int = INTERRUPTED_EXIT) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class SweepError(UserError):
    """A user error that ended a local sweep; the message names the jobs not run."""


def describe(job: Sequence[str], jobs: Sequence[Sequence[str]]) -> str:
    """A job by what varies between ``jobs``: the row alone (``A_h1``) when only the Table 3
    row is swept, else the varying overrides (``table3=base trainer.seed=2``)."""
    varying = [i for i in range(len(job)) if len({j[i] for j in jobs}) > 1]
    parts = [job[i] for i in varying] or list(job)
    if len(parts) == 1 and parts[0].startswith("table3="):
        return parts[0].split("=", 1)[1]
    return " ".join(parts)


def current_job() -> int | None:
    """This job's number in a local sweep (Hydra's multirun with the basic launcher); None
    in a single run or under another launcher."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or OmegaConf.select(hc, "launcher._target_") != BASIC_LAUNCHER:
        return None
    return int(hc.job.num)


def _jobs() -> list[list[str]]:
    try:
        return sweep_jobs(sys.argv[1:])
    except Exception:  # noqa: BLE001 -- the note is an extra; Hydra parsed these already
        return []


def jobs_not_run(num: int) -> str:
    """``rows not run: A_h1, D_ls0`` for the jobs after job ``num`` of this command's sweep
    (``runs not run: ...`` for a sweep of other settings); ``""`` when none is left."""
    jobs = _jobs()
    later = [describe(j, jobs) for j in jobs[num + 1:]]
    if not later:
        return ""
    rows = any(o.startswith("table3=") for o in jobs[0])
    return f"{'rows' if rows else 'runs'} not run: {', '.join(later)}"


def _this_job(num: int) -> str:
    jobs = _jobs()
    return describe(jobs[num], jobs) if 0 <= num < len(jobs) else f"job #{num}"


@contextlib.contextmanager
def name_jobs_not_run() -> Iterator[None]:
    """Inside a job of a local sweep: a user error (:data:`transformer_nmt.cli.USER_ERRORS`)
    becomes a :class:`SweepError` whose message ends with the jobs not run, and a Ctrl-C a
    :class:`SweepStopped` naming them; elsewhere nothing changes."""
    try:
        yield
    except SweepStopped:
        raise
    except USER_ERRORS as e:
        num = current_job()
        note = jobs_not_run(num) if num is not None else ""
        if not note:
            raise
        raise SweepError(f"{error_message(e)}; {note}") from e
    except KeyboardInterrupt:
        num = current_job()
        if num is None:
            raise
        note = jobs_not_run(num)
        raise SweepStopped(f"the sweep stopped during {_this_job(num)} (no output file is "
                           "left half-written)" + (f"; {note}" if note else "")) from None


def stopped_by_signal(summary: dict[str, Any] | None) -> int:
    """The number of the stop signal that ended a training run (its summary's
    ``stopped_by: "signal SIGINT"``), 0 when none did."""
    stopped_by = str((summary or {}).get("stopped_by") or "")
    if not stopped_by.startswith("signal "):
        return 0
    with contextlib.suppress(KeyError):
        return int(signal.Signals[stopped_by.split(" ", 1)[1]])
    return 0


def stop_if_signalled(summary: dict[str, Any] | None, max_steps: int | None,
                      evaluated: bool) -> None:
    """In a local sweep, after a row whose training a stop signal ended (``summary``, the
    training's summary): raise :class:`SweepStopped` (exit 128 + the signal) saying where the
    row stopped and which rows never ran, so that no further row starts. Elsewhere, or after
    a row that finished, nothing."""
    signum = stopped_by_signal(summary)
    num = current_job() if signum else None
    if num is None:
        return
    steps = (summary or {}).get("steps")
    where = f"step {steps:,}" if isinstance(steps, int) else "its last step"
    if max_steps is not None:
        where += f" of {int(max_steps):,}"
    done = "evaluated, its results.json marked short" if evaluated else "not evaluated"
    note = jobs_not_run(num)
    raise SweepStopped(
        f"{signal.Signals(signum).name} stopped {_this_job(num)} at {where} ({done}; the next "
        "sweep resumes it from its last checkpoint)" + (f"; {note}" if note else ""),
        exit_status=128 + signum)
