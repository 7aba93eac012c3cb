"""A local Table 3 sweep that cannot go on stops whole and says what never ran: Ctrl-C during a
row ends the sweep (exit 130) with that row short, marked so and kept out of Δ, and the next
sweep resumes it; a row that does not apply to the experiment names the rows after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY_MODEL

from transformer_nmt.evaluate.report import build_report, load_results

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
STEPS = 500


def _common(corpus) -> list[str]:
    return ["experiment=table3_proxy", *corpus.overrides, *TINY_MODEL,
            f"trainer.max_steps={STEPS}", "trainer.max_tokens=256", "trainer.log_every_steps=1",
            "decode.max_len_b=5", "decode.max_len_a=0.5"]


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "nmt-train"), "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=400, check=False, env=ENV)


def _table(root: Path) -> str:
    return build_report(load_results(f"{root}/runs/**/results.json"), ["table3"])


def _row(text: str, start: str) -> str:
    [line] = [x for x in text.splitlines() if x.startswith(start)]
    return line


def test_ctrl_c_stops_the_sweep_and_the_short_row_is_marked_then_resumed(tmp_path,
                                                                         synthetic_corpus):
    common = _common(synthetic_corpus)
    done = _train([*common, "table3=A_h1"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "runs" / "table3_proxy" / "table3"

    # Ctrl-C while the first row of three trains
    proc = subprocess.Popen([str(BIN / "nmt-train"), "-m", *common, "table3=base,D_ls0,C_dff1024"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    metrics = root / "base_seed1" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and '"train"' in metrics.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the base row never started training"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: SIGINT stopped base at step "), last
    assert last.endswith(f" of {STEPS} (evaluated, its results.json marked short; the next sweep "
                         "resumes it from its last checkpoint); rows not run: D_ls0, C_dff1024")
    assert sorted(p.name for p in root.iterdir()) == ["A_h1_seed1", "base_seed1"]  # none started

    result = json.loads((root / "base_seed1" / "results.json").read_text())
    short = result["stopped_short"]
    assert short["stopped_by"] == "signal SIGINT" and short["max_steps"] == STEPS
    assert 0 < short["steps"] < STEPS and result["steps"] == short["steps"]
    text = _table(tmp_path)
    base = _row(text, "| base |")
    assert f"short: {short['steps']:,} of {STEPS} steps (signal SIGINT)" in base
    assert "| 0 (base) | 0 (base) |" not in base
    h1 = _row(text, "| A | h=1")
    assert "| – | -0.9 |" in h1  # no Δ against the short row
    assert "No base row trained to its step target: no Δ." in text

    # the next sweep resumes the short row to its step target instead of skipping it
    again = _train([*common, "table3=base"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resum" in (again.stdout + again.stderr).lower()
    result = json.loads((root / "base_seed1" / "results.json").read_text())
    assert result["stopped_short"] is None and result["steps"] == STEPS
    text = _table(tmp_path)
    assert "short:" not in _row(text, "| base |") and "| 0 (base) | 0 (base) |" in text
    assert "| – | -0.9 |" not in _row(text, "| A | h=1")


def test_a_row_that_cannot_be_built_names_the_rows_not_run(tmp_path, synthetic_corpus):
    """With one encoder and decoder layer, C_N2 (N x 1/3) is no whole number of layers: the
    sweep stops there with one line naming the rows after it, and none of them starts."""
    proc = _train([*_common(synthetic_corpus), "table3=C_N2,D_ls0,A_h1"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: table3=C_N2: encoder_layers 1 x ")
    assert line.endswith("; rows not run: D_ls0, A_h1")
    root = tmp_path / "runs" / "table3_proxy" / "table3"
    assert not root.exists() or not any(p.name.startswith(("D_ls0", "A_h1"))
                                        for p in root.iterdir())
