"""A fault of the WMT14 records or of their schema fails at once, naming the dataset, split,
row and field; only a failed read of the network is retried (from the saved position).

The dataset is a local folder in the hub's layout of ``wmt/wmt14`` (README configs and
parquet shards), read through the real ``datasets`` code; ``load_dataset`` is wrapped to
count how often the stream is opened (a retry opens it again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from transformer_nmt.data import corpora, hub
from transformer_nmt.errors import DataError

README = """---
configs:
{configs}
---
"""
CONFIG = """- config_name: {name}
  data_files:
  - split: train
    path: {name}/train-*
"""


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"translation": {"de": f"das Haus {i} .", "en": f"the house {i} ."}}
            for i in range(start, start + n)]


def _hub(root: Path, shards: dict[str, list[list[dict]]]) -> Path:
    """A folder in the hub's layout: ``<config>/train-0000k.parquet`` per shard, README."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for config, tables in shards.items():
        (root / config).mkdir(parents=True)
        for k, rows in enumerate(tables):
            column = list(rows[0])[0]
            table = pa.table({column: [r[column] for r in rows]})
            pq.write_table(table, root / config / f"train-{k:05d}-of-{len(tables):05d}.parquet")
    configs = "".join(CONFIG.format(name=c) for c in shards)
    (root / "README.md").write_text(README.format(configs=configs.rstrip("\n")))
    return root


def _cfg(folder: Path, root: Path, config: str | None = "de-en") -> SimpleNamespace:
    return SimpleNamespace(hf_dataset=str(folder), hf_config=config, src_lang="en",
                           tgt_lang="de", root=str(root), name="wmt14_en_de")


@pytest.fixture
def opened(monkeypatch) -> list[int]:
    """How many times the stream was opened (one entry per ``load_dataset`` call)."""
    import datasets

    real = datasets.load_dataset
    calls: list[int] = []

    def load(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load)
    return calls


def _stream(cfg: SimpleNamespace, tmp_path: Path) -> int:
    dest = (tmp_path / "out" / "train.en", tmp_path / "out" / "train.de")
    return corpora._stream_hf(cfg, "train", dest, None)


def _bad_rows(kind: str) -> list[dict]:
    rows = _rows(6)
    if kind == "null side":
        rows[3] = {"translation": {"de": None, "en": "the house 3 ."}}
    elif kind == "null translation":
        rows[3] = {"translation": None}
    elif kind == "text of another type":
        rows = [{"translation": {"de": i, "en": f"the house {i} ."}} for i in range(6)]
    return rows


@pytest.mark.parametrize("kind, row, field", [
    ("null side", 3, "field translation.de is null"),
    ("null translation", 3, "field translation is null"),
    ("text of another type", 0, "field translation.de is a int, not text"),
])
def test_a_bad_record_is_one_error_naming_the_row_and_field(tmp_path, opened, kind, row, field):
    folder = _hub(tmp_path / "hub", {"de-en": [_bad_rows(kind)]})
    with pytest.raises(DataError) as err:
        _stream(_cfg(folder, tmp_path), tmp_path)
    message = str(err.value)
    assert f"{folder} (de-en) split train, row {row} (counted from 0): {field}" in message
    assert "not retried" in message and "resume" not in message
    assert "\n" not in message
    assert len(opened) == 1  # opened once: no retry
    assert not list((tmp_path / "out").glob("*"))  # no partial file: nothing to resume


def test_a_missing_translation_column_is_one_error(tmp_path, opened):
    folder = _hub(tmp_path / "hub", {"de-en": [[{"pair": r["translation"]} for r in _rows(4)]]})
    with pytest.raises(DataError, match=r"row 0 \(counted from 0\): field translation is "
                                        r"missing \(the record has \['pair'\]\)"):
        _stream(_cfg(folder, tmp_path), tmp_path)
    assert len(opened) == 1


def test_a_schema_clash_between_shards_is_not_retried(tmp_path, opened):
    # the second shard's translation column is a string, not a struct: datasets cannot cast it
    folder = _hub(tmp_path / "hub", {"de-en": [_rows(5), [{"translation": "das Haus"}] * 3]})
    with pytest.raises(DataError, match=r"split train, row 5 \(counted from 0\): cannot read "
                                        r"the record: TypeError: Couldn't cast") as err:
        _stream(_cfg(folder, tmp_path), tmp_path)
    assert "not of the network, so it is not retried" in str(err.value)
    assert len(opened) == 1


def test_a_null_hf_config_is_one_error_naming_the_setting(tmp_path, opened):
    folder = _hub(tmp_path / "hub", {"de-en": [_rows(3)], "fr-en": [_rows(3)]})
    with pytest.raises(DataError, match=r"data\.hf_config is null .*set data\.hf_config to "
                                        r"one of the dataset's configurations") as err:
        _stream(_cfg(folder, tmp_path, config=None), tmp_path)
    assert "\n" not in str(err.value)
    assert len(opened) == 1


class _ServerError(Exception):
    """What the hub's clients raise for an HTTP status: the response rides along."""

    def __init__(self, status: int):
        super().__init__(f"{status} Server Error")
        self.response = SimpleNamespace(status_code=status)


def _failing_once(monkeypatch, error: Exception, after: int) -> None:
    """The first stream opened raises ``error`` after ``after`` rows; later ones are whole."""
    import datasets

    real, state = datasets.load_dataset, {"failed": False}

    class Stream:
        def __init__(self, inner):
            self.inner = inner

        def state_dict(self):
            return self.inner.state_dict()

        def load_state_dict(self, s):
            self.inner.load_state_dict(s)

        info = property(lambda self: self.inner.info)

        def __iter__(self):
            for k, rec in enumerate(self.inner):
                if k == after and not state["failed"]:
                    state["failed"] = True
                    raise error
                yield rec

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Stream(real(*a, **k)))


@pytest.mark.parametrize("status", [500, 503])
def test_http_5xx_in_the_stream_is_retried(tmp_path, monkeypatch, status):
    folder = _hub(tmp_path / "hub", {"de-en": [_rows(20)]})
    _failing_once(monkeypatch, _ServerError(status), after=7)
    assert _stream(_cfg(folder, tmp_path), tmp_path) == 20
    assert (tmp_path / "out" / "train.de").read_text().splitlines()[19] == "das Haus 19 ."


def test_http_4xx_in_the_stream_is_not_retried_as_a_network_failure(tmp_path, monkeypatch):
    folder = _hub(tmp_path / "hub", {"de-en": [_rows(20)]})
    _failing_once(monkeypatch, _ServerError(404), after=7)
    with pytest.raises(DataError, match=r"split train, row 7: the hub refused a read with "
                                        r"HTTP 404 \(_ServerError: 404 Server Error\), so it "
                                        r"is not retried"):
        _stream(_cfg(folder, tmp_path), tmp_path)


def test_errors_are_told_apart_by_type_and_cause():
    httpx2 = pytest.importorskip("httpx2")  # the hub's HTTP client (huggingface_hub >= 1)
    from huggingface_hub.errors import HfHubHTTPError

    def response(status: int):
        return httpx2.Response(status, request=httpx2.Request("GET", "https://hub.invalid/x"))

    assert hub.is_network_error(ConnectionResetError("reset"))
    assert hub.is_network_error(TimeoutError())
    assert hub.is_network_error(httpx2.ConnectError("unreachable"))
    assert hub.is_network_error(HfHubHTTPError("503", response=response(503)))
    assert not hub.is_network_error(HfHubHTTPError("404", response=response(404)))
    assert not hub.is_network_error(ValueError("connection reset"))  # the words do not count
    wrapped = ValueError("could not read a shard")
    wrapped.__cause__ = ConnectionResetError("reset")
    assert hub.is_network_error(wrapped)  # ... its cause does
    assert hub.is_data_error(TypeError("Couldn't cast")) and hub.is_data_error(KeyError("de"))
    assert not hub.is_data_error(OSError(28, "No space left on device"))


def test_nmt_prepare_prints_one_error_line_for_a_bad_record(tmp_path):
    folder = _hub(tmp_path / "hub", {"de-en": [_bad_rows("null side")]})
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.prepare", "experiment=wmt14_en_de_base",
         f"data.hf_dataset={folder}", f"data.root={tmp_path / 'data'}", "data.test_splits=[]",
         f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [proc.stderr.strip().splitlines()[-1]] and len(errors) == 1
    assert "row 3 (counted from 0): field translation.de is null" in errors[0]
    assert "retrying" not in proc.stderr + proc.stdout
    assert not (tmp_path / "data").exists()  # the folders it created are gone again
