"""The paper's Table 3 sweep as a user runs it: one local Hydra multirun over rows and seeds
(nmt-train -m), each row evaluated the paper's way, a second sweep that redoes nothing, and
nmt-table's Table 3 section and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_MODEL

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

BIN = Path(sys.executable).parent


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / script), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_local_sweep_trains_evaluates_skips_done_rows_and_tabulates(tmp_path, synthetic_corpus):
    """nmt-train -m over three rows and two base seeds on the synthetic corpus: each row in its
    own run folder, evaluated on the dev set from its last checkpoint; a second sweep redoes
    nothing; nmt-table writes the Table 3 section and the plot."""
    common = ["experiment=table3_proxy", *synthetic_corpus.overrides, *TINY_MODEL,
              "trainer.max_steps=4", "trainer.max_tokens=256", "decode.max_len_b=5",
              "decode.max_len_a=0.5"]
    _run("nmt-train", ["-m", *common, "table3=base", "trainer.seed=1,2"], tmp_path)
    _run("nmt-train", ["-m", *common, "table3=A_h1,D_ls0"], tmp_path)
    root = tmp_path / "runs" / "table3_proxy" / "table3"
    assert sorted(p.name for p in root.iterdir()) == ["A_h1_seed1", "D_ls0_seed1", "base_seed1",
                                                       "base_seed2"]
    results = {p.name: json.loads((p / "results.json").read_text()) for p in root.iterdir()}
    for name, r in results.items():
        assert list(r["test_sets"]) == ["valid"], name  # the development set only
        assert r["checkpoint"].endswith("checkpoint_4.pt") and r["checkpoints_averaged"] is None
        assert r["steps"] == 4 and r["train_summary"]["valid"]["ppl"] > 1
        assert r["test_sets"]["valid"]["reference"].endswith("ref/valid.de")
    assert results["A_h1_seed1"]["model"]["config"]["heads"] == 1
    assert results["A_h1_seed1"]["table3"] == {"variant": "A_h1", "seed": 1}
    assert results["base_seed2"]["table3_row"] == "base"
    assert results["D_ls0_seed1"]["trainer"]["label_smoothing"] == 0.0
    # The two seeds are two different models.
    assert (results["base_seed1"]["train_summary"]["valid"]["loss"]
            != results["base_seed2"]["train_summary"]["valid"]["loss"])

    stamps = {p.name: (p / "results.json").stat().st_mtime_ns for p in root.iterdir()}
    again = _run("nmt-train", ["-m", *common, "table3=A_h1,D_ls0"], tmp_path)
    assert "already finished" in again.stdout + again.stderr
    assert "is current; not evaluated again" in again.stdout + again.stderr
    assert stamps == {p.name: (p / "results.json").stat().st_mtime_ns for p in root.iterdir()}

    out, plot = tmp_path / "table3.md", tmp_path / "table3.png"
    _run("nmt-table", ["table.tables=[table3]",
                       f"table.results_glob={tmp_path}/runs/**/results.json",
                       f"table.output={out}", f"table.table3_plot={plot}"], tmp_path)
    text = out.read_text()
    assert "## Table 3" in text and "## Table 2" not in text and "## Other runs" not in text
    assert "### table3_proxy (dev set: valid; seed noise of the base row: ±" in text
    base = next(line for line in text.splitlines() if line.startswith("| base |"))
    assert "| 2 |" in base and "0 (base)" in base and " ± " in base
    h1 = next(line for line in text.splitlines() if line.startswith("| A | h=1"))
    assert "| 5.29 |" in h1 and "| 24.9 |" in h1 and "| -0.9 |" in h1  # the paper's PPL, BLEU, Δ
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
