"""scripts/bench/sweep.py: every variant trained, averaged and scored once; a finished
variant is skipped; the best on the selection split is marked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench" / "sweep.py"


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))


def test_a_bad_sweep_file_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: smoke\nsplits: [valid]\nselect_on: test\nvariants: {a: []}\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], cwd=tmp_path,
                       capture_output=True, text=True, env=_env(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {bad}: select_on='test' is not one of the splits ['valid']"]


def test_variants_run_once_and_the_best_on_valid_is_marked(tmp_path, multi30k_mirror):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(
        "experiment: smoke\n"
        "splits: [valid, test_2016_flickr]\n"
        "select_on: valid\n"
        "variants:\n"
        "  few: [trainer.max_steps=4]\n"
        "  more: [trainer.max_steps=40]\n")
    env = dict(_env(tmp_path), NMT_MULTI30K_MIRROR=str(multi30k_mirror))
    prep = subprocess.run([str(Path(sys.executable).parent / "nmt-prepare"), "experiment=smoke"],
                          cwd=tmp_path, capture_output=True, text=True, env=env)
    assert prep.returncode == 0, prep.stderr
    cmd = [sys.executable, str(SCRIPT), str(sweep), "--args", "trainer.save_every_steps=4"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "runs" / "sweep_tiny"
    data = json.loads((out / "sweep.json").read_text())["variants"]
    assert list(data) == ["few", "more"]
    assert [data[n]["steps"] for n in data] == [4, 40]
    for n in data:
        results = json.loads((out / n / "results.json").read_text())
        for split in ("valid", "test_2016_flickr"):
            assert data[n]["scores"][split]["sacrebleu"] == pytest.approx(
                results["test_sets"][split]["bleu"]["sacrebleu"]["score"])
    best = max(data, key=lambda n: data[n]["scores"]["valid"]["sacrebleu"])
    table = (out / "results.md").read_text()
    assert f"| **{best}** |" in table and f"Best on valid (sacreBLEU): **{best}**" in table
    # a second call finds both variants done: no stage runs again
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "+ " not in again.stdout


FAKE_STAGE = '''#!{python}
"""A stand-in for an nmt-* console script: logs its call and writes what the sweep reads."""
import json, os, signal, sys, time
from pathlib import Path
stage = Path(sys.argv[0]).name
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(stage + " " + " ".join(sys.argv[1:]) + "\\n")
run = Path(args["run_dir"])
steps = int(args.get("trainer.max_steps", 10))
if stage == "nmt-train":
    run.mkdir(parents=True, exist_ok=True)
    (run / "train_summary.json").write_text(json.dumps(
        {{"steps": steps, "stopped_by": "max_steps", "train_seconds": 60.0, "device": "cpu"}}))
if stage == "nmt-evaluate":
    if os.environ.get("FAKE_EVAL_HANGS"):  # an evaluation that goes on after one Ctrl-C
        signal.signal(signal.SIGINT, lambda *_: None)
        Path(os.environ["FAKE_EVAL_HANGS"]).touch()
        time.sleep(60)
    score = {{"score": float(steps), "label": "l", "signature": "s"}}
    tests = {{s: {{"bleu": {{"sacrebleu": score}}, "chrf": score}}
             for s in args["data.test_splits"].strip("[]").split(",")}}
    (run / "results.json").write_text(json.dumps({{"test_sets": tests}}))
'''


def _fake_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "fake_bin"
    folder.mkdir()
    for stage in ("nmt-prepare", "nmt-train", "nmt-average", "nmt-evaluate"):
        (folder / stage).write_text(FAKE_STAGE.format(python=sys.executable))
        (folder / stage).chmod(0o755)
    return folder


def _sweep(tmp_path: Path, text: str, *args: str, env: dict | None = None,
           **kwargs) -> subprocess.CompletedProcess:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(text)
    env = dict(_env(tmp_path), FAKE_LOG=str(tmp_path / "calls.log"), **(env or {}))
    return subprocess.run([sys.executable, str(SCRIPT), str(sweep), "--bin",
                           str(tmp_path / "fake_bin"), *args], cwd=tmp_path,
                          capture_output=True, text=True, env=env, **kwargs)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_an_unknown_key_or_a_yaml_error_is_one_line_naming_it(tmp_path):
    r = _sweep(tmp_path, "experiment: smoke\nsplits: [valid]\nselect-on: valid\n"
                         "variants: {a: []}\n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}: unknown key 'select-on'; a sweep file's keys are "
        "experiment, splits, select_on, variants"]
    r = _sweep(tmp_path, "experiment: smoke\nsplits: [valid]\nvariants:\n  a: [x=1\n  b: []\n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}, line 5, column 4: not valid YAML: expected ',' or ']', "
        "but got ':'"]


def test_every_variant_is_checked_before_anything_runs(tmp_path):
    _fake_bin(tmp_path)
    r = _sweep(tmp_path, "experiment: smoke\nsplits: [valid]\n"
                         "variants: {good: [], typo: [trainer.max_stepz=3]}\n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}: variant 'typo': Could not override "
        "'trainer.max_stepz'. Key 'max_stepz' not in 'TrainerConfig' (did you mean "
        "trainer.max_steps?) (nothing was run)"]
    r = _sweep(tmp_path, "experiment: no_such_experiment\nsplits: [valid]\nvariants: {a: []}\n")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "variant 'a': " in r.stderr and "no_such_experiment" in r.stderr
    assert _calls(tmp_path) == [] and not (tmp_path / "runs").exists()


def test_an_edited_variant_is_shown_stale_then_trained_again_never_mixed(tmp_path):
    _fake_bin(tmp_path)
    head = "experiment: smoke\nsplits: [valid]\nvariants:\n"
    r = _sweep(tmp_path, head + "  a: [trainer.max_steps=9]\n  b: [trainer.max_steps=4]\n")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "runs" / "sweep_s"
    assert "| **a** | `trainer.max_steps=9` | 9 |" in (out / "results.md").read_text()
    # a edited to fewer steps; only b runs: a keeps the overrides it was trained with, stale,
    # and is not the best.
    edited = head + "  a: [trainer.max_steps=2]\n  b: [trainer.max_steps=4]\n"
    r = _sweep(tmp_path, edited, "--only", "b")
    assert r.returncode == 0, r.stderr
    table = (out / "results.md").read_text()
    assert ("| a (stale: the sweep file now gives other overrides; run it again) | "
            "`trainer.max_steps=9` | 9 |") in table
    assert "| **b** | `trainer.max_steps=4` | 4 |" in table
    assert "Best on valid (sacreBLEU): **b**" in table
    # a run now: its old folder is set aside and it is trained again from the start.
    calls = len(_calls(tmp_path))
    r = _sweep(tmp_path, edited, "--only", "a")
    assert r.returncode == 0, r.stderr
    assert (out / "a.stale-1" / "train_summary.json").exists()
    assert "sweep: runs/sweep_s/a was trained with other overrides (experiment=smoke " in r.stderr
    assert [c.split()[0] for c in _calls(tmp_path)[calls:]] == [
        "nmt-prepare", "nmt-train", "nmt-average", "nmt-evaluate"]
    table = (out / "results.md").read_text()
    assert "| a | `trainer.max_steps=2` | 2 |" in table and "stale" not in table


def test_a_second_ctrl_c_during_evaluation_exits_at_once_with_130(tmp_path):
    import signal
    import time

    _fake_bin(tmp_path)
    started = tmp_path / "evaluating"
    sweep = tmp_path / "s.yaml"
    sweep.write_text("experiment: smoke\nsplits: [valid]\nvariants: {a: []}\n")
    env = dict(_env(tmp_path), FAKE_LOG=str(tmp_path / "calls.log"),
               FAKE_EVAL_HANGS=str(started))
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(sweep), "--bin",
                             str(tmp_path / "fake_bin")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: Ctrl-C reaches it all
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists()
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None  # the first waits for the evaluation
        os.killpg(proc.pid, signal.SIGINT)
        t = time.monotonic()
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - t < 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-2:] == [
        "sweep: interrupted: waiting for nmt-evaluate to stop (press Ctrl-C again to exit at "
        "once)",
        "sweep: interrupted again: stopping nmt-evaluate and exiting now"]
    assert "Traceback" not in err
