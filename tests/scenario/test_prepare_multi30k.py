"""The data stage end to end on real text: nmt-prepare's function on a 2,000-pair slice of
Multi30k (the mirror fixture), every file read back, a second run that writes nothing, a changed
setting that redoes what depends on it, and the console script on the prepared data."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

from transformer_nmt.config import compose
from transformer_nmt.data import clean, corpora
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.data.bpe import SentencePieceTokenizer
from transformer_nmt.data.prepare import prepare, summary_path
from transformer_nmt.fileio import bin_prefix, raw_path, spm_model_path


def test_prepare_real_multi30k_slice_end_to_end(tmp_path, multi30k_mirror):
    root = tmp_path / "data"
    cfg = compose(["data=multi30k_en_de", f"data.root={root}", f"data.mirror={multi30k_mirror}",
                   "data.max_train_pairs=2000", "data.vocab_size=500"])
    summary = prepare(cfg)
    d = cfg.data
    train = summary["pairs"]["train"]
    assert train["read"] == 2000 and train["kept"] == 2000 - sum(train["dropped"].values())
    assert summary["vocab_size"] == 500
    assert summary["sentences"] == {"train": train["kept"], "valid": 1014,
                                    "test_2016_flickr": 1000, "test_2017_flickr": 1000}
    assert 0.5 < summary["padding_efficiency"]["value"] <= 1.0
    assert json.loads(summary_path(d).read_text())["tokens"] == summary["tokens"]
    tok = SentencePieceTokenizer(spm_model_path(d))
    for split in ("train", "test_2017_flickr"):
        for lang in ("en", "de"):
            ds = TokenDataset(bin_prefix(d, split, lang))
            lines = raw_path(d, split, lang).read_text(encoding="utf-8").splitlines()
            assert len(ds) == len(lines) and int(ds.sizes.sum()) == summary["tokens"][split][lang]
            for i in range(0, len(lines), 97):
                assert tok.decode(ds[i]) == lines[i]  # no unk: decoding gives the text back
    # the test sets are normalised but never filtered: line i is the official line i
    with gzip.open(multi30k_mirror / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        official = [clean.normalize(x, d.unicode_form) for x in f.read().splitlines()]
    reference = raw_path(d, "test_2016_flickr", "de")
    assert reference.read_text(encoding="utf-8").splitlines() == official

    outputs = [p for p in root.rglob("*") if p.is_file() and p != summary_path(d)]
    mtimes = {p: p.stat().st_mtime_ns for p in outputs}
    again = prepare(cfg)
    assert {k: v["status"] for k, v in again["stages"].items()} == dict.fromkeys(
        ("download", "clean", "bpe", "binarize"), "skipped")
    assert {p: p.stat().st_mtime_ns for p in outputs} == mtimes
    assert again["tokens"] == summary["tokens"]

    # a changed setting redoes the stages that depend on it
    cfg.data.max_ratio = 3.0
    third = prepare(cfg)
    assert third["stages"]["clean"]["status"] == "done"
    assert third["pairs"]["train"]["dropped"]["ratio"] <= train["dropped"]["ratio"]

    # the console script, on the prepared data: every stage skipped, summary printed
    env = {**os.environ, corpora.MIRROR_ENV: str(multi30k_mirror)}
    out = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.prepare", "data=multi30k_en_de",
         f"data.root={root}", "data.max_train_pairs=2000", "data.vocab_size=500",
         "data.max_ratio=3.0", f"run_dir={tmp_path / 'run'}"],
        check=False, capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "padding efficiency" in out.stdout and "binarize skipped" in out.stdout
