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
import socket
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


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str,
                name: str = LOCK_NAME) -> Iterator[Path]:
    """Hold ``<folder>/<name>`` while ``command`` (``nmt-train``, ``nmt-evaluate``, ...) writes
    into ``folder``: the one lock of every command that writes into a run, data or output
    folder, so that a second writer stops instead of interleaving its files with the first's.

    The file is created exclusively (``O_EXCL``) and holds the holder's command, host, pid
    and start time; it is removed on exit (also on an exception or a signal that ends the
    command). A lock of a process that no longer exists on this host (``kill -9``, a crash)
    is stale: it is replaced, with a warning. A lock of another host cannot be checked and is
    refused. The lock is re-entrant within one process (an inner ``folder_lock`` of the same
    file is a no-op). ``folder`` is created if missing, and removed again if this command
    leaves it empty.

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
                if host == me["host"] and (pid == me["pid"] or not _alive(pid)):
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
        yield lock
    finally:
        del _held[key]
        with contextlib.suppress(OSError, ValueError):
            if json.loads(lock.read_text()).get("pid") == me["pid"]:
                lock.unlink()
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: a command that failed before writing anything
