"""scripts/micro/time_compiled_call.py: the three ways are timed per call, and every call of
the compiled step runs it (the script checks the count and raises otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import time_compiled_call  # noqa: E402


def test_each_way_is_timed_per_call(capsys):
    result = time_compiled_call.main(["--backend", "eager", "--calls", "20", "--rounds", "2"])
    assert set(result) == {"compiled, settings entered once",
                           "compiled, settings entered per call", "eager"}
    assert all(0 < us < 1e5 for us in result.values())
    out = capsys.readouterr().out
    assert "median of 2 rounds of 20 calls" in out and "| eager |" in out
