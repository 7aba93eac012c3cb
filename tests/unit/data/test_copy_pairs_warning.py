"""nmt-prepare warns when the pairs would teach a model to copy its input: one file given for
both languages (a symlink or hard link), or a training split whose kept pairs are mostly
identical on both sides (more than ``clean.IDENTICAL_PAIRS_WARN``). A normal corpus gets no
such warning."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from transformer_nmt.config import compose
from transformer_nmt.data import clean
from transformer_nmt.data.prepare import prepare

EN = ["the", "a", "man", "woman", "dog", "cat", "runs", "walks", "park", "street", "red", "big"]
DE = ["der", "die", "mann", "frau", "hund", "katze", "läuft", "geht", "parkt", "straße", "rot",
      "groß"]


def _write(prefix: Path, n: int, seed: int, copies: int = 0) -> None:
    """``n`` pairs ``<prefix>.en`` / ``.de``, of which the first ``copies`` have the English
    sentence on both sides."""
    rng = random.Random(seed)
    src, tgt = [], []
    for i in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(3, 8))]
        src.append(" ".join(EN[j] for j in idx) + " .")
        tgt.append(src[-1] if i < copies else " ".join(DE[j] for j in idx) + " .")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


def _cfg(tmp_path: Path, copies: int = 0, n_train: int = 200):
    corpus = tmp_path / "corpus"
    _write(corpus / "train", n_train, seed=1, copies=copies)
    _write(corpus / "valid", 20, seed=2)
    _write(corpus / "test", 20, seed=3)
    return compose([
        "data=custom", "data.name=toy", "data.src_lang=en", "data.tgt_lang=de",
        f"data.root={tmp_path / 'data'}", "data.vocab_size=60", "data.num_workers=1",
        *(f"+data.custom_files.{split}={corpus / split}" for split in ("train", "valid", "test")),
    ]), corpus


def _copy_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "learn to copy" in r.getMessage()]


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_one_file_for_both_languages_is_one_warning_naming_it(tmp_path, caplog, link):
    cfg, corpus = _cfg(tmp_path)
    src, tgt = corpus / "train.en", corpus / "train.de"
    tgt.unlink()
    tgt.symlink_to(src) if link == "symlink" else os.link(src, tgt)
    with caplog.at_level(logging.WARNING):
        summary = prepare(cfg)
    assert _copy_warnings(caplog) == [
        f"split 'train': the source and target are one file ({src} and {tgt}): each of its "
        "200 pairs has its source as its target, so a model trained on it would learn to copy "
        "its input; name the file of the target language"]
    assert summary["pairs"]["train"]["identical"] == summary["pairs"]["train"]["kept"]


def test_mostly_identical_training_pairs_warn_with_count_and_fraction(tmp_path, caplog):
    cfg, corpus = _cfg(tmp_path, copies=120)
    with caplog.at_level(logging.WARNING):
        summary = prepare(cfg)
    kept = summary["pairs"]["train"]["kept"]
    same = summary["pairs"]["train"]["identical"]
    assert same == 120 and same / kept > clean.IDENTICAL_PAIRS_WARN
    expected = [
        f"split 'train': {same} of {kept} kept pairs ({100 * same / kept:.1f} %) have a source "
        f"identical to their target ({corpus / 'train.en'}, {corpus / 'train.de'}), so a model "
        "trained on them would learn to copy its input; check that the target file holds the "
        "translations"]
    assert _copy_warnings(caplog) == expected
    # every run says it, also when every stage is skipped
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = prepare(cfg)
    assert {v["status"] for v in again["stages"].values()} == {"skipped"}
    assert _copy_warnings(caplog) == expected


@pytest.mark.parametrize("copies", [0, 80])
def test_a_normal_corpus_or_a_few_copies_give_no_warning(tmp_path, caplog, copies):
    cfg, _ = _cfg(tmp_path, copies=copies)
    with caplog.at_level(logging.WARNING):
        summary = prepare(cfg)
    assert summary["pairs"]["train"]["identical"] == copies
    assert _copy_warnings(caplog) == []
