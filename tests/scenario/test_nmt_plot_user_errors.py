"""``nmt-plot`` goes through the same harness as every console script (docs/reliability.md,
"Every console script through one harness"): a bad override or value is one ``error:`` line,
exit status 2, and no run folder, ``.hydra`` folder or log is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _plot(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer_nmt.cli.plot", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def test_nmt_plot_bad_value_is_one_line_and_leaves_no_run_folder(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    r = _plot("plot.format=jpg", f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "error: Error merging override plot.format=jpg: Invalid value 'jpg', expected one of "
        "[png, svg]"]
    assert not (tmp_path / "runs").exists()


def test_nmt_plot_misspelt_key_is_one_line_with_the_closest_key(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    r = _plot("plot.kindz=[curves]", f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "error: Could not override 'plot.kindz'. Key 'kindz' not in 'PlotConfig' "
        "(did you mean plot.kinds?)"]
    assert not (tmp_path / "runs").exists()
