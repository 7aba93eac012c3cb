"""What nmt-table reads: each real results.json once, however many paths reach it (a
`runs/latest` symlink, a link loop, a link to the parent); only regular files (a FIFO or
/dev/zero named results.json is skipped with one line, never read)."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest

from tests.unit.run.test_results import _good
from transformer_nmt.evaluate.report import build_report, load_results
from transformer_nmt.evaluate.results_glob import find_results_files


@pytest.fixture
def alarm():
    """Fail a test that blocks (a FIFO opened for reading, a walk around a link loop) instead of
    hanging the suite."""
    def fire(*_):
        raise TimeoutError("blocked reading the results files")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _write(path: Path, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_good(name)))
    return path


def test_each_real_results_file_is_counted_once_and_loops_are_not_followed(
        tmp_path, monkeypatch, alarm, caplog):
    monkeypatch.chdir(tmp_path)
    smoke = _write(Path("runs/smoke/results.json"), "smoke")
    deep = _write(Path("runs/a/b/results.json"), "deep")
    _write(Path("elsewhere/results.json"), "outside")
    os.symlink("smoke", "runs/latest")  # a second path to one run
    os.symlink(".", "runs/loop")  # a link loop
    os.symlink("..", "runs/a/back")  # a loop one level down
    os.symlink("..", "runs/up")  # a link to the parent: outside runs/
    os.link(smoke, "runs/a/hard.json")
    with caplog.at_level(logging.INFO):
        results = load_results("runs/**/results.json")
    assert [r["_path"] for r in results] == [str(deep), str(smoke)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(warnings) == [
        f"not following runs/a/back: a link to {tmp_path / 'runs'}, which holds runs/a (a loop)",
        f"not following runs/loop: a link to {tmp_path / 'runs'}, which holds runs (a loop)",
        f"not following runs/up: a link to {tmp_path}, which holds runs (a loop)",
    ]
    # One level of wildcard reaches the run through both names: counted once, by its own.
    assert find_results_files("runs/*/results.json") == [str(smoke)]
    # A hard link: one file, the first of its names.
    assert find_results_files("runs/**/*.json") == [str(deep), "runs/a/hard.json"]


def test_a_fifo_or_device_named_results_json_is_skipped_not_read(tmp_path, alarm, caplog):
    good = _write(tmp_path / "runs" / "good" / "results.json", "good")
    fifo = tmp_path / "runs" / "fifo" / "results.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    zero = tmp_path / "runs" / "zero" / "results.json"
    zero.parent.mkdir()
    os.symlink("/dev/zero", zero)
    with caplog.at_level(logging.WARNING):
        results = load_results(str(tmp_path / "runs" / "**" / "results.json"))
    assert [r["_path"] for r in results] == [str(good)]
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"skipping {fifo}: not a regular file (a FIFO); evaluate the run again (nmt-evaluate) "
        "or move the file away",
        f"skipping {zero}: not a regular file (a character device); evaluate the run again "
        "(nmt-evaluate) or move the file away",
    ]


def test_deep_nesting_or_a_huge_number_skips_that_file_not_the_table(tmp_path, caplog):
    good = _write(tmp_path / "runs" / "good" / "results.json", "good")
    huge = _good("huge")
    huge["model"]["params"] = 10 ** 400  # too large for a float: p / 1e6 overflows
    files = {"deep": "[" * 100_000 + "]" * 100_000, "huge": json.dumps(huge),
             "beyond_int": json.dumps(_good("x")).replace('"steps": 10', '"steps": ' + "9" * 5000)}
    for name, text in files.items():
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "results.json").write_text(text)
    with caplog.at_level(logging.WARNING):
        results = load_results(str(tmp_path / "runs" / "*" / "results.json"))
    assert [r["_path"] for r in results] == [str(good)]
    runs = tmp_path / "runs"
    advice = "; evaluate the run again (nmt-evaluate) or move the file away"
    assert sorted(caplog.messages) == [
        f"skipping {runs}/beyond_int/results.json: holds a number too large for a float (5000 "
        f"digits){advice}",
        f"skipping {runs}/deep/results.json: nested deeper than 64 levels{advice}",
        f"skipping {runs}/huge/results.json: holds a number too large for a float (401 digits)"
        f"{advice}",
    ]
    assert "| good |" in build_report(results)


def _impossible(how: str) -> tuple[dict, str]:
    r = _good(how)
    test = r["test_sets"]["test"]
    if how == "bleu -50":
        test["bleu"]["sacrebleu"]["score"] = -50
        return r, "test_sets.test.bleu.sacrebleu.score is -50, outside 0 to 100"
    if how == "bleu 250":
        test["bleu"]["paper_bleu"]["score"] = 250.0
        return r, "test_sets.test.bleu.paper_bleu.score is 250.0, outside 0 to 100"
    if how == "chrf 101":
        test["chrf"]["score"] = 101
        return r, "test_sets.test.chrf.score is 101, outside 0 to 100"
    if how == "steps -1":
        r["steps"] = -1
        return r, "steps is -1, not a count (0 to 1e+15)"
    if how == "steps 300 digits":
        r["steps"] = 10 ** 299
        return r, "steps is 100000000000… (300 characters), not a count (0 to 1e+15)"
    if how == "params -5":
        r["model"]["params"] = -5
        return r, "model.params is -5, below 0"
    if how == "sentences -3":
        test["sentences"] = -3
        return r, "test_sets.test.sentences is -3, not a count (0 to 1e+15)"
    raise AssertionError(how)


IMPOSSIBLE = ["bleu -50", "bleu 250", "chrf 101", "steps -1", "steps 300 digits", "params -5",
              "sentences -3"]


def test_impossible_values_skip_their_file_naming_it_and_the_value(tmp_path, caplog):
    good = _write(tmp_path / "runs" / "good" / "results.json", "good")
    for how in IMPOSSIBLE:
        path = tmp_path / "runs" / how.replace(" ", "_") / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps(_impossible(how)[0]))
    with caplog.at_level(logging.WARNING):
        results = load_results(str(tmp_path / "runs" / "*" / "results.json"))
    assert [r["_path"] for r in results] == [str(good)]
    advice = "; evaluate the run again (nmt-evaluate) or move the file away"
    assert sorted(caplog.messages) == sorted(
        f"skipping {tmp_path}/runs/{how.replace(' ', '_')}/results.json: "
        f"{_impossible(how)[1]}{advice}" for how in IMPOSSIBLE)


def test_names_with_a_pipe_or_a_line_break_stay_in_their_cell(tmp_path):
    path = _write(tmp_path / "runs" / "x" / "results.json", "a|b\n# injected\r\n| c")
    obj = json.loads(path.read_text())
    obj["test_sets"] = {"te|st\nx": obj["test_sets"]["test"]}
    obj["data"]["name"] = "d|\u2028e"
    path.write_text(json.dumps(obj))
    report = build_report(load_results(str(tmp_path / "runs" / "*" / "results.json")))
    rows = [line for line in report.splitlines() if line.startswith("| a")]
    assert rows == [r"| a\|b # injected \| c | d\| e (en-de) | tiny | 0.0M | 10 | none | te\|st x "
                    "| 30.00 | – | 31.50 | 30.00 | – | – |"]
    assert not any(line.startswith(("# injected", "| c")) for line in report.splitlines())


def test_when_every_file_is_skipped_the_table_says_how_many_and_why(tmp_path, caplog):
    from transformer_nmt.config import compose
    from transformer_nmt.evaluate.report import write_report

    for how in ("bleu -50", "bleu 250", "steps -1"):
        path = tmp_path / "runs" / how.replace(" ", "_") / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_impossible(how)[0]))
    cfg = compose([f"table.results_glob={tmp_path}/runs/**/results.json",
                   f"table.output={tmp_path}/results.md"])
    with caplog.at_level(logging.WARNING):
        write_report(cfg)
    assert caplog.messages[-1] == (
        f"3 results files match {tmp_path}/runs/**/results.json, and every one was skipped "
        "(outside 0 to 100: 2 files; not a count: 1 file; each named above); writing the "
        "paper's numbers only")
