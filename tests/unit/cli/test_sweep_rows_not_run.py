"""A local sweep (nmt-train -m, Hydra's basic launcher) knows its jobs in Hydra's order, so the
message that ends it can name the rows that never ran."""

from __future__ import annotations

import sys

import pytest

from transformer_nmt.cli import sweep
from transformer_nmt.evaluate.table3_groups import configured_rows


def test_jobs_follow_hydras_order_with_globs_and_seeds():
    rows = sweep.sweep_jobs(["-m", "experiment=table3_proxy", "table3=glob(*,exclude=base)"])
    assert [job[1] for job in rows] == [f"table3={r}" for r in sorted(configured_rows())
                                        if r != "base"]
    assert all(job[0] == "experiment=table3_proxy" for job in rows)
    seeds = sweep.sweep_jobs(["--multirun", "experiment=table3_proxy", "table3=base",
                              "trainer.seed=1,2,3", "hydra/launcher=basic"])
    assert seeds == [["experiment=table3_proxy", "table3=base", f"trainer.seed={s}"]
                     for s in (1, 2, 3)]
    assert sweep.describe(seeds[1], seeds) == "trainer.seed=2"
    both = sweep.sweep_jobs(["-m", "table3=C_N2,D_ls0", "trainer.seed=1,2"])
    assert [sweep.describe(j, both) for j in both] == [
        "table3=C_N2 trainer.seed=1", "table3=C_N2 trainer.seed=2",
        "table3=D_ls0 trainer.seed=1", "table3=D_ls0 trainer.seed=2"]


def test_rows_not_run_are_those_after_the_current_job(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nmt-train", "-m", "experiment=table3_proxy",
                                      "table3=C_N2,D_ls0,A_h1"])
    assert sweep.jobs_not_run(0) == "rows not run: D_ls0, A_h1"
    assert sweep.jobs_not_run(2) == ""
    monkeypatch.setattr(sys, "argv", ["nmt-train", "-m", "trainer.seed=1,2"])
    assert sweep.jobs_not_run(0) == "runs not run: trainer.seed=2"


def test_stop_signal_is_read_from_the_training_summary():
    assert sweep.stopped_by_signal({"stopped_by": "signal SIGINT"}) == 2
    assert sweep.stopped_by_signal({"stopped_by": "signal SIGTERM"}) == 15
    assert sweep.stopped_by_signal({"stopped_by": "max_steps"}) == 0
    assert sweep.stopped_by_signal(None) == 0
    # outside a sweep a signalled run just ends (nmt-train exits 0, as before)
    sweep.stop_if_signalled({"stopped_by": "signal SIGINT", "steps": 3}, 10, True)


def test_a_signalled_row_in_a_local_sweep_ends_it_with_128_plus_the_signal(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nmt-train", "-m", "table3=base,A_h1,A_h4"])
    monkeypatch.setattr(sweep, "current_job", lambda: 0)
    summary = {"stopped_by": "signal SIGTERM", "steps": 68}
    with pytest.raises(sweep.SweepStopped) as e:
        sweep.stop_if_signalled(summary, 1000, evaluated=True)
    assert e.value.exit_status == 143
    assert str(e.value) == (
        "SIGTERM stopped base at step 68 of 1,000 (evaluated, its results.json marked short; "
        "the next sweep resumes it from its last checkpoint); rows not run: A_h1, A_h4")
    sweep.stop_if_signalled({"stopped_by": "max_steps", "steps": 1000}, 1000, evaluated=True)
