"""nmt-plot as a user runs it: every figure of a tiny run folder from one command, and a user's
mistake as one error line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from unit.plot.test_figures import make_run, png_size

from transformer_nmt.evaluate import checkpoint_bleu as ebleu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The plot tests' tiny run folder (tests/unit/plot/test_figures.py)."""
    return make_run(tmp_path_factory.mktemp("plotrun"))


def test_nmt_plot_command(run, tmp_path):
    cfg, _ = run
    run_dir = Path(cfg.run_dir)
    base = [f"data.root={cfg.data.root}", f"run_dir={run_dir}", "decode.beam_size=2",
            "decode.max_len_b=6", "decode.device=cpu"]
    done = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.plot", *base,
         "plot.sentence=A dog runs in the park.", "plot.layer=1"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    plots = run_dir / "plots"
    for name in ("curves.png", "checkpoint_bleu.png", "attention_encoder_layer1.png",
                 "attention_cross_layer2.png"):
        w, h = png_size(plots / name)
        assert w > 200 and h > 200
    assert (plots / ebleu.BLEU_CACHE_NAME).is_file()
    assert "valid BLEU" in done.stdout and "translation:" in done.stdout
    assert not list(plots.glob(".*.tmp"))  # temporary files renamed away

    # A user's mistake: one error line, exit status 2, no traceback.
    done = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.plot", *base, "plot.kinds=[attention]"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [(
        'error: plot.kinds has attention but plot.sentence is unset '
        '(plot.sentence="A man rides a bike.")')]
