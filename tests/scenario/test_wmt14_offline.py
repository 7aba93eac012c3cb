"""WMT14 without network: ``nmt-prepare`` says at once how to run offline (no retries of a
host that cannot be resolved) and leaves no folder it created; a local copy named by
``data.hf_dataset`` (the hub's files, or a ``save_to_disk`` folder) and a filled Hugging Face
cache both work.

The hub's host is made unresolvable with ``HF_ENDPOINT=https://hub.invalid`` (the ``.invalid``
top-level domain never resolves), so these tests behave the same with or without network."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transformer_nmt.config import compose
from transformer_nmt.data import corpora

UNRESOLVABLE = "https://hub.invalid"
ROWS = {"train": 40, "validation": 8}
README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
---
"""


def _pairs(split: str) -> list[dict[str, str]]:
    return [{"de": f"{split} Satz {i} .", "en": f"{split} sentence {i} ."}
            for i in range(ROWS[split])]


def _hub_copy(root: Path) -> Path:
    """What ``hf download wmt/wmt14 --repo-type dataset --local-dir <root>`` gives, in small:
    README with the configs, one parquet shard per split with one ``translation`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "de-en").mkdir(parents=True)
    for split in ROWS:
        pq.write_table(pa.table({"translation": _pairs(split)}),
                       root / "de-en" / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(README)
    return root


def _saved_copy(root: Path) -> Path:
    """What ``load_dataset("wmt/wmt14", "de-en").save_to_disk(<root>)`` gives, in small."""
    import datasets

    datasets.DatasetDict({split: datasets.Dataset.from_dict({"translation": _pairs(split)})
                          for split in ROWS}).save_to_disk(str(root))
    return root


def _fetched(cfg) -> dict[str, list[str]]:
    sources, did_work = corpora.fetch(cfg.data)
    assert did_work
    return {f"{s.split}.{lang}": path.read_text(encoding="utf-8").splitlines()
            for s in sources for lang, path in (("en", s.src), ("de", s.tgt))}


def _expected() -> dict[str, list[str]]:
    return {f"{ours}.{lang}": [p[lang] for p in _pairs(theirs)]
            for ours, theirs in (("train", "train"), ("newstest2013", "validation"))
            for lang in ("en", "de")}


@pytest.fixture
def no_hub(monkeypatch):
    """The hub's host does not resolve; the Hugging Face cache is empty unless filled."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", UNRESOLVABLE)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)


@pytest.mark.parametrize("copy", [_hub_copy, _saved_copy], ids=["hub_files", "save_to_disk"])
def test_a_local_copy_named_by_hf_dataset_is_read(tmp_path, no_hub, copy):
    folder = copy(tmp_path / "wmt14")
    cfg = compose(["data=wmt14_en_de", f"data.hf_dataset={folder}", "data.test_splits=[]",
                   f"data.root={tmp_path / 'data'}"])
    assert _fetched(cfg) == _expected()


def test_without_network_a_filled_cache_is_read_and_the_hub_not_asked(tmp_path, monkeypatch,
                                                                       no_hub, caplog):
    import datasets
    import datasets.config

    # Fill the cache as an earlier online load_dataset("wmt/wmt14", "de-en") does: prepared
    # Arrow files under <cache>/wmt___wmt14/de-en/<version>/<hash>/.
    cache = tmp_path / "hf_cache"
    datasets.load_dataset(str(_hub_copy(tmp_path / "wmt14")), "de-en", cache_dir=str(cache))
    (cache / "wmt14").rename(cache / "wmt___wmt14")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    cfg = compose(["data=wmt14_en_de", "data.test_splits=[]", f"data.root={tmp_path / 'data'}"])
    assert cfg.data.hf_dataset == "wmt/wmt14"
    with caplog.at_level(logging.WARNING, logger="huggingface_hub"):
        assert _fetched(cfg) == _expected()
    asked = [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]
    assert asked == []  # no request (and so no "Retrying in 1s [Retry 1/5]")


def _prepare_offline(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_ENDPOINT=UNRESOLVABLE, HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.prepare", "experiment=wmt14_en_de_base",
         f"run_dir={tmp_path / 'run'}", *overrides],
        capture_output=True, text=True, env=env, timeout=300, check=False)


def test_offline_prepare_says_how_to_run_offline_at_once_and_leaves_nothing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the user's own file\n")
    start = time.monotonic()
    proc = _prepare_offline(tmp_path, f"data.root={data}")
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: hub.invalid cannot be resolved (no network?) and wmt/wmt14 "
                           "(de-en) is not in the Hugging Face cache; to run without network")
    assert "data.hf_dataset=<folder>" in last and "HF_HUB_OFFLINE=1" in last
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [last]
    assert "Retry" not in out and "retrying" not in out  # the hub was not asked at all
    assert seconds < 60, f"took {seconds:.0f} s"
    # the folders the command created are gone, the user's folder and file are not
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "run").exists()


def test_offline_prepare_from_a_local_copy_works(tmp_path):
    folder = _hub_copy(tmp_path / "wmt14")
    proc = _prepare_offline(tmp_path, f"data.root={tmp_path / 'data'}",
                            f"data.hf_dataset={folder}", "data.test_splits=[]",
                            "data.vocab_size=60")
    assert proc.returncode == 0, proc.stderr
    orig = tmp_path / "data" / "raw" / "wmt14_en_de" / "orig"
    assert (orig / "train.de").read_text().splitlines() == [p["de"] for p in _pairs("train")]


def test_a_test_set_of_sacrebleu_without_network_says_what_to_do(tmp_path, monkeypatch):
    import socket
    import urllib.error

    import sacrebleu.utils

    def offline(*args, **kwargs):
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    monkeypatch.setattr(sacrebleu.utils, "download_test_set", offline)
    cfg = compose(["data=wmt14_en_de", f"data.hf_dataset={_hub_copy(tmp_path / 'wmt14')}",
                   "data.test_splits=[newstest2014]", f"data.root={tmp_path / 'data'}"])
    with pytest.raises(corpora.DataError, match=r"could not get sacreBLEU test set wmt14/full "
                                                r"\(en-de\): URLError: .*; without network, "
                                                r"copy sacreBLEU's folder"):
        corpora.fetch(cfg.data)
