"""results.json never lies: evaluating some test splits keeps the others' scores (merged by
split, what was replaced or dropped said), translations and results.json are written as one
unit, and each decoding engine keeps its own results with the settings that actually ran."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

from transformer_nmt.data.corpora import reference_path
from transformer_nmt.errors import UserError
from transformer_nmt.evaluate import evaluate as evaluate_module
from transformer_nmt.evaluate.evaluate import evaluate
from transformer_nmt.evaluate.report import build_report, load_results
from transformer_nmt.fileio import file_digest, raw_path
from transformer_nmt.interop.ctranslate2 import decode_engine

A, B = "test_2016_flickr", "test_2017_flickr"


@pytest.fixture()
def run(workspace, tokenizer, tmp_path):
    """A config for a run in ``tmp_path`` with two test splits (A, and B a copy of it) and
    two checkpoints: ``(cfg, first.pt, second.pt)``."""
    _, cfg = workspace
    cfg = copy.deepcopy(cfg)
    for lang in ("en", "de"):
        if not raw_path(cfg.data, B, lang).exists():
            shutil.copy(raw_path(cfg.data, A, lang), raw_path(cfg.data, B, lang))
    shutil.copy(reference_path(cfg.data, A, "de"), reference_path(cfg.data, B, "de"))
    cfg.run_dir = str(tmp_path / "run")
    paths = []
    for name, seed in (("first.pt", 1), ("second.pt", 2)):
        write_checkpoint(tmp_path / name, new_model(cfg, tokenizer.vocab_size, seed), cfg, seed)
        paths.append(tmp_path / name)
    cfg.decode.checkpoint = str(paths[0])
    return cfg, *paths


def _with(cfg, splits=None, checkpoint=None, **decode):
    cfg = copy.deepcopy(cfg)
    if splits is not None:
        cfg.data.test_splits = list(splits)
    if checkpoint is not None:
        cfg.decode.checkpoint = str(checkpoint)
    for k, v in decode.items():
        setattr(cfg.decode, k, v)
    return cfg


def _saved(cfg) -> dict:
    return json.loads((Path(cfg.run_dir) / "results.json").read_text(encoding="utf-8"))


def test_evaluating_one_split_keeps_the_others_scores_and_says_what_it_replaced(run, caplog):
    cfg, _, second = run
    both = evaluate(_with(cfg, [A, B]))
    with caplog.at_level(logging.WARNING):
        evaluate(_with(cfg, [B]))
    saved = _saved(cfg)
    assert list(saved["test_sets"]) == [A, B]  # A kept, B scored again
    assert saved["test_sets"][A] == both["test_sets"][A]
    assert saved["test_sets"][B]["date"] >= both["test_sets"][B]["date"]
    assert f"replaced the earlier native scores of {B} (sacreBLEU " in caplog.text
    assert A not in caplog.text
    # Another checkpoint: B's scores are replaced, A's (of the first checkpoint) dropped, said.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        evaluate(_with(cfg, [B], checkpoint=second))
    saved = _saved(cfg)
    assert list(saved["test_sets"]) == [B]
    assert saved["checkpoint_sha256"] == file_digest(second)
    assert all(t["checkpoint_sha256"] == file_digest(second) for t in saved["test_sets"].values())
    assert (f"dropped the earlier native scores of {A}: they were computed with another "
            f"checkpoint or other decode settings; evaluate it again with "
            f"data.test_splits=[{A}]") in caplog.text


def test_other_decode_settings_drop_the_splits_scored_otherwise(run):
    cfg, _, _ = run
    evaluate(_with(cfg, [A, B]))
    evaluate(_with(cfg, [A], beam_size=1))
    saved = _saved(cfg)
    assert list(saved["test_sets"]) == [A] and saved["decode"]["beam_size"] == 1


def test_results_name_the_hash_of_the_translations_they_scored(run):
    cfg, _, _ = run
    saved = evaluate(_with(cfg, [A, B]))
    for test in saved["test_sets"].values():
        assert test["translations_sha256"] == file_digest(test["translations"])


def test_a_failure_before_results_json_is_written_puts_the_earlier_translations_back(
        run, monkeypatch):
    cfg, _, second = run
    evaluate(_with(cfg, [A, B]))
    run_dir = Path(cfg.run_dir)
    before = {p.name: p.read_bytes() for p in (run_dir / "translations").iterdir()}
    results_before = (run_dir / "results.json").read_bytes()

    def killed(path, obj):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_with(cfg, [A, B], checkpoint=second))
    after = {p.name: p.read_bytes() for p in (run_dir / "translations").iterdir()}
    assert after == before  # no backup left beside them either
    assert (run_dir / "results.json").read_bytes() == results_before
    saved = _saved(cfg)
    for test in saved["test_sets"].values():
        assert test["translations_sha256"] == file_digest(test["translations"])


def test_a_source_and_reference_of_different_lengths_say_what_to_do(run):
    cfg, _, _ = run
    ref = reference_path(cfg.data, B, "de")
    ref.write_text("one line\n", encoding="utf-8")
    try:
        with pytest.raises(UserError, match=(
                rf"has 12 lines but its reference {ref} has 1: they no longer belong together; "
                r"run nmt-prepare again for data=\w+ .*, or leave test_2017_flickr out of "
                r"data.test_splits$")):
            evaluate(_with(cfg, [A, B]))
    finally:
        shutil.copy(reference_path(cfg.data, A, "de"), ref)
    assert not (Path(cfg.run_dir) / "results.json").exists()


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_the_results_file_is_strict_json(run, monkeypatch):
    cfg, _, _ = run
    monkeypatch.setattr(evaluate_module, "translate_lines", lambda model, tok, lines, decode,
                        device: (["x"] * len(lines), {"sentences_per_second": float("nan"),
                                                      "seconds": float("inf")}))
    evaluate(_with(cfg, [A]))
    saved = _strict((Path(cfg.run_dir) / "results.json").read_text(encoding="utf-8"))
    assert saved["test_sets"][A]["speed"] == {"sentences_per_second": None, "seconds": None}


def test_write_json_writes_non_finite_numbers_as_null(tmp_path):
    from transformer_nmt.fileio import write_json

    path = tmp_path / "out.json"
    write_json(path, {"loss": float("nan"), "ppl": [1.5, float("-inf")], "ok": 2})
    assert _strict(path.read_text(encoding="utf-8")) == {"loss": None, "ppl": [1.5, None],
                                                          "ok": 2}


def test_ctranslate2_keeps_its_own_results_and_records_what_ran(run):
    pytest.importorskip("ctranslate2")
    cfg, _, _ = run
    native = evaluate(_with(cfg, [A, B]))
    ours = (Path(cfg.run_dir) / "translations" / f"{A}.de").read_bytes()
    evaluate(_with(cfg, [A], engine="ctranslate2", lenpen=0.6), engine=decode_engine)
    saved = _saved(cfg)
    assert saved["test_sets"] == native["test_sets"]  # ours untouched
    assert saved["decode"] == native["decode"]
    assert (Path(cfg.run_dir) / "translations" / f"{A}.de").read_bytes() == ours
    part = saved["engines"]["ctranslate2"]
    assert list(part["test_sets"]) == [A]
    assert part["decode"]["engine"] == "ctranslate2"
    assert part["decode"]["lenpen_form"] == "fairseq" and part["decode"]["stopping"] == "beam"
    assert part["decode"]["precision"] == "float32"
    test = part["test_sets"][A]
    assert test["translations"] == str(Path(cfg.run_dir) / "translations" / "ctranslate2"
                                       / f"{A}.de")
    assert test["translations_sha256"] == file_digest(test["translations"])
    # Ours evaluated again: the CTranslate2 part stays.
    evaluate(_with(cfg, [A]))
    assert _saved(cfg)["engines"] == saved["engines"]
    report = build_report(load_results(str(Path(cfg.run_dir) / "results.json")))
    assert f"| {A} (CTranslate2) |" in report and f"| {A} |" in report
    assert "decoded by CTranslate2" in report


def test_ctranslate2_in_half_precision_on_a_cpu_is_refused(run):
    pytest.importorskip("ctranslate2")
    cfg, _, _ = run
    with pytest.raises(UserError, match=(
            "^decode.engine=ctranslate2 decode.precision=fp16 needs a GPU: CTranslate2 computes "
            "in float32 on a CPU; use decode.precision=fp32")):
        evaluate(_with(cfg, [A], engine="ctranslate2", precision="fp16", device="cpu"),
                 engine=decode_engine)
    assert not (Path(cfg.run_dir) / "results.json").exists()


def test_translations_replaced_by_a_killed_evaluation_are_put_back_next_time(run, caplog):
    """The state ``kill -9`` leaves between the rename of a translations file and the write of
    results.json: the new file in place, the earlier one in its backup, results.json naming the
    earlier one's hash. The next evaluation (of another split) puts the earlier file back."""
    cfg, _, _ = run
    saved = evaluate(_with(cfg, [A, B]))
    target = Path(saved["test_sets"][A]["translations"])
    scored = target.read_bytes()
    backup = target.with_name(f".{target.name}.old.tmp")
    backup.write_bytes(scored)
    target.write_text("unscored output\n" * 12, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        evaluate(_with(cfg, [B]))
    assert target.read_bytes() == scored and not backup.exists()
    assert f"put back {target}" in caplog.text
    assert _saved(cfg)["test_sets"][A]["translations_sha256"] == file_digest(target)
