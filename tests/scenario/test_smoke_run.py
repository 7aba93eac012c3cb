"""The quick sizes of the default pipeline: the `smoke` experiment (`make smoke`) runs every
stage on a slice of Multi30k; a run shorter than its checkpoint interval still averages; a
config without `experiment=` trains into its own run folder."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch

from transformer_nmt.checkpoint import average_run, load_checkpoint, save_checkpoint
from transformer_nmt.config import compose

REPO = Path(__file__).resolve().parents[2]


def test_make_smoke_runs_the_four_stages_of_the_smoke_experiment(tmp_path):
    stamp = tmp_path / "installed"  # newer than pyproject.toml: no install step is planned
    stamp.touch()
    dry = subprocess.run(["make", "-n", "smoke", f"STAMP={stamp}"], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    stages = [line.split()[0].rsplit("/", 1)[-1] for line in dry.splitlines()
              if "experiment=smoke" in line]
    assert stages == ["nmt-prepare", "nmt-train", "nmt-average", "nmt-evaluate"]


@pytest.mark.slow
def test_smoke_experiment_runs_the_whole_pipeline(tmp_path, multi30k_mirror, caplog):
    from transformer_nmt.data.prepare import prepare
    from transformer_nmt.evaluate.evaluate import evaluate
    from transformer_nmt.train.loop import train

    cfg = compose(["experiment=smoke", f"data.root={tmp_path / 'data'}",
                   f"data.mirror={multi30k_mirror}", f"run_dir={tmp_path / 'run'}"])
    assert cfg.data.name != compose(["experiment=multi30k_en_de"]).data.name  # own slice
    prepare(cfg)
    summary = train(cfg)
    assert summary["stopped_by"] == "max_steps" and summary["steps"] == cfg.trainer.max_steps
    with caplog.at_level(logging.WARNING):
        averaged = load_checkpoint(average_run(cfg))
    assert averaged["averaged_steps"] == [20, 40, 60] and not caplog.records
    evaluate(cfg)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert list(results["test_sets"]) == ["test_2016_flickr"]
    assert results["test_sets"]["test_2016_flickr"]["bleu"]["sacrebleu"]["score"] >= 0


def test_a_run_stopped_before_its_first_regular_save_averages_its_stop_checkpoint(tmp_path,
                                                                                   caplog):
    """`make all ARGS="trainer.max_steps=30"`: the default experiment saves every 150 steps,
    so the run holds only the checkpoint written when it stopped."""
    cfg = compose(["experiment=multi30k_en_de", f"run_dir={tmp_path}"])
    stored = {"name": cfg.name, "trainer": {"save_every_steps": cfg.trainer.save_every_steps}}
    save_checkpoint(tmp_path / "checkpoints" / "checkpoint_30.pt",
                    {"model": {"w": torch.tensor([3.0])}, "step": 30, "vocab_size": 8,
                     "config": stored})
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.checkpoint"):
        averaged = load_checkpoint(average_run(cfg))
    assert averaged["averaged_steps"] == [30] and averaged["model"]["w"].item() == 3.0
    assert "holds no regularly spaced checkpoint" in caplog.text
    assert "averaging checkpoint_30.pt alone" in caplog.text


def test_without_an_experiment_the_run_has_its_own_folder():
    bare, default = compose([]), compose(["experiment=multi30k_en_de"])
    assert bare.data.name == default.data.name  # the same corpus ...
    assert bare.run_dir != default.run_dir  # ... but never the default experiment's run
    assert bare.name == "no_experiment"
