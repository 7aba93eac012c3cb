"""The WMT14 stream shows its progress: a tqdm bar of the rows read on standard error when it
is a terminal (with the total when the dataset gives one), none otherwise or under
``TQDM_DISABLE=1``, and a log line every ``STREAM_LOG_ROWS`` rows in any case."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from transformer_nmt.data import corpora

ROWS = 3000
README = f"""---
dataset_info:
- config_name: de-en
  features:
  - name: translation
    dtype:
      translation:
        languages:
        - de
        - en
  splits:
  - name: train
    num_examples: {ROWS}
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
---
"""


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """A local copy in the hub's layout whose README gives the split's row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hub")
    (root / "de-en").mkdir()
    pq.write_table(pa.table({"translation": [{"de": f"Satz {i}", "en": f"sentence {i}"}
                                             for i in range(ROWS)]}),
                   root / "de-en" / "train-00000-of-00001.parquet")
    (root / "README.md").write_text(README)
    return root


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stream(hub_folder: Path, tmp_path: Path, max_pairs: int | None = None) -> int:
    cfg = SimpleNamespace(hf_dataset=str(hub_folder), hf_config="de-en", src_lang="en",
                          tgt_lang="de", root=str(tmp_path), name="wmt14_en_de")
    return corpora._stream_hf(cfg, "train", (tmp_path / "train.en", tmp_path / "train.de"),
                              max_pairs)


def test_a_terminal_gets_a_bar_with_the_total(hub_folder, tmp_path, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert _stream(hub_folder, tmp_path) == ROWS
    shown = terminal.getvalue()
    assert "split train: 100%" in shown and "3.00k/3.00k" in shown, shown


def test_max_train_pairs_is_the_bar_total(hub_folder, tmp_path, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert _stream(hub_folder, tmp_path, max_pairs=2000) == 2000
    assert "2.00k/2.00k" in terminal.getvalue()


@pytest.mark.parametrize("terminal, disable", [(False, None), (True, "1")],
                         ids=["not_a_terminal", "TQDM_DISABLE"])
def test_no_bar_off_a_terminal_or_when_disabled(hub_folder, tmp_path, monkeypatch, terminal,
                                                 disable):
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    if disable is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", disable)
    assert _stream(hub_folder, tmp_path) == ROWS
    assert err.getvalue() == ""


def test_a_log_line_every_n_rows(hub_folder, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(corpora, "STREAM_LOG_ROWS", 1000)
    with caplog.at_level(logging.INFO, logger="transformer_nmt.data.hub"):
        assert _stream(hub_folder, tmp_path) == ROWS
    lines = [r.getMessage() for r in caplog.records if r.name == "transformer_nmt.data.hub"]
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{hub_folder} (de-en) split train: 1,000 rows of 3,000 (33 %), ")
    assert lines[-1].split(", ")[0].endswith("3,000 rows of 3,000 (100 %)")
