"""The dry run measures the real run's batch plan: ``update_freq`` derived from
``trainer.tokens_per_step`` as in the real run, every micro-batch of a step counted in the
bill, the warm-up steps left out."""

from __future__ import annotations

import json

import pytest

from transformer_nmt.config import compose
from transformer_nmt.train.dryrun import dry_run


def test_dry_run_derives_update_freq_and_its_bill_counts_every_micro_batch(
        synthetic_corpus, tiny_model, tmp_path):
    run = tmp_path / "run"
    max_tokens = 256
    cfg = compose(["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
                   f"run_dir={run}", "trainer.dry_run=true", f"trainer.max_tokens={max_tokens}",
                   "trainer.tokens_per_step=800", "trainer.tokens_per_step_tolerance=0.5",
                   "trainer.dry_run_steps=3", "trainer.dry_run_warmup_steps=1",
                   "trainer.max_steps=1000"])
    summary = dry_run(cfg)
    projection = json.loads((run / "dry_run" / "projection.json").read_text())
    update_freq = summary["update_freq"]
    assert update_freq > 1  # derived from tokens_per_step, as the real run derives it
    assert projection["update_freq"] == update_freq and projection["max_tokens"] == max_tokens
    assert summary["steps"] == 4 and summary["micro_steps"] == 4 * update_freq
    assert projection["warmup_steps"] == 1 and projection["measured_steps"] == 3

    rows = [json.loads(line)
            for line in (run / "dry_run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "train"]
    tokens = [r["tokens_per_s"] * r["seconds_per_step"] for r in rows]
    assert sum(tokens) == pytest.approx(summary["tokens_seen"], rel=1e-6)  # every micro-batch
    timed = tokens[1:]
    # a step holds more target tokens than one micro-batch can: all of its micro-batches
    assert projection["tokens_per_step"] == pytest.approx(sum(timed) / 3, rel=1e-6)
    assert projection["tokens_per_step"] > max_tokens
    seconds = sum(r["seconds_per_step"] for r in rows[1:])
    assert projection["tokens_per_s"] == pytest.approx(sum(timed) / seconds, rel=1e-6)
    assert projection["total_tokens"] == pytest.approx(1000 * projection["tokens_per_step"])
    assert projection["projected_wall_hours"] == pytest.approx(
        1000 * projection["tokens_per_step"] / projection["tokens_per_s"] / 3600)
