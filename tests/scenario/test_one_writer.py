"""One writer at a time: every command that writes into a run, data or output folder holds
that folder's lock (transformer_nmt.run.lock.folder_lock); a second one stops with one line
naming the holder, an unreadable lock file says how to remove it, a stale one is replaced."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transformer_nmt.errors import UserError
from transformer_nmt.run.lock import LOCK_NAME, folder_lock

HOLD = """
import sys, time
from transformer_nmt.run.lock import folder_lock
with folder_lock(sys.argv[1], sys.argv[2], name=sys.argv[3]):
    print("held", flush=True)
    time.sleep(120)
"""


class Holder:
    """Another process holding ``folder``'s lock as ``command`` until stopped."""

    def __init__(self, folder: Path, command: str, name: str = LOCK_NAME):
        # SIGINT as a terminal delivers it, also when the tests run in a shell's background
        # job (which starts its commands with SIGINT ignored, and Python keeps that)
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), command, name],
                                     stdout=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                      signal.SIG_DFL))
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def stop(self, sig: int = signal.SIGINT) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def _outputs(root: Path) -> list[Path]:
    """Every file under ``root`` but Hydra's own (``.hydra/``, ``<job>.log``)."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()
                  and ".hydra" not in p.parts and p.suffix != ".log")


def _refusal(folder: Path, holder: Holder, command: str, lock: Path) -> str:
    return (f"error: {folder} is in use by another {command} (process {holder.pid} on "
            f"{socket.gethostname()}, since ")


def test_a_second_process_is_refused_with_the_holder_named_and_gets_the_lock_after(tmp_path):
    folder = tmp_path / "run"
    holder = Holder(folder, "nmt-export")
    try:
        with pytest.raises(UserError) as e, folder_lock(folder, "nmt-evaluate"):
            pass
        message = str(e.value)
        assert message.startswith(f"{folder} is in use by another nmt-export (process "
                                  f"{holder.pid} on {socket.gethostname()}, since ")
        assert message.endswith(f"lock file {folder / LOCK_NAME}); wait for it to end, or "
                                "delete the lock file if that process is gone")
    finally:
        holder.stop()
    assert not (folder / LOCK_NAME).exists()  # the holder released it on Ctrl-C
    with folder_lock(folder, "nmt-evaluate") as lock:
        assert json.loads(lock.read_text())["command"] == "nmt-evaluate"
        with folder_lock(folder, "nmt-evaluate"):  # re-entrant in one process
            pass
        assert lock.exists()
    assert not lock.exists()


def test_a_killed_holders_lock_is_replaced_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "run"
    holder = Holder(folder, "nmt-average")
    holder.stop(signal.SIGKILL)
    assert (folder / LOCK_NAME).exists()  # left behind by kill -9
    with caplog.at_level(logging.WARNING), folder_lock(folder, "nmt-evaluate"):
        pass
    assert f"removing the stale lock {folder / LOCK_NAME} of process {holder.pid}" in caplog.text


@pytest.mark.parametrize("content", ["", "{\"pid\": ", "garbage\n", "[1, 2]"])
def test_an_empty_or_garbage_lock_file_is_named_unreadable_with_how_to_remove_it(
        tmp_path, content):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / LOCK_NAME
    lock.write_text(content)
    with pytest.raises(UserError) as e, folder_lock(folder, "nmt-train"):
        pass
    assert str(e.value) == (
        f"the lock file {lock} is unreadable (empty or not a lock of this project); if no nmt "
        f"command is running in {folder}, delete it (rm {lock}) and run the command again")
    assert lock.read_text() == content  # never removed on a guess


def test_every_writing_command_stops_beside_a_holder_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    data_root = tmp_path / "data"
    base = [f"run_dir={run_dir}", "name=x", f"data.root={data_root}"]
    cases = [
        ("evaluate", base, run_dir, LOCK_NAME),
        ("average", base, run_dir, LOCK_NAME),
        ("import_model", [*base, f"export.source={tmp_path / 'marian'}"], run_dir, LOCK_NAME),
        ("translate", [*base, f"translate.input={tmp_path / 'in.en'}",
                       f"translate.output={run_dir / 'out.de'}"], run_dir, LOCK_NAME),
        ("export", base, run_dir / "export", ".hf.lock"),
        ("prepare", base, data_root / "raw" / "multi30k_en_de", LOCK_NAME),
    ]
    (tmp_path / "in.en").write_text("A dog.\n")
    for module, args, folder, name in cases:
        holder = Holder(folder, "nmt-train", name)
        try:
            before = _outputs(tmp_path)
            r = _cli(module, *args, cwd=tmp_path)
            assert r.returncode == 2, (module, r.stderr[-2000:])
            lines = r.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                _refusal(folder, holder, "nmt-train", folder / name)), (module, r.stderr)
            assert f"lock file {folder / name})" in lines[0]
            after = _outputs(tmp_path)
            assert after == before, module
        finally:
            holder.stop()


def test_nmt_plot_locks_the_folder_it_writes_and_only_reads_the_run(tmp_path):
    """nmt-plot draws a run that is still training (the trainer's lock on the run folder does
    not stop it: it only reads there) and holds the lock of plots/, so a second nmt-plot into
    the same folder stops with one line instead of interleaving its files."""
    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    records = [{"split": "train", "step": s, "time": 0.0, "loss": 5.0 - s / 100,
                "nll_loss": 4.9 - s / 100, "ppl": 2.0, "lr": 1e-4, "grad_norm": 1.0,
                "tokens_per_s": 1000.0, "seconds_per_step": 0.1, "skipped_steps": 0,
                "epoch": s / 1000, "tokens_seen": 500 * s} for s in (10, 20, 30)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = [f"run_dir={run_dir}", "name=x", "plot.kinds=[curves]"]
    trainer = Holder(run_dir, "nmt-train")
    try:
        r = _cli("plot", *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert (run_dir / "plots" / "curves.png").is_file()
        assert not (run_dir / "plots" / LOCK_NAME).exists()  # released
        (run_dir / "plots" / "curves.png").unlink()
        other = Holder(run_dir / "plots", "nmt-plot")
        try:
            r = _cli("plot", *args, cwd=tmp_path)
            assert r.returncode == 2, r.stderr[-2000:]
            lines = r.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                _refusal(run_dir / "plots", other, "nmt-plot", run_dir / "plots" / LOCK_NAME))
            assert not (run_dir / "plots" / "curves.png").exists()
        finally:
            other.stop()
    finally:
        trainer.stop()


def test_a_lock_naming_a_pid_now_used_by_a_later_process_is_stale(tmp_path, caplog):
    """The pid a lock names is alive, but its process started after the lock was written: the
    lock's own process ended and the pid was reused, so the lock is replaced, not obeyed."""
    folder = tmp_path / "run"
    folder.mkdir()
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / LOCK_NAME).write_text(json.dumps({
            "command": "nmt-average", "host": socket.gethostname(), "pid": later.pid,
            "started": time.time() - 3600}))
        with caplog.at_level(logging.WARNING), folder_lock(folder, "nmt-evaluate") as lock:
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert f"removing the stale lock {folder / LOCK_NAME} of process {later.pid}" in caplog.text
        # the same pid with a lock written after its process started still holds it
        (folder / LOCK_NAME).write_text(json.dumps({
            "command": "nmt-average", "host": socket.gethostname(), "pid": later.pid,
            "started": time.time()}))
        with pytest.raises(UserError, match="is in use by another nmt-average"), \
                folder_lock(folder, "nmt-evaluate"):
            pass
    finally:
        later.kill()
        later.wait()


def test_sigterm_ends_a_lock_holder_through_its_exit_and_removes_the_lock(tmp_path):
    """SIGTERM (kill, a scheduler's time limit) to a command holding a lock, such as
    nmt-average, ends it with exit status 143 and removes its lock, as Ctrl-C does."""
    folder = tmp_path / "run"
    holder = Holder(folder, "nmt-average")
    assert (folder / LOCK_NAME).exists()
    holder.stop(signal.SIGTERM)
    assert holder.proc.returncode == 143
    assert not (folder / LOCK_NAME).exists()


def test_a_command_refused_by_the_lock_leaves_no_hydra_folder_or_log_in_the_run(tmp_path):
    """An existing run (a trainer's .hydra and log in it) and an nmt-evaluate refused by the
    lock: its .hydra/evaluate/ and its empty evaluate.log are not left behind; the run's own
    files stay as they were."""
    run_dir = tmp_path / "runs" / "x"
    (run_dir / ".hydra" / "train").mkdir(parents=True)
    (run_dir / ".hydra" / "train" / "config.yaml").write_text("name: x\n")
    (run_dir / "train.log").write_text("trained\n")
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    holder = Holder(run_dir, "nmt-train")
    try:
        r = _cli("evaluate", f"run_dir={run_dir}", "name=x", f"data.root={tmp_path / 'data'}",
                 cwd=tmp_path)
        assert r.returncode == 2 and "is in use by another nmt-train" in r.stderr, r.stderr
        after = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")
                       if p.name != LOCK_NAME)
        assert after == before
        assert (run_dir / "train.log").read_text() == "trained\n"
    finally:
        holder.stop()


def test_nmt_table_creates_no_run_folder(tmp_path):
    """nmt-table writes its table and nothing else: no runs/no_experiment/ with Hydra's files
    and a log, in the folder it runs from."""
    out = tmp_path / "out" / "results.md"
    out.parent.mkdir()
    r = _cli("table", f"table.output={out}", f"table.results_glob={tmp_path}/none/*.json",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.is_file()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        out.parent.relative_to(tmp_path), out.relative_to(tmp_path)]
