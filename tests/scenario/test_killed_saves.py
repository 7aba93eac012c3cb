"""Temporary files of a killed checkpoint save or nmt-average are removed when the next save or
average runs in that folder, a live writer's are not; an average is never averaged again with
other checkpoints."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_nmt.checkpoint import average_run, save_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.errors import UserError

_WRITER = """
import sys, time
from pathlib import Path
from transformer_nmt.fileio import atomic_path
with atomic_path(Path(sys.argv[1])) as tmp:
    tmp.write_bytes(b"x" * 4096)
    print(tmp, flush=True)
    time.sleep(120)
"""


def _writer(path: Path) -> tuple[subprocess.Popen, Path]:
    """A process in the middle of an atomic write of ``path``, and its temporary file."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    tmp = Path(proc.stdout.readline().strip())
    assert tmp.is_file() and tmp.parent == path.parent
    return proc, tmp


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def run(workspace, tokenizer, tmp_path):
    """Two step checkpoints of a tiny model in ``<tmp>/run/checkpoints``: ``(overrides, paths)``."""
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    root, cfg = workspace
    folder = tmp_path / "run" / "checkpoints"
    paths = [folder / f"checkpoint_{s}.pt" for s in (150, 300)]
    for seed, path in enumerate(paths):
        write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=seed), cfg,
                         150 * (seed + 1))
    overrides = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
                 "data.vocab_size=60", *DECODE_MODEL]
    return overrides, paths


def test_a_killed_saves_temporary_file_goes_and_a_live_writers_stays(run):
    overrides, paths = run
    folder = paths[0].parent
    killed, dead_tmp = _writer(folder / "checkpoint_450.pt")
    _kill(killed)
    live, live_tmp = _writer(folder / "checkpoint_600.pt")
    try:
        save_checkpoint(folder / "checkpoint_best.pt", {"step": 1})
        assert not dead_tmp.exists()
        assert live_tmp.exists()  # its writer holds the lock: still at work
    finally:
        _kill(live)
    # the writer is gone now; the next nmt-average in the folder removes its file first
    killed_average, average_tmp = _writer(folder / "averaged.pt")
    _kill(killed_average)
    average_run(compose([*overrides, "average.last=2"]))
    assert not live_tmp.exists() and not average_tmp.exists()
    assert sorted(p.name for p in folder.iterdir()) == [
        "averaged.pt", "checkpoint_150.pt", "checkpoint_300.pt", "checkpoint_best.pt"]


def test_averaging_an_average_with_checkpoints_is_refused(run):
    overrides, paths = run
    averaged = average_run(compose([*overrides, "average.last=2"]))
    before = averaged.read_bytes()
    cfg = compose([*overrides, f"average.checkpoints=[{averaged},{paths[1]}]"])
    with pytest.raises(UserError, match=(
            f"^average.checkpoints: {averaged} is itself an average of 2 checkpoints "
            r"\(checkpoint_150.pt, checkpoint_300.pt\); averaging it with other files weighs "
            "those unequally: list the step checkpoints themselves$")):
        average_run(cfg)
    assert averaged.read_bytes() == before
