"""WMT14 through the real `datasets` code path, on a local folder in the hub's layout of
`wmt/wmt14` (parquet shards per config, a `translation` column, train/validation/test splits),
and the stream's resume after a failed read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from transformer_nmt.data import corpora

BIN = Path(sys.executable).parent
SPLIT_ROWS = {"train": 1200, "validation": 60, "test": 80}
HUB_README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
---
"""


def _pair(split: str, i: int) -> dict[str, str]:
    nouns = ["house", "dog", "tree", "car", "child", "city", "river", "book"]
    verbs = [("sees", "sieht"), ("has", "hat"), ("finds", "findet")]
    de_nouns = ["Haus", "Hund", "Baum", "Auto", "Kind", "Stadt", "Fluss", "Buch"]
    a, b, v = i % 8, (i // 8) % 8, (i // 64) % 3
    return {"en": f"the {nouns[a]} {verbs[v][0]} the {nouns[b]} {i % 97} .",
            "de": f"das {de_nouns[a]} {verbs[v][1]} das {de_nouns[b]} {i % 97} ."}


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """`wmt/wmt14` as the hub stores it (README configs + parquet shards), a few thousand rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("wmt14_hub")
    (root / "de-en").mkdir()
    for split, rows in SPLIT_ROWS.items():
        shards = 3 if split == "train" else 1
        per = rows // shards
        for k in range(shards):
            table = pa.table({"translation": [_pair(split, k * per + i) for i in range(per)]})
            pq.write_table(table, root / "de-en" / f"{split}-{k:05d}-of-{shards:05d}.parquet")
    (root / "README.md").write_text(HUB_README)
    return root


def _data_cfg(hub: Path, root: Path) -> SimpleNamespace:
    return SimpleNamespace(hf_dataset=str(hub), hf_config="de-en", src_lang="en", tgt_lang="de",
                           root=str(root), name="wmt14_en_de")


class _Flaky:
    """A `datasets` stream that raises ConnectionError after `fail_after` rows (once per
    instance) and counts the rows it hands out."""

    served = 0

    def __init__(self, inner, fail_after: int | None):
        self.inner, self.fail_after = inner, fail_after

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)

    def state_dict(self):
        return self.inner.state_dict()

    def __iter__(self):
        for k, rec in enumerate(self.inner):
            if self.fail_after is not None and k == self.fail_after:
                raise ConnectionError("connection reset by peer")
            _Flaky.served += 1
            yield rec


def _patch_stream(monkeypatch, fail_after: list[int | None]):
    """Each call of load_dataset returns the real stream, failing after fail_after[i] rows."""
    import datasets

    real = getattr(datasets.load_dataset, "unpatched", datasets.load_dataset)
    calls = iter(fail_after)

    def load(*args, **kwargs):
        return _Flaky(real(*args, **kwargs), next(calls, None))

    load.unpatched = real
    monkeypatch.setattr(datasets, "load_dataset", load)
    _Flaky.served = 0


def _expected(split: str) -> tuple[list[str], list[str]]:
    rows = [_pair(split, i) for i in range(SPLIT_ROWS[split])]
    return [r["en"] for r in rows], [r["de"] for r in rows]


def test_failed_read_is_retried_from_the_saved_position(hub_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "STREAM_CHECKPOINT_ROWS", 250)
    _patch_stream(monkeypatch, [700])  # the first read dies at row 700; the retry goes on
    dest = (tmp_path / "train.en", tmp_path / "train.de")
    n = corpora._stream_hf(_data_cfg(hub_folder, tmp_path), "train", dest, None)
    assert n == SPLIT_ROWS["train"]
    en, de = _expected("train")
    assert dest[0].read_text().splitlines() == en and dest[1].read_text().splitlines() == de
    # 700 rows before the failure, then from the position saved at row 500.
    assert _Flaky.served == 700 + SPLIT_ROWS["train"] - 500
    assert not list(tmp_path.glob("*.partial*"))


def test_interrupted_stream_resumes_in_the_next_run(hub_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "STREAM_CHECKPOINT_ROWS", 250)
    monkeypatch.setattr(corpora, "STREAM_RETRIES", 1)
    dest = (tmp_path / "train.en", tmp_path / "train.de")
    cfg = _data_cfg(hub_folder, tmp_path)
    _patch_stream(monkeypatch, [900, 300])  # the first read (row 900) and its retry (row 1050) fail
    with pytest.raises(corpora.DataError, match="resume at row 1,000"):
        corpora._stream_hf(cfg, "train", dest, None)
    assert not dest[0].exists()  # nothing half-written where the next stage looks
    _patch_stream(monkeypatch, [None])
    assert corpora._stream_hf(cfg, "train", dest, None) == SPLIT_ROWS["train"]
    assert _Flaky.served == SPLIT_ROWS["train"] - 1000  # rows 0-999 were not read again
    en, de = _expected("train")
    assert dest[0].read_text().splitlines() == en and dest[1].read_text().splitlines() == de


def test_partial_stream_of_another_source_is_not_resumed(hub_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "STREAM_CHECKPOINT_ROWS", 250)
    monkeypatch.setattr(corpora, "STREAM_RETRIES", 0)
    dest = (tmp_path / "train.en", tmp_path / "train.de")
    _patch_stream(monkeypatch, [600])
    with pytest.raises(corpora.DataError):
        corpora._stream_hf(_data_cfg(hub_folder, tmp_path), "train", dest, None)
    other = _data_cfg(hub_folder, tmp_path)
    other.tgt_lang, other.src_lang = "en", "de"  # the reverse direction: start from row 0
    _patch_stream(monkeypatch, [None])
    assert corpora._stream_hf(other, "train", dest, None) == SPLIT_ROWS["train"]
    assert _Flaky.served == SPLIT_ROWS["train"]
    assert dest[0].read_text().splitlines() == _expected("train")[1]


def _run(module: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_prepare_train_evaluate_from_hub_layout(hub_folder, tmp_path):
    run_dir = tmp_path / "runs" / "wmt14"
    common = [
        "experiment=wmt14_en_de_base", f"data.hf_dataset={hub_folder}",
        f"data.root={tmp_path / 'data'}", "data.vocab_size=120", "data.num_workers=1",
        "data.test_splits=[newstest2013]", f"run_dir={run_dir}", "name=wmt14",
        "model=tiny", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32",
        "model.d_ff=64", "model.heads=2", "trainer.max_tokens=512", "trainer.update_freq=1",
        "trainer.tokens_per_step=null",
        "trainer.max_steps=4", "trainer.save_every_steps=2", "trainer.save_every_minutes=null",
        "trainer.validate_every_steps=4", "trainer.precision=fp32", "average.last=2",
        "decode.max_len_b=5",
    ]
    _run("prepare", common, tmp_path)
    orig = tmp_path / "data" / "raw" / "wmt14_en_de" / "orig"
    assert (orig / "newstest2013.en").read_text().splitlines() == _expected("validation")[0]
    assert (orig / "newstest2013.de").read_text().splitlines() == _expected("validation")[1]
    assert len((orig / "train.en").read_text().splitlines()) == SPLIT_ROWS["train"]

    _run("train", common, tmp_path)
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 4
    _run("average", common, tmp_path)
    _run("evaluate", common, tmp_path)
    # newstest2014 comes from sacreBLEU's copy (no network here): score newstest2013 instead.
    scores = json.loads((run_dir / "results.json").read_text())["test_sets"]["newstest2013"]
    assert scores["sentences"] == SPLIT_ROWS["validation"]
    hyps = (run_dir / "translations" / "newstest2013.de").read_text().splitlines()
    assert len(hyps) == SPLIT_ROWS["validation"]
