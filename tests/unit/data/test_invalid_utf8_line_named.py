"""The data stage's reader names the 1-based line of invalid UTF-8 under both settings of
``data.encoding_errors``: an error under ``strict``, a warning (the first line replaced in
the file) under ``replace``, for plain and gzip files alike."""

from __future__ import annotations

import gzip
import logging

import pytest

from transformer_nmt.errors import DataError
from transformer_nmt.fileio import read_lines

TEXT = b"one\ntwo\ncaf\xe9 au lait\nfour\nbad \xff again\n"
"""Five lines; line 3 is the first with a byte that is not UTF-8, line 5 the second."""


@pytest.fixture(params=["plain", "gzip"])
def bad_file(request, tmp_path):
    if request.param == "plain":
        path = tmp_path / "train.de"
        path.write_bytes(TEXT)
    else:
        path = tmp_path / "train.de.gz"
        path.write_bytes(gzip.compress(TEXT, mtime=0))
    return path


def test_strict_error_names_line_3_and_its_bytes(bad_file):
    with pytest.raises(DataError) as err:
        list(read_lines(bad_file))
    assert str(err.value) == (
        f"{bad_file}, line 3: invalid UTF-8 at byte 3 (b'caf\\xe9 au lait'): invalid "
        "continuation byte; set data.encoding_errors=replace to substitute U+FFFD")


def test_replace_warns_once_naming_the_first_line_replaced(bad_file, caplog):
    stats: dict = {}
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.fileio"):
        lines = list(read_lines(bad_file, "replace", stats))
    assert lines[2] == "caf\ufffd au lait" and lines[4] == "bad \ufffd again"
    assert stats["invalid_utf8_lines"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{bad_file}, line 3: invalid UTF-8 at byte 3 (b'caf\\xe9 au lait'): invalid "
        "continuation byte; replaced by U+FFFD (data.encoding_errors=replace), as is every "
        "invalid byte after it in this file"]
