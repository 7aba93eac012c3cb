"""scripts/micro/time_compiled_call.py: the three ways are timed per call, and every call of
the compiled step runs it (the script checks the count and raises otherwise); ``--guards``
times the real beam step through a backend that runs its graph once and counts every call."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import time_compiled_call  # noqa: E402


def test_each_way_is_timed_per_call(capsys):
    result = time_compiled_call.main(["--backend", "eager", "--calls", "20", "--rounds", "2"])
    assert set(result) == {"compiled, settings entered once",
                           "compiled, settings entered per call", "eager"}
    assert all(0 < us < 1e5 for us in result.values())
    out = capsys.readouterr().out
    assert "median of 2 rounds of 20 calls" in out and "| eager |" in out


def test_guards_ways_time_the_beam_step_without_running_it(capsys):
    result = time_compiled_call.main(["--backend", "eager", "--calls", "5", "--rounds", "1",
                                      "--guards", "1,2"])
    assert {"beam step's guards, 1 decoder layer(s)", "beam step's guards, 2 decoder layer(s)",
            "guards per decoder layer"} <= set(result)
    assert "guards per decoder layer:" in capsys.readouterr().out


def test_guards_only_backend_runs_the_graph_once_and_counts_every_call():
    backend = time_compiled_call.GuardsOnly()
    x = torch.zeros(2)
    fn = torch.compile(lambda t: t.add_(1.0), backend=backend)
    for _ in range(5):
        fn(x)
    assert (backend.graphs, backend.calls) == (1, 5)
    assert x.tolist() == [1.0, 1.0]  # the graph ran at the first call only
