"""nmt-evaluate (transformer_nmt.evaluate.evaluate) end to end on a random tiny model: translations,
both BLEUs and chrF against the official reference bytes, results.json, training cost."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

from transformer_nmt.checkpoint import average_run
from transformer_nmt.data.corpora import reference_path
from transformer_nmt.evaluate.evaluate import evaluate
from transformer_nmt.evaluate.report import build_report, load_results


def test_evaluate_end_to_end(workspace, tokenizer, tmp_path, capsys):
    root, cfg = workspace
    run_dir = Path(cfg.run_dir)
    for step, seed in ((4, 1), (8, 2)):
        write_checkpoint(run_dir / "checkpoints" / f"checkpoint_{step}.pt",
                         new_model(cfg, tokenizer.vocab_size, seed), cfg, step)
    cfg.average.last = 2
    average_run(cfg)
    (run_dir / "train_summary.json").write_text(json.dumps(
        {"gpu_hours": 0.5, "flops": 1.5e15, "train_seconds": 1800.0, "world_size": 1,
         "valid": {"ppl": 12.5}}))
    results = evaluate(cfg)

    printed = capsys.readouterr().out
    assert "sacreBLEU (detokenized, 13a, mixed case): " in printed
    assert "paper BLEU (t2t get_ende_bleu.sh, 2017 form): " in printed
    assert "paper BLEU (t2t get_ende_bleu.sh, 2018 form: + replace-unicode-punctuation): " in (
        printed)
    assert "chrF" in printed
    translations = run_dir / "translations" / "test_2016_flickr.de"
    assert len(translations.read_text(encoding="utf-8").splitlines()) == 12
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["experiment"] == "tiny" and saved["steps"] == 8
    assert saved["checkpoints_averaged"] == ["checkpoint_4.pt", "checkpoint_8.pt"]
    assert saved["model"]["params"] == new_model(cfg, tokenizer.vocab_size, 0).num_parameters()
    assert saved["decode"]["beam_size"] == 2 and saved["decode"]["lenpen_form"] == "gnmt"
    assert saved["training_cost"] == {"gpu_hours": 0.5, "flops": 1.5e15, "train_seconds": 1800.0,
                                      "world_size": 1}
    test = saved["test_sets"]["test_2016_flickr"]
    assert list(test["bleu"]) == ["sacrebleu", "paper_bleu", "paper_bleu:t2t-2018",
                                  "paper_bleu:mmt"]
    assert test["bleu"]["paper_bleu"]["form"] == "t2t-2017"
    for entry in (*test["bleu"].values(), test["chrf"]):
        assert entry["label"] and entry["signature"] and 0 <= entry["score"] <= 100
    assert test["speed"]["sentences"] == 12
    # Scored against the official reference file: the number is what the command line gives.
    ref_file = reference_path(cfg.data, "test_2016_flickr", "de")
    assert test["reference"] == str(ref_file)
    proc = subprocess.run([str(Path(sys.executable).parent / "sacrebleu"), str(ref_file), "-i",
                           str(translations), "-f", "json", "-w", "6"],
                          capture_output=True, text=True, check=True)
    cli = json.loads(proc.stdout)
    assert test["bleu"]["sacrebleu"]["score"] == pytest.approx(float(cli["score"]), abs=1e-6)
    assert test["bleu"]["sacrebleu"]["signature"] == cli["signature"]

    # The table reads what evaluate wrote (an "other run": Multi30k).
    report = build_report(load_results(str(root / "runs" / "*" / "results.json")))
    assert "## Other runs" in report and "| tiny | multi30k_en_de (en-de)" in report
    assert "| 0.50 | 1.5e+15 |" in report

    # Without a train summary the training cost is null.
    (run_dir / "train_summary.json").unlink()
    assert evaluate(cfg)["training_cost"] is None


def test_evaluate_scores_against_the_official_reference_bytes(workspace, tokenizer, tmp_path,
                                                              monkeypatch):
    """A system that outputs the cleaned (NFKC) reference: scored against the cleaned text it
    would get 100; against the official file it gets what `sacrebleu REF -i HYP` prints."""
    import unicodedata

    from transformer_nmt.evaluate import evaluate as evaluate_module

    _, cfg = workspace
    cfg = copy.deepcopy(cfg)
    cfg.run_dir = str(tmp_path / "run")
    ckpt = tmp_path / "model.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 5), cfg, 3)
    cfg.decode.checkpoint = str(ckpt)
    ref_file = reference_path(cfg.data, "test_2016_flickr", "de")
    official = ref_file.read_text(encoding="utf-8").splitlines()
    cleaned = [" ".join(unicodedata.normalize("NFKC", r.replace("\u00ad", "")).split())
               for r in official]
    monkeypatch.setattr(evaluate_module, "translate_lines",
                        lambda model, tok, lines, decode, device: (cleaned, {"sentences": 12}))
    results = evaluate(cfg)
    test = results["test_sets"]["test_2016_flickr"]
    proc = subprocess.run([str(Path(sys.executable).parent / "sacrebleu"), str(ref_file), "-i",
                           test["translations"], "-f", "json", "-w", "6"],
                          capture_output=True, text=True, check=True)
    score = test["bleu"]["sacrebleu"]["score"]
    assert score == pytest.approx(float(json.loads(proc.stdout)["score"]), abs=1e-6)
    assert 50 < score < 99.9  # the two altered lines cost n-grams; the rest match
    assert test["bleu"]["paper_bleu"]["score"] < 99.9
