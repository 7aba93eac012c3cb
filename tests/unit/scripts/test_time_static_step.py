"""scripts/micro/time_static_step.py: the step is timed at every span of positions read up to
the cache length, with the span it reports being the one the cache's step reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import time_static_step  # noqa: E402

TINY = ["--d-model", "16", "--d-ff", "32", "--heads", "2", "--layers", "2", "--vocab", "12",
        "--sentences", "3", "--beam", "2", "--src-len", "5", "--capacity", "48", "--repeats", "1"]


def test_every_span_up_to_the_capacity(capsys):
    results = time_static_step.main(TINY)
    assert [r["span"] for r in results] == [16, 32, 48]
    assert all(r["capacity"] == 48 and r["rows"] == 4 * 2 and r["ms"] > 0 for r in results)
    assert results[-1]["ratio"] == 1.0
    out = capsys.readouterr().out
    assert "R 8 rows, C 48" in out and "| 16 | " in out and "eager" in out


@pytest.mark.heavy
def test_compiled_step_every_span(capsys):
    results = time_static_step.main([*TINY, "--compile"])
    assert [r["span"] for r in results] == [16, 32, 48]
    assert "compiled" in capsys.readouterr().out


def test_a_capacity_off_the_length_bucket_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        time_static_step.main(["--capacity", "40"])
    assert e.value.code == 2 and "not a positive multiple of 16" in capsys.readouterr().err
