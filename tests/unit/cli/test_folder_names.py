"""Names and run folders that cannot be folders: one ``error:`` line before anything is
written (docs/reliability.md, "User errors on the command line")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_nmt.cli import preflight_config

RULE = "give a name that is not empty, holds no '/', is not . or .. and has at most 255 bytes"
LONG = "x" * 300


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("module", "override", "message"), [
    ("train", "name=", "name='' is not a folder name (it is empty): the run's folder is "
                       "runs/<name>"),
    ("table", "name=..", "name='..' is not a folder name (.. is the folder above): the run's "
                         "folder is runs/<name>"),
    ("prepare", "data.name=", "data.name='' is not a folder name (it is empty): the corpus's "
                              "folders are <data.root>/raw/<data.name>, spm/<data.name> and "
                              "bin/<data.name>"),
])
def test_empty_and_dot_names_are_one_line_and_write_nothing(tmp_path, module, override,
                                                            message):
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    (project / "data").mkdir()
    before = _tree(tmp_path)
    r = _cli(module, override, cwd=project)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"error: invalid configuration: {message}; {RULE}"]
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(("override", "message"), [
    ("name=.", "name='.' is not a folder name (. is the folder itself)"),
    ("name=a/b", "name='a/b' is not a folder name (it holds a '/')"),
    ("data.name=..", "data.name='..' is not a folder name (.. is the folder above)"),
    (f"name={LONG}", "name='xxxxxxxxxxxxxxxx...xxxxxxxx' is not a folder name (300 bytes, more "
                     "than the 255 a file system takes)"),
    (f"data.name={LONG}", "data.name='xxxxxxxxxxxxxxxx...xxxxxxxx' is not a folder name (300 "
                          "bytes, more than the 255 a file system takes)"),
])
def test_names_that_are_not_folder_names_are_refused(tmp_path, monkeypatch, override, message):
    monkeypatch.chdir(tmp_path)
    cfg, run_dir, error = preflight_config([override])
    assert cfg is None and run_dir is None
    assert error.startswith(f"invalid configuration: {message}: ")
    assert error.endswith(RULE) and "\n" not in error
    assert _tree(tmp_path) == []


def test_a_300_character_name_is_one_line_in_nmt_table(tmp_path):
    r = _cli("table", f"name={LONG}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: invalid configuration: name='xxxxxxxxxxxxxxxx...xxxxxxxx' is not a folder name "
        "(300 bytes, more than the 255 a file system takes): the run's folder is runs/<name>; "
        + RULE]
    assert _tree(tmp_path) == []


def _run_dirs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """run_dir= values that cannot be a run folder, and the line each gets."""
    (tmp_path / "afile").write_text("a file\n")
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    os.symlink("nowhere/runs", tmp_path / "dangling")
    advice = "give the run another run_dir="
    long = f"runs/{LONG}"
    shown = f"{long[:60]}...{long[-40:]}"
    return {
        "under_a_file": ("afile/run", f"run_dir=afile/run: afile is a file, not a folder; "
                                      f"{advice}"),
        "loop": ("loop1", f"run_dir=loop1 is a symlink loop (it never reaches a folder); {advice}"),
        "under_a_loop": ("loop1/run", "run_dir=loop1/run: loop1 is a symlink loop (it never "
                                      f"reaches a folder); {advice}"),
        "dangling": ("dangling", "run_dir=dangling is a symlink to nowhere/runs, which does not "
                                 f"exist; create nowhere/runs or {advice}"),
        "long": (long, f"run_dir={shown} is too long for the file system (File name too long: "
                       f"a folder name of 300 bytes, more than 255); {advice}"),
    }


@pytest.mark.parametrize("case", ["under_a_file", "loop", "under_a_loop", "dangling", "long"])
def test_run_dirs_hydra_cannot_create_are_one_line(tmp_path, monkeypatch, case):
    run_dir, message = _run_dirs(tmp_path)[case]
    before = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert preflight_config([f"run_dir={run_dir}"]) == (None, None, message)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(("module", "case"), [("table", "long"), ("train", "under_a_file"),
                                              ("evaluate", "loop"), ("translate", "dangling")])
def test_run_dir_problems_are_one_line_in_every_command(tmp_path, module, case):
    run_dir, message = _run_dirs(tmp_path)[case]
    before = _tree(tmp_path)
    r = _cli(module, f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: {message}"]
    assert _tree(tmp_path) == before
