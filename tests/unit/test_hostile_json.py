"""JSON that would crash a reader later (nested 100,000 deep, an integer of 400 digits, one of
5,000 digits, which ``int()`` refuses) is refused where it is read, by the one reader
(``fileio.read_json``), naming the file: results.json, train_summary.json, the lines of
metrics.jsonl and nmt-plot's checkpoint BLEU cache."""

from __future__ import annotations

import json
import logging

import pytest

from transformer_nmt.errors import JsonFileError, UserError
from transformer_nmt.evaluate.checkpoint_bleu import read_cache
from transformer_nmt.evaluate.evaluate import read_train_summary
from transformer_nmt.fileio import read_json
from transformer_nmt.plot import curves
from transformer_nmt.run.results import read_previous_results
from transformer_nmt.train.summary import _previous_summary

DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = {
    "deep": (DEEP, "nested deeper than 64 levels"),
    "huge": ('{"steps": 10, "flops": ' + "9" * 400 + "}",
             "holds a number too large for a float (400 digits)"),
    "beyond int()": ('{"steps": ' + "9" * 5000 + "}",
                     "holds a number too large for a float (5000 digits)"),
}


@pytest.mark.parametrize("how", list(HOSTILE))
def test_read_json_refuses_what_would_crash_a_reader_and_names_the_file(tmp_path, how):
    text, problem = HOSTILE[how]
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(JsonFileError) as e:
        read_json(path)
    assert str(e.value) == f"{path}: {problem}"
    assert read_json(path, text='{"a": [[1.5e3, 12]]}') == {"a": [[1500.0, 12]]}


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_train_summary_is_one_error_for_evaluate_and_ignored_by_train(tmp_path, how):
    text, problem = HOSTILE[how]
    path = tmp_path / "train_summary.json"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        read_train_summary(tmp_path)
    assert str(e.value) == f"{path}: {problem}; train again or delete it"
    assert _previous_summary(tmp_path) == {}


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_earlier_results_file_is_replaced_with_a_warning(tmp_path, how, caplog):
    text, problem = HOSTILE[how]
    path = tmp_path / "results.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING):
        assert read_previous_results(path) is None
    assert caplog.messages == [
        f"{path} cannot be read ({problem}); it is replaced by this evaluation's results"]


@pytest.mark.parametrize("how", list(HOSTILE))
def test_nmt_plot_names_a_hostile_metrics_line_and_decodes_again_over_a_hostile_cache(
        tmp_path, how, caplog):
    text, problem = HOSTILE[how]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"split": "train", "step": 1}) + "\n" + text + "\n")
    with pytest.raises(UserError) as e:
        curves.read_metrics(metrics)
    assert str(e.value).startswith(f"{metrics}, line 2: {problem}: ")
    cache = tmp_path / "checkpoint_bleu.json"
    cache.write_text(text)
    with caplog.at_level(logging.WARNING):
        assert read_cache(cache) == {}
    assert caplog.messages == [f"{cache}: {problem}; decoding again"]
