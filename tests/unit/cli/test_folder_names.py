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
