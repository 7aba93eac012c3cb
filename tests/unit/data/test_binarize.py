"""Training pairs are filtered by piece count after BPE (model.max_positions,
trainer.max_tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset, filter_long_pairs, max_train_tokens
from transformer_nmt.fileio import bin_prefix


def _write(prefix, sentences):
    sizes = np.array([len(s) for s in sentences], dtype=np.int64)
    np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes)]).tofile(f"{prefix}.idx")
    np.concatenate([np.asarray(s, np.uint16) for s in sentences]).tofile(f"{prefix}.bin")


def test_filter_drops_pairs_too_long_on_either_side(tmp_path):
    src = [[5] * 3, [6] * 9, [7] * 2, [8] * 4, [9] * 1]
    tgt = [[10] * 2, [11] * 2, [12] * 8, [13] * 4, [14] * 5]
    _write(tmp_path / "s", src)
    _write(tmp_path / "t", tgt)
    assert max_train_tokens(max_positions=6, max_tokens=4096) == 5  # + eos / bos = 6 positions
    assert max_train_tokens(max_positions=1024, max_tokens=5) == 4  # + eos fits a 5-token batch
    result = filter_long_pairs(tmp_path / "s", tmp_path / "t", max_len=5, block=2)
    assert result == {"max_len": 5, "kept": 3, "dropped": 2}
    s, t = TokenDataset(tmp_path / "s"), TokenDataset(tmp_path / "t")
    assert [list(s[i]) for i in range(len(s))] == [[5] * 3, [8] * 4, [9]]
    assert [list(t[i]) for i in range(len(t))] == [[10] * 2, [13] * 4, [14] * 5]
    # what is left fits one batch of max_tokens = max_len + 1 alone
    LengthBucketSampler(s.sizes, t.sizes, 6)
    again = filter_long_pairs(tmp_path / "s", tmp_path / "t", max_len=5)
    assert again["dropped"] == 0


def test_prepare_filters_by_tokens_and_rebuilds_when_the_limit_changes(tmp_path, multi30k_mirror):
    from transformer_nmt.data.prepare import prepare

    base = ["experiment=multi30k_en_de", f"data.root={tmp_path}", f"data.mirror={multi30k_mirror}",
            "data.max_train_pairs=300", "data.vocab_size=200", "data.num_workers=1"]
    loose = prepare(compose(base))
    assert loose["token_filter"]["dropped"] == 0
    n_all = loose["sentences"]["train"]

    tight = compose([*base, "model.max_positions=16"])
    summary = prepare(tight)
    tf = summary["token_filter"]
    assert tf["max_len"] == 15 and tf["dropped"] > 0
    assert summary["stages"]["binarize"]["status"] == "done"
    d = tight.data
    src = TokenDataset(bin_prefix(d, d.train_split, d.src_lang))
    tgt = TokenDataset(bin_prefix(d, d.train_split, d.tgt_lang))
    assert len(src) == len(tgt) == n_all - tf["dropped"] == summary["sentences"]["train"]
    assert src.sizes.max() <= 15 and tgt.sizes.max() <= 15
    # the same limit again: nothing rebuilt, the count still reported
    same = prepare(tight)
    assert same["stages"]["binarize"]["status"] == "skipped"
    assert same["token_filter"]["dropped"] == tf["dropped"]
    # back to the loose limit: the training split is rebuilt with every pair
    back = prepare(compose(base))
    assert back["sentences"]["train"] == n_all and back["token_filter"]["dropped"] == 0


@pytest.mark.parametrize("policy,skip", [("error", False), ("skip", True)])
def test_trainer_too_long_policy_reaches_the_sampler(tmp_path, monkeypatch, policy, skip):
    import torch

    from transformer_nmt.train import distributed
    from transformer_nmt.train import setup as train_setup

    seen = {}

    def recording(*args, **kwargs):
        seen["skip_too_long"] = kwargs.get("skip_too_long")
        raise RuntimeError("sampler built")

    fake_split = type("Split", (), {"src_sizes": [1], "tgt_sizes": [1]})()
    monkeypatch.setattr(train_setup, "LengthBucketSampler", recording)
    monkeypatch.setattr(train_setup, "check_data", lambda cfg: None)
    monkeypatch.setattr(train_setup, "SentencePieceTokenizer",
                        lambda path: type("Tok", (), {"vocab_size": 8})())
    monkeypatch.setattr(train_setup, "load_split", lambda cfg, split: fake_split)
    cfg = compose(["experiment=multi30k_en_de", f"trainer.too_long={policy}",
                   f"data.root={tmp_path}"])
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="sampler built"):
        train_setup.setup(cfg, info)
    assert seen["skip_too_long"] is skip
