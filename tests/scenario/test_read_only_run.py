"""A published model on a read-only folder: ``nmt-translate`` decodes with it and writes
nothing there (no ``.hydra`` files, no log file; the log goes to standard error), and every
command that writes into the run folder stops with one line before Hydra starts.

The tests run as root, whom file modes do not stop, so the folder is made read-only by a
read-only bind mount in a mount namespace of its own (``unshare -m``) where the machine
allows one, and else, as everywhere, by ``os.access`` answering that the folder cannot be
written (then any file written would show)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DECODE_MODEL, new_model, write_checkpoint

SIMULATE = (
    "import os, runpy, sys\n"
    "folder = os.path.abspath(sys.argv.pop(1))\n"
    "module = sys.argv.pop(1)\n"
    "real = os.access\n"
    "def access(path, mode, *args, **kwargs):\n"
    "    path = os.path.abspath(path)\n"
    "    if mode & os.W_OK and (path == folder or path.startswith(folder + os.sep)):\n"
    "        return False\n"
    "    return real(path, mode, *args, **kwargs)\n"
    "os.access = access\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def _mount_namespace() -> bool:
    """Whether ``unshare -m`` and a read-only bind mount work here."""
    if shutil.which("unshare") is None:
        return False
    proc = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind -o ro / / 2>/dev/null"],
                          capture_output=True, timeout=30, check=False)
    return proc.returncode == 0


MODES = [pytest.param("access", id="access"),
         pytest.param("mount", id="mount", marks=pytest.mark.skipif(
             not _mount_namespace(), reason="no mount namespace here"))]


def _command(mode: str, folder: Path, module: str, args: list[str]) -> list[str]:
    if mode == "access":
        return [sys.executable, "-c", SIMULATE, str(folder), f"transformer_nmt.cli.{module}",
                *args]
    return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
            str(folder), sys.executable, "-m", f"transformer_nmt.cli.{module}", *args]


def _run(mode, folder, module, args, cwd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(_command(mode, folder, module, args), cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)


@pytest.fixture
def published(workspace, tokenizer, tmp_path):
    """A run folder holding only ``checkpoints/averaged.pt``: ``(folder, overrides)``."""
    root, cfg = workspace
    run = tmp_path / "published" / "run"
    write_checkpoint(run / "checkpoints" / "averaged.pt",
                     new_model(cfg, tokenizer.vocab_size, seed=1), cfg, 1)
    overrides = [f"data.root={root / 'data'}", "name=tiny", "data.vocab_size=60",
                 "decode.beam_size=2", "decode.max_len_b=6", "decode.device=cpu", *DECODE_MODEL]
    return run, overrides


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("mode", MODES)
def test_translate_with_a_read_only_run_folder_writes_nothing_there(mode, published, tmp_path):
    run, overrides = published
    folder = run.parent
    before = _files(folder)
    # the run folder itself, and a checkpoint on the read-only folder named by decode.checkpoint
    # with a run_dir that does not exist there yet
    for args in ([f"run_dir={run}"],
                 [f"run_dir={folder / 'other'}",
                  f"decode.checkpoint={run / 'checkpoints' / 'averaged.pt'}"]):
        proc = _run(mode, folder, "translate", [*overrides, *args], tmp_path,
                    input="A dog runs.\nTwo people sit.\n")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(proc.stdout.splitlines()) == 2
        assert "Traceback" not in proc.stderr and "decoding with" in proc.stderr
        assert _files(folder) == before  # no .hydra, no translate.log, no folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["published"]
    # translations asked for inside it: one line, before the model is loaded
    out = run / "out.de"
    proc = _run(mode, folder, "translate", [*overrides, f"run_dir={run}",
                                            f"translate.output={out}"], tmp_path, input="A.\n")
    why = "a read-only file system" if mode == "mount" else "no write permission"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        f"error: translate.output={out} is inside the run folder {run}, which cannot be "
        f"written ({why}); write the translations elsewhere")
    assert "decoding with" not in proc.stderr and _files(folder) == before


@pytest.mark.parametrize("module, command", [
    ("average", "nmt-average"), ("evaluate", "nmt-evaluate"), ("export", "nmt-export"),
    ("train", "nmt-train")])
@pytest.mark.parametrize("mode", MODES)
def test_writers_into_a_read_only_run_folder_are_one_line(mode, module, command, published,
                                                          tmp_path):
    run, overrides = published
    before = _files(run.parent)
    proc = _run(mode, run.parent, module, [*overrides, f"run_dir={run}"], tmp_path)
    why = "a read-only file system" if mode == "mount" else "no write permission"
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr[-3000:]
    assert proc.stderr == (
        f"error: the run folder {run} is read-only ({why}): {command} writes into it; copy the "
        "run to a writable folder and give that as run_dir=\n")
    assert _files(run.parent) == before
