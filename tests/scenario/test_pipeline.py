"""The whole chain as a user runs it: nmt-prepare -> nmt-train -> nmt-average -> nmt-evaluate
-> nmt-table -> nmt-translate, each as its console script, on the synthetic corpus and on a
slice of real Multi30k text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _run(script: str, args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(BIN / script), *args], check=False, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300, **kwargs,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _chain(tmp_path: Path, data: list[str], model: list[str], split: str, n_test: int,
           translate_input: str) -> None:
    """nmt-prepare -> nmt-train -> nmt-average -> nmt-evaluate -> nmt-table -> nmt-translate on
    the data selected by ``data`` (its test split ``split`` has ``n_test`` sentences)."""
    run_dir = tmp_path / "runs" / "m30k"
    common = [
        "experiment=multi30k_en_de",
        *data,
        "name=m30k",
        f"run_dir={run_dir}",
        *model,
        "trainer.max_tokens=1024",
        "trainer.max_steps=6",
        "trainer.save_every_steps=2",
        "trainer.validate_every_steps=3",
        "trainer.log_every_steps=2",
        "average.last=2",
        "decode.max_len_b=5",
        "decode.max_len_a=0.5",
        f"table.results_glob={tmp_path / 'runs' / '*' / 'results.json'}",
        f"table.output={tmp_path / 'results.md'}",
    ]
    _run("nmt-prepare", common, tmp_path)
    name = next(o.split("=", 1)[1] for o in [*data, "data.name=multi30k_en_de"]
                if o.startswith("data.name="))
    summary = json.loads((tmp_path / "data" / "bin" / name / "summary.json").read_text())
    assert summary  # parses

    _run("nmt-train", common, tmp_path)
    train_summary = json.loads((run_dir / "train_summary.json").read_text())
    assert train_summary["steps"] == 6
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {m["split"] for m in metrics} >= {"train", "valid"}
    assert any((run_dir / "tb").iterdir())
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert len([p for p in checkpoints if p.stem.split("_")[1].isdigit()]) >= 2

    _run("nmt-average", common, tmp_path)
    assert (run_dir / "checkpoints" / "averaged.pt").is_file()

    _run("nmt-evaluate", common, tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    scores = results["test_sets"][split]
    assert scores["sentences"] == n_test
    for kind in ("sacrebleu", "paper_bleu"):
        assert scores["bleu"][kind]["label"] and scores["bleu"][kind]["signature"]
        assert 0.0 <= scores["bleu"][kind]["score"] <= 100.0
    assert results["num_checkpoints_averaged"] == 2
    hyps = (run_dir / "translations" / f"{split}.de").read_text().splitlines()
    assert len(hyps) == n_test

    _run("nmt-table", common, tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "m30k" in table and "sacreBLEU" in table

    proc = _run("nmt-translate", common, tmp_path, input=translate_input)
    assert len(proc.stdout.splitlines()) == 3
    assert proc.stdout.splitlines()[1] == ""


def test_prepare_train_average_evaluate_table_translate(tmp_path, synthetic_corpus, tiny_model):
    """The chain on the synthetic reversal corpus (its text files, prepared here again)."""
    data = [o for o in synthetic_corpus.overrides if not o.startswith("data.root=")]
    _chain(tmp_path, [*data, f"data.root={tmp_path / 'data'}"], tiny_model, "test",
           synthetic_corpus.sizes["test"], "ab cd ef\n\nxy zz\n")


@pytest.mark.slow
def test_prepare_train_average_evaluate_table_translate_on_multi30k(tmp_path, multi30k_mirror,
                                                                   tiny_model):
    """The chain on a slice of real Multi30k text (skips without the local mirror)."""
    data = [f"data.mirror={multi30k_mirror}", f"data.root={tmp_path / 'data'}",
            "data.max_train_pairs=1500", "data.vocab_size=400",
            "data.test_splits=[test_2016_flickr]"]
    _chain(tmp_path, data, tiny_model, "test_2016_flickr", 1000,
           "A dog runs.\n\nTwo men play.\n")
