"""A line longer than a model with learned positions has positions for is translated truncated,
with a warning that counts such lines (ours and the CTranslate2 engine), not a traceback."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import DECODE_MODEL, new_model

from transformer_nmt.checkpoint import save_checkpoint
from transformer_nmt.config import compose, to_plain
from transformer_nmt.decode.translate import translate_lines

LONG = " ".join(["the big red dog runs in the green park near the house"] * 6) + "."


@pytest.fixture
def learned(workspace, tokenizer):
    """A tiny model with learned positions for 16 tokens, and its config."""
    root, _ = workspace
    cfg = compose([f"data.root={root / 'data'}", "name=tiny", "data.vocab_size=60",
                   "decode.beam_size=2", "decode.max_len_b=6", *DECODE_MODEL,
                   "model.positions=learned", "model.max_positions=16"])
    torch.manual_seed(0)
    model = new_model(cfg, tokenizer.vocab_size, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "positions" in name:
                p.normal_(0, 0.1)
    return model, cfg


def test_long_line_with_learned_positions_is_truncated_with_a_count(learned, tokenizer, caplog):
    model, cfg = learned
    assert len(tokenizer.encode(LONG)) > 16
    with caplog.at_level(logging.WARNING):
        out, stats = translate_lines(model, tokenizer, ["A dog runs.", LONG, LONG], cfg.decode)
    assert len(out) == 3 and stats["truncated"] == 2
    assert "2 of 3 lines were longer than 15 source tokens (decode.max_input_tokens=" in caplog.text
    assert "model.max_positions=16 with learned positions" in caplog.text


def test_ctranslate2_engine_truncates_to_its_position_table(learned, tokenizer, tmp_path, caplog):
    pytest.importorskip("ctranslate2")
    from transformer_nmt.data.bpe import vocab_identity
    from transformer_nmt.interop.ctranslate2 import CTranslate2Engine, cached_ctranslate2

    model, cfg = learned
    ckpt = tmp_path / "checkpoints" / "averaged.pt"
    save_checkpoint(ckpt, {"model": model.state_dict(), "config": to_plain(cfg),
                           "vocab_size": model.vocab_size, "step": 1,
                           "vocab": vocab_identity(tokenizer.model_path)})
    engine = CTranslate2Engine(cached_ctranslate2(ckpt, tokenizer.model_path),
                               max_positions=cfg.model.max_positions)
    with caplog.at_level(logging.WARNING):
        out, stats = engine.translate_lines(tokenizer, [LONG, "A dog runs."], cfg.decode)
    assert len(out) == 2 and stats["truncated"] == 1
    assert "1 of 2 lines were longer than 15 source tokens" in caplog.text
