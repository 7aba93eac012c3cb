"""The weight ports of the benchmarks (scripts/bench/bench_common.py): a tiny random model ported
into Hugging Face's MarianMTModel and fairseq's TransformerModel gives our logits within 1e-5.

The peers are not dependencies of the package; each test skips where its peer is not installed
(``make bench-install`` puts both into ``.venv-bench``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.model.transformer import Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "bench"))
import bench_common as bc

V = 40
TOL = 1e-5  # fp32, the same weights and the same operations in another order


@pytest.fixture(scope="module")
def model() -> Transformer:
    """A random post-norm, tied, sinusoidal model (the layout both ports handle)."""
    torch.manual_seed(0)
    cfg = ModelConfig(name="test", encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64,
                      heads=4, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      max_positions=64)
    return Transformer(cfg, vocab_size=V).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 9) sources, the second padded after its EOS, and (2, 6) target prefixes."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, V, (2, 9), generator=g)
    src[:, -1] = EOS_ID
    src[1, 6:] = PAD_ID
    src[1, 5] = EOS_ID
    tgt = torch.randint(4, V, (2, 6), generator=g)
    tgt[:, 0] = BOS_ID
    return src, tgt


def test_marian_port_gives_our_logits(model, monkeypatch):
    pytest.importorskip("transformers")
    cfg = model.cfg
    monkeypatch.setitem(bc.SIZES, "test", (cfg.encoder_layers, cfg.decoder_layers, cfg.d_model,
                                           cfg.d_ff, cfg.heads))
    ported = bc.port_to_marian(model, "test")
    src, tgt = _batch()
    with torch.no_grad():
        ours = model(src, tgt)  # (B, T, V)
        theirs = ported(input_ids=src, attention_mask=src.ne(PAD_ID),
                        decoder_input_ids=tgt).logits
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, rtol=0.0, atol=TOL)


def test_fairseq_port_gives_our_logits(model, tmp_path):
    pytest.importorskip("fairseq")
    # fairseq's Dictionary adds its four specials itself; the file lists the other V - 4.
    (tmp_path / "dict.en.txt").write_text("".join(f"tok{i} 1\n" for i in range(4, V)))
    ported, dictionary = bc.port_to_fairseq(model, tmp_path, max_positions=64)
    assert len(dictionary) == V
    src, tgt = _batch()
    to_fs = torch.tensor([bc.fairseq_index(i) for i in range(V)])
    with torch.no_grad():
        ours = model(src, tgt)
        theirs, _ = ported(to_fs[src], src.ne(PAD_ID).sum(1), to_fs[tgt])
        theirs = theirs[..., to_fs]  # fairseq's columns back in our id order
    torch.testing.assert_close(theirs, ours, rtol=0.0, atol=TOL)
