"""The lock of a folder that a command writes into: one writer at a time.

Every command that writes into a run folder (``runs/<name>``), a data folder or an export
folder holds that folder's lock while it writes (:func:`folder_lock`): ``nmt-train``,
``nmt-average``, ``nmt-evaluate``, ``nmt-translate`` (when it writes into its run),
``nmt-export``, ``nmt-import``, ``nmt-prepare`` and ``nmt-plot`` (the folder its figures go
to). Readers take no lock: plotting or translating from a run that is still training works.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformer_nmt.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = "nmt.lock"
"""The lock file a command holds in a run or data folder while it writes there
(:func:`folder_lock`)."""
_LOCK_READ_TRIES = 10
"""Reads of a lock file whose content is not (yet) a holder, 0.1 s apart: a holder writes its
name right after creating the file."""
_held: dict[Path, int] = {}
"""Lock files this process holds -> nesting depth (a sweep that evaluates inside its run)."""


_REUSE_SLACK = 60.0
"""Seconds a process may seem to start after the lock it wrote (``/proc`` counts from the boot
time in whole seconds, and the wall clock may have been adjusted since): a pid whose process
started later than that is another process, the lock's own having ended."""


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, from ``/proc``), or None where
    that cannot be read (not Linux, the process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22: starttime
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _holder_runs(holder: dict[str, Any]) -> bool:
    """True when the process that wrote ``holder`` still runs on this host: its pid exists and,
    where the start time can be read, started before the lock was written (a pid reused by a
    later process does not hold the lock)."""
    pid = holder["pid"]
    if not _alive(pid):
        return False
    started, began = holder.get("started"), _process_start(pid)
    if isinstance(started, (int, float)) and began is not None:
        return began <= started + _REUSE_SLACK
    return True


@contextlib.contextmanager
def _released_on_sigterm() -> Iterator[None]:
    """While a lock is held, SIGTERM (``kill``, a job scheduler) ends the command through the
    normal exit path, exit status 143, so that the lock is removed, where it would otherwise
    end the process at once. A handler already installed (``nmt-train``'s) is kept."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_holder(lock: Path) -> dict[str, Any] | None:
    """The holder recorded in ``lock`` (``command``, ``host``, ``pid``, ``started``), or None
    when the file stays empty or unparsable for about a second.

    Raises:
        FileNotFoundError: the lock was released meanwhile.
    """
    for attempt in range(_LOCK_READ_TRIES):
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            holder = json.loads(lock.read_bytes())
            if (isinstance(holder, dict) and isinstance(holder.get("pid"), int)
                    and isinstance(holder.get("host"), str)):
                return holder
        if not lock.exists():
            raise FileNotFoundError(lock)
        if attempt + 1 < _LOCK_READ_TRIES:
            time.sleep(0.1)
    return None


def live_holder(folder: str | os.PathLike, name: str = LOCK_NAME) -> dict[str, Any] | None:
    """The holder of ``<folder>/<name>`` (``command``, ``host``, ``pid``, ``started``) when it is
    a process that runs on this host, else None (no lock, a stale or unreadable one, another
    host's). Reads only: for a reader that warns beside a writer (``nmt-export`` of a run
    that ``nmt-train`` still writes)."""
    lock = Path(folder) / name
    if not lock.is_file():
        return None
    try:
        holder = _read_holder(lock)
    except FileNotFoundError:
        return None
    if holder is None or holder["host"] != socket.gethostname() or not _holder_runs(holder):
        return None
    return holder


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str,
                name: str = LOCK_NAME) -> Iterator[Path]:
    """Hold ``<folder>/<name>`` while ``command`` (``nmt-train``, ``nmt-evaluate``, ...) writes
    into ``folder``: the one lock of every command that writes into a run, data or output
    folder, so that a second writer stops instead of interleaving its files with the first's.

    The file is created exclusively (``O_EXCL``) and holds the holder's command, host, pid
    and start time; it is removed on exit (also on an exception, Ctrl-C, or SIGTERM, which
    ends the command with exit status 143 unless it has a handler of its own). A lock of a
    process that no longer runs on this host (``kill -9``, a crash; a pid now used by a process
    that started after the lock was written) is stale: it is replaced, with a warning. A lock
    of another host cannot be checked and is refused. The lock is re-entrant within one
    process (an inner ``folder_lock`` of the same file is a no-op). ``folder`` is created if
    missing, and removed again if this command leaves it empty.

    Raises:
        UserError: ``folder`` is a file; another live process holds the lock (its command,
            pid, host and start time named); the lock file is empty or not a lock (how to
            remove it said).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder")
    lock = folder / name
    key = Path(os.path.abspath(lock))
    if key in _held:  # this process holds it already
        _held[key] += 1
        try:
            yield lock
        finally:
            _held[key] -= 1
        return
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    me = {"command": command, "host": socket.gethostname(), "pid": os.getpid(),
          "started": time.time()}
    try:
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    holder = _read_holder(lock)
                except FileNotFoundError:
                    continue  # released meanwhile
                if holder is None:
                    raise UserError(
                        f"the lock file {lock} is unreadable (empty or not a lock of this "
                        f"project); if no nmt command is running in {folder}, delete it "
                        f"(rm {lock}) and run the command again") from None
                host, pid = holder["host"], holder["pid"]
                if host == me["host"] and (pid == me["pid"] or not _holder_runs(holder)):
                    log.warning("removing the stale lock %s of process %d, which no longer "
                                "runs", lock, pid)
                    with contextlib.suppress(FileNotFoundError):
                        lock.unlink()
                    continue
                since = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
                         if isinstance(holder.get("started"), (int, float)) else "?")
                raise UserError(
                    f"{folder} is in use by another {holder.get('command') or 'nmt command'} "
                    f"(process {pid} on {host}, since {since}; lock file {lock}); wait for it "
                    "to end, or delete the lock file if that process is gone"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            break
        else:
            raise UserError(f"cannot take the lock {lock}: it keeps changing; is another "
                            f"command starting in {folder}?")
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    _held[key] = 1
    try:
        with _released_on_sigterm():
            yield lock
    finally:
        del _held[key]
        with contextlib.suppress(OSError, ValueError):
            if json.loads(lock.read_text()).get("pid") == me["pid"]:
                lock.unlink()
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: a command that failed before writing anything
