"""A ``metrics.jsonl`` with a byte that is not UTF-8: ``nmt-plot`` names the line that holds
it (not a traceback, not the count of lines decoded so far); a last line cut short inside a
character by a kill is ignored like any other incomplete last line."""

from __future__ import annotations

import json
import logging

import pytest

from transformer_nmt.errors import DataError
from transformer_nmt.plot.curves import read_metrics


def _records(n: int) -> list[bytes]:
    return [json.dumps({"step": i, "split": "train", "loss": 1.0 / i}).encode()
            for i in range(1, n + 1)]


def test_invalid_utf8_names_line_3_of_5(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = _records(5)
    lines[2] = b'{"step": 3, "split": "tr\xe9in", "loss": 0.3}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError) as err:
        read_metrics(path)
    assert str(err.value).startswith(
        f"{path}, line 3: invalid UTF-8 at byte 24 (b'plit\": \"tr\\xe9in\", \"loss'): "
        "invalid continuation byte; ")


def test_a_last_line_cut_inside_a_character_is_ignored(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\n".join(_records(4)) + b'\n{"step": 5, "split": "tr\xc3')
    with caplog.at_level(logging.WARNING):
        history = read_metrics(path)
    assert [r["step"] for r in history["train"]] == [1, 2, 3, 4]
    assert f"{path}, line 5: incomplete last line ignored" in caplog.text
