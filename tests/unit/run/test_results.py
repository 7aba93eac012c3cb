"""One check for results files, used by every reader: nmt-table leaves out a results.json
that lacks chrF, holds a null score, a score without label or a non-numeric model.params (one
warning naming the file and the field) and still builds the table from the good ones;
nmt-export's model card does the same (the export goes on, its card without scores)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

from transformer_nmt.evaluate.report import build_report, load_results
from transformer_nmt.run.results import Results, ResultsError, read_results


def _score(kind: str, score: float = 30.0) -> dict:
    return {"type": kind, "label": f"{kind} label", "score": score, "signature": f"{kind}|sig"}


def _good(name: str) -> dict:
    return {
        "experiment": name, "data": {"name": "d", "corpus": "custom", "src_lang": "en",
                                     "tgt_lang": "de"},
        "model": {"name": "tiny", "params": 1000, "config": {}}, "steps": 10,
        "num_checkpoints_averaged": None, "training_cost": None, "train_summary": None,
        "test_sets": {"test": {"sentences": 3, "bleu": {"sacrebleu": _score("sacrebleu", 31.5),
                                                        "paper_bleu": _score("paper_bleu")},
                               "chrf": _score("chrf")}},
    }


def _damaged(how: str) -> tuple[dict, str]:
    r = _good("bad")
    test = r["test_sets"]["test"]
    if how == "no chrf":
        del test["chrf"]
        return r, "test_sets.test has no chrf score"
    if how == "null score":
        test["bleu"]["sacrebleu"] = None
        return r, "test_sets.test.bleu.sacrebleu is null"
    if how == "null number":
        test["chrf"]["score"] = None
        return r, "test_sets.test.chrf has no numeric score"
    if how == "no label":
        del test["bleu"]["paper_bleu"]["label"]
        return r, "test_sets.test.bleu.paper_bleu has no label"
    if how == "params":
        r["model"]["params"] = "60M"
        return r, "model.params is '60M', not a number"
    if how == "summary ppl":
        r["train_summary"] = {"steps": 10, "valid": {"ppl": "high"}}
        return r, "train_summary.valid.ppl is 'high', not a number"
    if how == "engine":
        r["engines"] = {"ctranslate2": {"test_sets": {"test": {"bleu": {}}}}}
        return r, "engines.ctranslate2.test_sets.test has no chrf score"
    raise AssertionError(how)


HOW = ["no chrf", "null score", "null number", "no label", "params", "summary ppl", "engine"]


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_results_file_is_one_line_naming_it_and_the_field(tmp_path, how):
    obj, problem = _damaged(how)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ResultsError) as e:
        read_results(path)
    assert str(e.value) == (f"{path}: {problem}; evaluate the run again (nmt-evaluate) or move "
                            "the file away")


def test_the_table_leaves_out_the_damaged_files_and_builds_from_the_good(tmp_path, caplog):
    good = tmp_path / "runs" / "good" / "results.json"
    good.parent.mkdir(parents=True)
    good.write_text(json.dumps(_good("good")))
    for how in HOW:
        path = tmp_path / "runs" / how.replace(" ", "_") / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_damaged(how)[0]))
    with caplog.at_level(logging.WARNING):
        results = load_results(str(tmp_path / "runs" / "*" / "results.json"))
    assert [r["_path"] for r in results] == [str(good)]
    skipped = [rec.getMessage() for rec in caplog.records if "skipping" in rec.getMessage()]
    assert len(skipped) == len(HOW)
    for how in HOW:
        path = tmp_path / "runs" / how.replace(" ", "_") / "results.json"
        assert any(m.startswith(f"skipping {path}: {_damaged(how)[1]};") for m in skipped)
    report = build_report(results)
    assert "| good | d (en-de) | tiny | 0.0M | 10 | none | test | 30.00 | – | 31.50 | 30.00 |" in report  # noqa: E501


def test_the_record_is_typed():
    rec = Results.parse(_good("x"), "x.json")
    assert rec.test_sets["test"].score("sacrebleu") == 31.5
    assert rec.test_sets["test"].score("chrf") == 30.0
    assert rec.test_sets["test"].score("paper_bleu:t2t-2018") is None
    assert rec.params == 1000 and rec.steps == 10 and rec.engines == {}


def test_the_model_card_reads_results_through_the_same_check(workspace, tokenizer, tmp_path,
                                                             caplog):
    pytest.importorskip("transformers")
    from transformer_nmt.config import ExportConfig
    from transformer_nmt.interop.export import run_export

    _, cfg = workspace
    cfg = copy.deepcopy(cfg)
    cfg.run_dir = str(tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "averaged.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 1), cfg, 7)
    results = Path(cfg.run_dir) / "results.json"
    obj, problem = _damaged("no label")
    results.write_text(json.dumps(obj))
    cfg.export = ExportConfig(output=str(tmp_path / "hf"))
    with caplog.at_level(logging.WARNING):
        out = run_export(cfg)
    assert f"the model card will carry no BLEU: {results}: {problem};" in caplog.text
    card = (Path(out) / "README.md").read_text()
    assert "No results.json" in card
    # A good file: both BLEUs in the card (the paper's way too).
    results.write_text(json.dumps(_good("x")))
    cfg.export = ExportConfig(output=str(tmp_path / "hf"), overwrite=True)
    card = (Path(run_export(cfg)) / "README.md").read_text()
    assert "| test | 3 | 31.50 | `sacrebleu|sig` | 30.00 |" in card
