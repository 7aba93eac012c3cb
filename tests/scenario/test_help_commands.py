"""``--help`` / ``-h`` of every console script as a user runs it: the chosen experiment's
values with their descriptions on standard output, exit status 0, and no file or folder
written (run in an empty working directory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# job module, arguments, a line of the page that smoke's (or the override's) value and the
# field's description make
CASES = [
    ("prepare", ["experiment=smoke"], "data.max_train_pairs=3000", "Keep only the first N"),
    ("train", ["experiment=smoke"], "trainer.max_steps=60", "Stop after this many"),
    ("average", ["experiment=smoke"], "average.last=3", "Number of most recent"),
    ("evaluate", ["experiment=smoke"], "data.test_splits=[test_2016_flickr]", "Test sets"),
    ("translate", ["experiment=smoke"], "decode.beam_size=2", "Beam width"),
    ("export", ["experiment=smoke"], "run_dir=runs/smoke", "runs/<name>"),
    ("import_model", ["experiment=smoke", "export.source=marian"], "export.source=marian",
     "the Marian-architecture transformers folder"),
    ("table", ["table.output=out.md"], "table.output=out.md", "The file written"),
    ("plot", ["experiment=smoke"], "decode.max_len_b=10", "Maximum output length"),
]


def _run(module: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("module, args, value, description", CASES,
                         ids=[case[0] for case in CASES])
def test_help_prints_the_composed_settings_and_writes_nothing(module, args, value,
                                                              description, tmp_path):
    flag = "-h" if module in ("average", "table") else "--help"
    proc = _run(module, [*args, flag], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    line = next((x for x in proc.stdout.splitlines() if x.startswith(f"  {value} ")), None)
    assert line is not None, proc.stdout
    assert description in line
    assert "--hydra-help" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # no .hydra, no run folder, no outputs/


def test_help_with_a_bad_override_is_one_error_line(tmp_path):
    proc = _run("train", ["trainer.max_stepz=3", "--help"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "did you mean trainer.max_steps?" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, message", [
    ("--hel", "error: unrecognized argument --hel (did you mean --help?)"),
    ("--hydra-h", "error: unrecognized argument --hydra-h (did you mean --hydra-help?)"),
    ("--help=x", "error: argument --help/-h: ignored explicit argument 'x'"),
    ("--cfg=jbo", "error: argument --cfg/-c: invalid choice: 'jbo' (choose from 'job', 'hydra', "
                  "'all')"),
], ids=["abbreviated", "abbreviated_hydra_help", "help_with_a_value", "cfg_bad_choice"])
def test_a_flag_abbreviated_or_given_a_value_is_one_error_line(flag, message, tmp_path):
    proc = _run("table", ["table.output=out.md", flag], tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message + "\n")
    assert list(tmp_path.iterdir()) == []


def test_hydra_help_beside_overrides_prints_hydras_help(tmp_path):
    proc = _run("train", ["experiment=smoke", "trainer.max_stepz=3", "--hydra-help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Hydra (") and "--hydra-help" in proc.stdout
    assert proc.stderr == ""
    assert list(tmp_path.iterdir()) == []
