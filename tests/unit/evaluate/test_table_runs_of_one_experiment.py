"""nmt-table: two runs of one experiment (other run_dir) are told apart by their run folder;
a run whose experiment name is its own keeps the bare name."""

from __future__ import annotations

import json

from transformer_nmt.config import compose
from transformer_nmt.evaluate.report import write_report
from unit.evaluate.test_report import fake_result


def test_runs_of_one_experiment_show_their_run_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {
        "runs/a": fake_result("multi30k_en_de", "multi30k", "multi30k_en_de", "de", "tiny",
                              ["test_2016_flickr"], 35.0, 34.0),
        "runs/b": fake_result("multi30k_en_de", "multi30k", "multi30k_en_de", "de", "tiny",
                              ["test_2016_flickr"], 31.0, 30.0),
        "runs/multi30k_en_fr": fake_result("multi30k_en_fr", "multi30k", "multi30k_en_fr", "fr",
                                           "tiny", ["test_2016_flickr"], 50.0, 49.0),
    }
    for folder, result in runs.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "results.json").write_text(json.dumps(result))
    cfg = compose(["table.results_glob=runs/**/results.json", "table.tables=[other]",
                   f"table.output={tmp_path}/results.md"])
    text = write_report(cfg).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| multi30k_en_")]
    assert len(rows) == 3
    assert any(r.startswith("| multi30k_en_de (runs/a) |") and "| 34.00 |" in r for r in rows)
    assert any(r.startswith("| multi30k_en_de (runs/b) |") and "| 30.00 |" in r for r in rows)
    assert any(r.startswith("| multi30k_en_fr |") for r in rows)
