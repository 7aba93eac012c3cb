"""What the make targets that measure write: their outputs go under runs/, never over the
committed pages in docs/, unless a variable asks for that (the committed docs/table3_proxy.md
is rebuilt with ``make table3-proxy TABLE3_PROXY_OUT=docs/table3_proxy``)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import gpu_check  # noqa: E402  (found on the sys.path entry above)

DOCS_PATH = re.compile(r"(?<![\w.-])(docs/[\w./-]*)")


def _dry_run(target: str, tmp_path: Path, *variables: str) -> str:
    stamp = tmp_path / "installed"  # newer than pyproject.toml: no install step is planned
    stamp.touch()
    # not a sub-make of `make test`: no "Entering/Leaving directory" lines in the plan
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-n", "--no-print-directory", target, f"STAMP={stamp}",
                           *variables], cwd=REPO, check=True, capture_output=True, text=True,
                          timeout=60, env=env).stdout


@pytest.mark.parametrize("target", ["table3-proxy", "gpu-check"])
def test_a_measuring_target_writes_nothing_under_docs_by_default(target, tmp_path):
    dry = _dry_run(target, tmp_path)
    assert "make install" not in dry and "pip install" not in dry
    assert DOCS_PATH.findall(dry) == []


def test_table3_proxy_writes_under_runs_and_rebuilds_the_committed_page_when_asked(tmp_path):
    table = _dry_run("table3-proxy", tmp_path).splitlines()[-1]
    assert "table.output=runs/table3_proxy/results.md" in table
    assert "table.table3_plot=runs/table3_proxy/results.png" in table
    asked = _dry_run("table3-proxy", tmp_path, "TABLE3_PROXY_OUT=docs/table3_proxy")
    assert sorted(set(DOCS_PATH.findall(asked))) == ["docs/table3_proxy.md",
                                                    "docs/table3_proxy.png"]


def test_gpu_check_reports_under_runs_by_default(monkeypatch):
    seen = {}

    class Check:
        def __init__(self, args: argparse.Namespace):
            seen["work"] = Path(args.work)

        def run(self) -> dict:
            return {"checks": []}

    monkeypatch.setattr(gpu_check, "GpuCheck", Check)
    monkeypatch.setattr(gpu_check, "write_report", lambda report, out: seen.update(out=out))
    assert gpu_check.main([]) == 0
    assert seen["out"].resolve().is_relative_to(REPO / "runs")
    assert seen["work"].resolve().is_relative_to(REPO / "runs")
