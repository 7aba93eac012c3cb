"""Invalid UTF-8 in an official test reference: under ``data.encoding_errors=strict`` one
error naming the file, the 1-based line that holds the bad byte and the bytes around it;
under ``replace`` U+FFFD in its place and a warning naming the same line. The reference is
read by lines, so the line named is the line at fault, not the count of lines read so far."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DECODE_MODEL, new_model, write_checkpoint

from transformer_nmt.data.corpora import reference_path
from transformer_nmt.errors import DataError
from transformer_nmt.evaluate.bleu import read_text_lines
from transformer_nmt.evaluate.evaluate import evaluate

BAD_LINE = b"th\xe9 third  "
"""Line 3 of the references below: ``\\xe9`` is not UTF-8 (a Latin-1 e-acute)."""


def _five_lines(path: Path) -> Path:
    path.write_bytes(b"one\ntwo\n" + BAD_LINE + b"\nfour\nfive\n")
    return path


def test_strict_names_line_3_of_5_and_its_bytes(tmp_path):
    ref = _five_lines(tmp_path / "ref.de")
    with pytest.raises(DataError) as err:
        read_text_lines(ref)
    assert str(err.value) == (
        f"{ref}, line 3: invalid UTF-8 at byte 2 (b'th\\xe9 third  '): "
        "invalid continuation byte")


def test_strict_names_the_line_at_fault_deep_in_a_large_file(tmp_path):
    """Far beyond one read buffer: the line number is still the line's own."""
    ref = tmp_path / "ref.de"
    lines = [f"line {i} with some words to fill the buffer".encode() for i in range(1, 5001)]
    lines[3999] = b"caf\xc3 au lait"
    ref.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=rf"^{ref}, line 4000: invalid UTF-8 at byte 3 "):
        read_text_lines(ref)


def test_replace_substitutes_and_warns_naming_line_3(tmp_path, caplog):
    ref = _five_lines(tmp_path / "ref.de")
    with caplog.at_level(logging.WARNING):
        lines = read_text_lines(ref, "replace")
    assert lines == ["one", "two", "th\ufffd third", "four", "five"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"{ref}, line 3: invalid UTF-8 at byte 2 (b'th\\xe9 third  '): invalid continuation "
        "byte; replaced by U+FFFD")


@pytest.fixture(scope="module")
def bad_reference(workspace, tokenizer):
    """The decoding workspace with an averaged model and an official reference whose line 3
    (of 12) holds a byte that is not UTF-8."""
    root, cfg = workspace
    write_checkpoint(Path(cfg.run_dir) / "checkpoints" / "averaged.pt",
                     new_model(cfg, tokenizer.vocab_size, 1), cfg, 4)
    ref = reference_path(cfg.data, "test_2016_flickr", "de")
    lines = ref.read_bytes().split(b"\n")
    lines[2] = BAD_LINE
    ref.write_bytes(b"\n".join(lines))
    return root, cfg, ref


def test_evaluate_strict_names_the_reference_line(bad_reference):
    root, cfg, ref = bad_reference
    cfg.data.encoding_errors = "strict"
    with pytest.raises(DataError) as err:
        evaluate(cfg)
    assert str(err.value).startswith(f"{ref}, line 3: invalid UTF-8 at byte 2 ")
    assert str(err.value).endswith("; set data.encoding_errors=replace to substitute U+FFFD")
    assert not (Path(cfg.run_dir) / "results.json").exists()


def test_evaluate_replace_scores_and_warns_naming_the_reference_line(bad_reference, caplog):
    root, cfg, ref = bad_reference
    cfg.data.encoding_errors = "replace"
    with caplog.at_level(logging.WARNING):
        results = evaluate(cfg)
    assert f"{ref}, line 3: invalid UTF-8 at byte 2 " in caplog.text
    assert results["test_sets"]["test_2016_flickr"]["sentences"] == 12
    saved = json.loads((Path(cfg.run_dir) / "results.json").read_text())
    assert saved["test_sets"]["test_2016_flickr"]["reference"] == str(ref)


def test_nmt_evaluate_strict_is_one_error_line_naming_line_3(bad_reference, tmp_path):
    root, cfg, ref = bad_reference
    overrides = [
        f"data.root={cfg.data.root}", f"run_dir={cfg.run_dir}", "name=tiny",
        "data.vocab_size=60", "data.test_splits=[test_2016_flickr]", "decode.beam_size=2",
        "decode.max_len_b=6", *DECODE_MODEL, "data.encoding_errors=strict",
    ]
    proc = subprocess.run([sys.executable, "-m", "transformer_nmt.cli.evaluate", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {ref}, line 3: invalid UTF-8 at byte 2 (b'th\\xe9 third  '): invalid "
        "continuation byte; set data.encoding_errors=replace to substitute U+FFFD"]
    assert "Traceback" not in proc.stderr
