"""A failed write is one line by its cause (ENOSPC, EDQUOT, EFBIG, EROFS), whatever the
library's wording, and the earlier file stays as it was: checkpoint save, nmt-average,
nmt-translate (a file, /dev/full, standard output on /dev/full) and nmt-prepare.

EFBIG comes from a real file-size limit (``RLIMIT_FSIZE`` in a child process), ENOSPC from
/dev/full; torch's wordings and the other errnos are simulated."""

from __future__ import annotations

import errno
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from transformer_nmt import fileio
from transformer_nmt.checkpoint import load_checkpoint, save_checkpoint
from transformer_nmt.errors import NoSpaceError, WriteError


def _limit_file_size(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _cli(module: str, *args: str, limit: int | None = None, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          stderr=subprocess.PIPE, text=True, timeout=300, check=False,
                          preexec_fn=_limit_file_size(limit) if limit else None, **kw)


def _one_error_line(proc: subprocess.CompletedProcess, text: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {text}"


def test_file_size_limit_during_a_checkpoint_save_keeps_the_previous_one(tmp_path):
    path = tmp_path / "checkpoint_best.pt"
    save_checkpoint(path, {"step": 1})
    before = path.read_bytes()
    code = ("import sys, torch; from transformer_nmt.checkpoint import save_checkpoint\n"
            "save_checkpoint(sys.argv[1], {'step': 2, 'w': torch.zeros(100_000)})\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=False,
                          preexec_fn=_limit_file_size(20_000))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("transformer_nmt.errors.WriteError: file too large for the file-size limit "
                    f"of 20,000 bytes (ulimit -f): {path}")
    assert path.read_bytes() == before and load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("wording", [
    "basic_ios::clear: iostream error",
    "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598",
    "PytorchStreamWriter failed writing file data/0: file write failed"])
def test_torch_wordings_of_a_full_disk_are_one_error(tmp_path, monkeypatch, wording):
    path = tmp_path / "averaged.pt"
    save_checkpoint(path, {"step": 1})
    before = path.read_bytes()

    def torch_full(obj, f, *a, **k):
        Path(f).write_bytes(b"PK\x03\x04 partial")
        raise RuntimeError(wording)

    monkeypatch.setattr(torch, "save", torch_full)
    monkeypatch.setattr(fileio.shutil, "disk_usage", lambda p: SimpleNamespace(free=4096))
    with pytest.raises(NoSpaceError, match=f"^no space left on device: {path}$"):
        save_checkpoint(path, {"step": 2})
    # the same wording with room on the device and no size limit is not a full disk
    monkeypatch.setattr(fileio.shutil, "disk_usage", lambda p: SimpleNamespace(free=1 << 40))
    with pytest.raises(RuntimeError, match="^" + wording.replace("[", r"\[").replace(".", r"\.")):
        save_checkpoint(path, {"step": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(("code", "words"), [
    (errno.EROFS, "read-only file system"),
    (errno.EDQUOT, "disk quota exceeded"),
    (errno.ENOSPC, "no space left on device"),
])
def test_every_cause_is_one_error_naming_the_file(tmp_path, monkeypatch, code, words):
    from transformer_nmt.cli import _UserExit, user_errors

    path = tmp_path / "out.txt"
    path.write_text("old\n")
    real_replace = os.replace

    def failing(src, dst):
        raise OSError(code, os.strerror(code), str(dst))

    monkeypatch.setattr(fileio.os, "replace", failing)
    with pytest.raises(WriteError, match=f"^{words}: {path}$"), fileio.atomic_write(path) as f:
        f.write("new\n")
    monkeypatch.setattr(fileio.os, "replace", real_replace)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    # an OSError of that errno raised anywhere else in a command is one line too
    with pytest.raises(_UserExit, match=f"^{words}: {path}$"), user_errors():
        raise OSError(code, os.strerror(code), str(path))
    with pytest.raises(OSError, match="Input/output error"), user_errors():
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))


@pytest.fixture
def run(workspace, tokenizer, tmp_path):
    """Two checkpoints of a tiny model in ``<tmp>/run/checkpoints`` and an ``averaged.pt``
    beside them: ``(overrides, checkpoints, averaged)``."""
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    from transformer_nmt.checkpoint import average_run
    from transformer_nmt.config import compose

    root, cfg = workspace
    folder = tmp_path / "run" / "checkpoints"
    ckpts = [folder / f"checkpoint_{s}.pt" for s in (150, 300)]
    for seed, path in enumerate(ckpts):
        write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=seed), cfg,
                         150 * (seed + 1))
    overrides = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
                 "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6",
                 *DECODE_MODEL, f"average.checkpoints=[{ckpts[0]}]"]
    averaged = average_run(compose(overrides))
    return overrides[:-1], ckpts, averaged


def test_file_size_limit_in_nmt_average_is_one_line(run):
    overrides, ckpts, averaged = run
    before = averaged.read_bytes()
    limit = len(before) // 2
    proc = _cli("average", *overrides, f"average.checkpoints=[{ckpts[0]},{ckpts[1]}]", limit=limit)
    _one_error_line(proc, f"file too large for the file-size limit of {limit:,} bytes "
                          f"(ulimit -f): {averaged}")
    assert averaged.read_bytes() == before
    assert not [p for p in averaged.parent.iterdir() if p.name.endswith(".tmp")]


def test_nmt_translate_on_a_full_device_is_one_line(run, tmp_path):
    overrides, _, _ = run
    source = tmp_path / "in.en"
    source.write_text("A dog runs.\nTwo people sit.\n")
    args = [*overrides, f"translate.input={source}"]
    with open("/dev/full", "w") as full:  # nmt-translate ... > /dev/full
        proc = _cli("translate", *args, stdout=full)
    _one_error_line(proc, "no space left on device: <standard output>")
    proc = _cli("translate", *args, "translate.output=/dev/full")
    _one_error_line(proc, "no space left on device: /dev/full")
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    # a file-size limit below the translations (above Hydra's files): the earlier ones stay
    from helpers import sentences

    source.write_text("\n".join(sentences(2000, 3)) + "\n")
    out = tmp_path / "out.de"
    out.write_text("earlier\n" * 40)
    proc = _cli("translate", *args, f"translate.output={out}", limit=20_000)
    _one_error_line(proc, "file too large for the file-size limit of 20,000 bytes "
                          f"(ulimit -f): {out}")
    assert out.read_text() == "earlier\n" * 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "out.de", "run"]


def test_file_size_limit_in_nmt_prepare_is_one_line(tmp_path):
    from conftest import SYNTHETIC_VOCAB, write_reversal_corpus

    files = write_reversal_corpus(tmp_path / "text")
    overrides = [
        "data=custom", "data.name=reverse", "data.src_lang=en", "data.tgt_lang=de",
        f"data.root={tmp_path / 'data'}", f"data.vocab_size={SYNTHETIC_VOCAB}",
        "data.num_workers=1", "data.valid_split=valid", "data.test_splits=[test]",
        *(f"+data.custom_files.{split}={files / split}" for split in ("train", "valid", "test")),
    ]
    limit = 20_000  # below the training text, above every file Hydra writes
    proc = _cli("prepare", *overrides, limit=limit)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: file too large for the file-size limit of {limit:,} bytes "
                           f"(ulimit -f): {tmp_path / 'data'}"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    leftovers = [p for p in (tmp_path / "data").rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers


def test_file_size_limit_in_nmt_export_is_one_line_naming_the_folder(run):
    """safetensors hides the errno in its own error's text (``Os { code: 27, ... }``): the
    Hugging Face export under a file-size limit below its weights is one line, no folder
    left."""
    overrides, _, _ = run
    out = Path(overrides[1].split("=", 1)[1]) / "export" / "hf"
    limit = 20_000  # below model.safetensors, above Hydra's files
    proc = _cli("export", *overrides, limit=limit)
    _one_error_line(proc, f"file too large for the file-size limit of {limit:,} bytes "
                          f"(ulimit -f): {out}")
    assert not out.parent.exists() or not list(out.parent.iterdir())  # no temporary folder


@pytest.mark.parametrize("message", [
    "Error while serializing: I/O error: No space left on device (os error 28)",
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
    'left on device" })'], ids=["safetensors_0_8", "rust_debug"])
def test_safetensors_wording_of_a_full_disk_is_one_error(tmp_path, message):
    """The errno safetensors writes into its message (Rust's ``std::io::Error``) is the
    cause, as an OSError's errno is."""
    pytest.importorskip("safetensors")
    from safetensors import SafetensorError

    error = fileio.write_error(SafetensorError(message), tmp_path / "hf")
    assert isinstance(error, NoSpaceError)
    assert str(error) == f"no space left on device: {tmp_path / 'hf'}"
    other = SafetensorError("Error while serializing: I/O error: Input/output error (os error 5)")
    assert fileio.write_error(other, tmp_path / "hf") is None


def test_file_size_limit_while_hydra_writes_its_config_files_is_one_line(tmp_path):
    """Hydra writes ``.hydra/<job>/config.yaml`` before the command starts; a file-size
    limit below it is one line naming that file, and no run folder is left."""
    run_dir = tmp_path / "run"
    limit = 1_000
    proc = _cli("average", f"run_dir={run_dir}", limit=limit, cwd=tmp_path)
    _one_error_line(proc, f"file too large for the file-size limit of {limit:,} bytes "
                          f"(ulimit -f): {run_dir / '.hydra' / 'average' / 'config.yaml'}")
    assert not run_dir.exists()
