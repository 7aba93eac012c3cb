"""Every WMT14 experiment of the paper runs as configured (full model sizes and vocabulary,
the paper's optimizer and schedule) on a small local slice: trainer.dry_run builds data
loaders, model and optimizer and takes real steps, so the configs are tested without the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from transformer_nmt.config import CONFIG_DIR, compose
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train.dryrun import dry_run

WMT14 = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("wmt14_*.yaml"))
STEPPED = ("wmt14_en_de_base", "wmt14_en_fr_base")
"""Presets that take a real dry-run step (the base network on both language pairs); the big
ones (the same code with other sizes, dropout or batch target) are composed, validated and
built on the meta device, their parameters counted: a big model's CPU step costs about 25 s,
and the GPU check (scripts/cluster/gpu_check.py) trains big at its preset's size on a GPU."""


@pytest.fixture(scope="module")
def slice_files(synthetic_corpus) -> Path:
    """Parallel text files <split>.{en,de,fr}: the synthetic corpus's training text (a local
    corpus; its target side serves as German and as French)."""
    folder = synthetic_corpus.files.parent / "wmt14_slice"
    folder.mkdir(exist_ok=True)
    for lang, source in (("en", "en"), ("de", "de"), ("fr", "de")):
        lines = (synthetic_corpus.files / f"train.{source}").read_text(encoding="utf-8")
        for split in ("train", "newstest2013", "newstest2014", "newstest2014_filtered"):
            (folder / f"{split}.{lang}").write_text(lines, encoding="utf-8")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("experiment", WMT14)
def test_wmt14_experiment_dry_run(experiment, slice_files, tmp_path):
    cfg = compose([f"experiment={experiment}"])
    assert cfg.data.corpus == "wmt14"  # the real source; the test swaps in local files below
    full_vocab = cfg.data.vocab_size
    tgt = cfg.data.tgt_lang
    run_dir = tmp_path / "run"
    if experiment not in STEPPED:
        with torch.device("meta"):
            params = sum(p.numel() for p in Transformer(cfg.model, full_vocab).parameters())
        assert 205e6 < params < 220e6, params
        assert cfg.trainer.max_steps == 300_000 or experiment.endswith("ott2018")
        assert cfg.model.d_model == 1024 and cfg.model.heads == 16
        return
    overrides = [
        f"experiment={experiment}",
        "data.corpus=custom",
        f"data.root={tmp_path / 'data'}",
        *(f"+data.custom_files.{s}={slice_files / s}"
          for s in ("train", "newstest2013", "newstest2014", "newstest2014_filtered")),
        f"run_dir={run_dir}",
        "trainer.dry_run=true",
        "trainer.dry_run_steps=1",
        "trainer.dry_run_warmup_steps=0",
        "trainer.tokens_per_step=null",  # one micro-batch per step: a CPU step of a big model
        "trainer.max_tokens=160",  # the paper's 3125 per GPU costs minutes per step on a CPU
    ]
    summary = dry_run(compose(overrides))
    assert summary["steps"] == 1
    assert summary["vocab_size"] == full_vocab
    assert summary["update_freq"] == cfg.trainer.update_freq
    saved = json.loads((run_dir / "dry_run" / "train_summary.json").read_text())
    params = saved["parameters"]
    if experiment.endswith("_base"):
        assert 60e6 < params < 67e6, params
    else:
        assert 205e6 < params < 220e6, params
    assert not (run_dir / "checkpoints").exists()
    assert tgt in experiment
