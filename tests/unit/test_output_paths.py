"""Where user-named outputs go: through symlinks, FIFOs and devices (never replacing them), and
never over the input, a model file or a run's checkpoints (translate.output, table.output)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from transformer_nmt.config import compose
from transformer_nmt.errors import UserError


def _read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as f:
            into.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_write_output_writes_through_a_symlink_and_keeps_the_link(tmp_path):
    from transformer_nmt.fileio import write_output

    target = tmp_path / "real.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with write_output(link) as f:
        f.write("new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_write_output_writes_into_a_fifo_and_leaves_it_a_fifo(tmp_path):
    from transformer_nmt.fileio import write_output

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    with write_output(fifo) as f:
        f.write("eins\nzwei\n")
    reader.join(timeout=30)
    assert got == [b"eins\nzwei\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file beside it


def test_write_output_to_a_device_leaves_the_device(tmp_path):
    from transformer_nmt.fileio import write_output

    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    with write_output(link) as f:
        f.write("nothing\n")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode) and link.is_symlink()
    with write_output(os.devnull) as f:
        f.write("nothing\n")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


@pytest.fixture
def translate_run(workspace, tokenizer, tmp_path):
    """A tiny model's checkpoint in a run's checkpoints/ folder and one line of input:
    ``(overrides, checkpoint, source)``."""
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    root, cfg = workspace
    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint_1.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, seed=1), cfg, 1)
    source = tmp_path / "in.en"
    source.write_text("A dog runs.\nTwo people sit.\n")
    overrides = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
                 "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6",
                 *DECODE_MODEL, f"decode.checkpoint={ckpt}", f"translate.input={source}"]
    return overrides, ckpt, source


def test_translate_output_through_a_symlink_and_into_a_fifo(translate_run, tmp_path):
    from transformer_nmt.decode.translate import translate

    overrides, _, _ = translate_run
    target = tmp_path / "target.de"
    target.write_text("old\n")
    link = tmp_path / "out.de"
    link.symlink_to(target)
    translate(compose([*overrides, f"translate.output={link}"]))
    assert link.is_symlink() and len(target.read_text().splitlines()) == 2

    fifo = tmp_path / "fifo.de"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    translate(compose([*overrides, f"translate.output={fifo}"]))
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].decode().splitlines() == target.read_text().splitlines()


def test_translate_refuses_an_output_that_is_its_input_or_a_model(translate_run, tmp_path):
    from transformer_nmt.decode.translate import translate
    from transformer_nmt.fileio import spm_model_path

    overrides, ckpt, source = translate_run
    link = tmp_path / "alias.en"
    link.symlink_to(source)
    hard = tmp_path / "hard.en"
    os.link(source, hard)
    other_pt = tmp_path / "other.pt"
    other_pt.write_bytes(b"model bytes")
    pt_link = tmp_path / "innocent.txt"
    pt_link.symlink_to(other_pt)
    spm = spm_model_path(compose(overrides).data)
    cases = {
        source: "is the input file",
        link: "is the input file",
        hard: "is the input file",
        spm: "is the input file",
        ckpt: "would overwrite a model file",
        other_pt: "would overwrite a model file",
        pt_link: "would overwrite a model file",
        ckpt.parent / "notes.txt": "is inside a run's checkpoints/ folder",
    }
    before = {p: p.read_bytes() for p in (source, ckpt, other_pt, spm)}
    for out, why in cases.items():
        with pytest.raises(UserError, match=f"^translate.output={out} {why}"):
            translate(compose([*overrides, f"translate.output={out}"]))
    assert {p: p.read_bytes() for p in before} == before
    assert not (ckpt.parent / "notes.txt").exists() and link.is_symlink()


def test_table_output_refuses_a_results_file_and_writes_through_a_symlink(tmp_path):
    from transformer_nmt.evaluate.report import write_report

    results = tmp_path / "runs" / "a" / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")
    glob = str(tmp_path / "runs" / "**" / "results.json")
    cfg = compose([f"table.results_glob={glob}", f"table.output={results}"])
    with pytest.raises(UserError, match=f"^table.output={results} is the input file"):
        write_report(cfg)
    assert results.read_text() == "{}"
    target = tmp_path / "results.md"
    link = tmp_path / "table.md"
    link.symlink_to(target)
    write_report(compose([f"table.results_glob={glob}", f"table.output={link}"]))
    assert link.is_symlink() and "Table 2" in target.read_text()


def test_only_a_runs_checkpoints_folder_is_refused(tmp_path):
    from transformer_nmt.fileio import check_output

    plain = tmp_path / "checkpoints" / "notes" / "out.de"  # a folder that merely has the name
    plain.parent.mkdir(parents=True)
    assert check_output(plain, "translate.output") == plain
    (tmp_path / ".hydra").mkdir()  # now it is a run's
    with pytest.raises(
            UserError,
            match=f"is inside a run's checkpoints/ folder \\({tmp_path / 'checkpoints'}\\)"):
        check_output(plain, "translate.output")
