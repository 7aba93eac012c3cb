"""scripts/bench/sweep.py: every variant trained, averaged and scored once; a finished
variant is skipped; the best on the selection split is marked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
