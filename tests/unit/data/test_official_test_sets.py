"""A truncated official test set is refused: nmt-prepare checks sacreBLEU's copy of
newstest2014 against its official line count, and nmt-evaluate a prepared copy."""

from __future__ import annotations

import copy
import sys
import types
from pathlib import Path

import pytest
from helpers import new_model, sentences, write_checkpoint

from transformer_nmt.config import compose
from transformer_nmt.data import corpora
from transformer_nmt.data.corpora import DataError, official_lines, reference_path
from transformer_nmt.errors import UserError
from transformer_nmt.evaluate.evaluate import evaluate
from transformer_nmt.fileio import raw_path


def _fake_sacrebleu(monkeypatch, tmp_path: Path, lines: int) -> None:
    """sacreBLEU's download_test_set serving a copy of ``lines`` lines (no network)."""
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(f"source {i}\n" for i in range(lines)))
    ref.write_text("".join(f"Quelle {i}\n" for i in range(lines)))
    utils = types.SimpleNamespace(download_test_set=lambda test_set, langpair: [str(src), str(ref)])
    monkeypatch.setitem(sys.modules, "sacrebleu.utils", utils)
    import sacrebleu

    monkeypatch.setattr(sacrebleu, "utils", utils, raising=False)


def _wmt14_cfg(root: Path, *extra: str):
    return compose(["experiment=wmt14_en_de_base", f"data.root={root}", "data.max_train_pairs=10",
                    "data.test_splits=[newstest2014]", *extra])


def test_the_official_counts():
    assert official_lines(compose(["experiment=wmt14_en_de_base"]).data, "newstest2014") == 3003
    assert official_lines(compose(["experiment=wmt14_en_de_base"]).data,
                          "newstest2014_filtered") == 2737
    assert official_lines(compose(["experiment=wmt14_en_fr_base"]).data, "newstest2014") == 3003
    assert official_lines(compose([]).data, "test_2016_flickr") is None  # Multi30k


@pytest.mark.parametrize("lines, ok", [(1500, False), (3003, True)])
def test_prepare_refuses_a_truncated_newstest2014(monkeypatch, tmp_path, lines, ok):
    _fake_sacrebleu(monkeypatch, tmp_path, lines)
    cfg = _wmt14_cfg(tmp_path / "data")
    monkeypatch.setattr(corpora, "splits", lambda data_cfg: ["newstest2014"])
    if ok:
        sources, _ = corpora._fetch_wmt14(cfg.data)
        assert len(sources[0].src.read_text().splitlines()) == 3003
        return
    with pytest.raises(DataError, match=(
            "^WMT14 newstest2014 .en-de. has 1500 lines, not the official 3003: the downloaded "
            "copy is truncated or damaged; delete it")):
        corpora._fetch_wmt14(cfg.data)
    orig = corpora.orig_dir(cfg.data)
    assert not list(orig.glob("newstest2014*"))  # nothing a later run would take as done


def test_evaluate_refuses_a_prepared_newstest2014_that_is_short(workspace, tokenizer, tmp_path):
    _, cfg = workspace
    cfg = copy.deepcopy(cfg)
    cfg.data.corpus = "wmt14"
    cfg.data.test_splits = ["newstest2014"]
    cfg.run_dir = str(tmp_path / "run")
    for lang in ("en", "de"):
        raw_path(cfg.data, "newstest2014", lang).write_text("\n".join(sentences(12, 1)) + "\n")
    reference_path(cfg.data, "newstest2014", "de").write_text("\n".join(sentences(12, 2)) + "\n")
    ckpt = tmp_path / "model.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 1), cfg, 1)
    cfg.decode.checkpoint = str(ckpt)
    ref = reference_path(cfg.data, "newstest2014", "de")
    with pytest.raises(UserError, match=(
            f"^{ref} has 12 lines, not the 3003 of the official newstest2014: it was prepared "
            "from a truncated copy; delete .*newstest2014.json and run nmt-prepare again")):
        evaluate(cfg)
    assert not (tmp_path / "run" / "results.json").exists()
