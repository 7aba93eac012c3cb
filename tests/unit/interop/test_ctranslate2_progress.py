"""decode.engine=ctranslate2 counts its progress per batch too, and the translations stay
the same (transformer_nmt.decode.progress)."""

from __future__ import annotations

import contextlib
import logging

import pytest
from helpers import new_model, sentences, write_checkpoint

pytest.importorskip("ctranslate2")

from transformer_nmt.config import DecodeConfig
from transformer_nmt.decode import progress as progress_module
from transformer_nmt.decode.translate import translate_lines
from transformer_nmt.fileio import spm_model_path
from transformer_nmt.interop import ctranslate2 as ct2


def test_ctranslate2_counts_every_sentence_and_keeps_its_output(workspace, tokenizer, tmp_path,
                                                                 monkeypatch, caplog):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=2)
    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint_1.pt"
    ckpt.parent.mkdir(parents=True)
    write_checkpoint(ckpt, model, cfg, 1)
    engine = ct2.CTranslate2Engine(ct2.cached_ctranslate2(ckpt, spm_model_path(cfg.data)),
                                   max_positions=cfg.model.max_positions, threads=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, max_tokens=30, lenpen_form="fairseq",
                          stopping="beam")
    lines = sentences(10, 4)
    lines.insert(3, " ")

    @contextlib.contextmanager
    def silent(total, *args, **kwargs):
        yield type("Quiet", (), {"update": lambda self, n: None})()

    monkeypatch.setattr(progress_module, "decode_progress", silent)
    expected, _ = translate_lines(engine, tokenizer, lines, decode)
    monkeypatch.undo()

    counted = []
    real = progress_module.DecodeProgress.update
    monkeypatch.setattr(progress_module.DecodeProgress, "update",
                        lambda self, n: (counted.append(n), real(self, n)))
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 0.0)
    with caplog.at_level(logging.INFO):
        outputs, stats = translate_lines(engine, tokenizer, lines, decode)
    assert outputs == expected
    assert sum(counted) == 10 and len(counted) == stats["batches"] >= 2
    assert any(r.name == progress_module.log.name for r in caplog.records)
