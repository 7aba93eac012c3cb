"""Progress of a decoding (transformer_nmt.decode.progress): a bar on a terminal, log lines
elsewhere, counted per batch, and the translations unchanged by it."""

from __future__ import annotations

import contextlib
import io
import logging

from helpers import new_model, sentences

from transformer_nmt.config import DecodeConfig
from transformer_nmt.decode import progress as progress_module
from transformer_nmt.decode import translate as translate_module
from transformer_nmt.decode.progress import decode_progress
from transformer_nmt.decode.translate import translate_lines

LOGGER = "transformer_nmt.decode.progress"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_when_standard_error_is_not_a_terminal(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with decode_progress(5, "decoding", stream=stream, log_every=0) as progress:
            for n in (2, 2, 1):
                progress.update(n)
    assert stream.getvalue() == ""  # no bar
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert [m.split(" sentences")[0] for m in messages] == ["decoding: 2 of 5", "decoding: 4 of 5"]
    assert "sentences/s" in messages[0]


def test_a_bar_on_a_terminal_and_no_log_lines(caplog):
    stream = _Terminal()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with decode_progress(5, stream=stream, log_every=0) as progress:
            progress.update(3)
            progress.update(2)
    assert "/5" in stream.getvalue()
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_translations_unchanged_and_every_sentence_counted(workspace, tokenizer, caplog,
                                                           monkeypatch):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, max_tokens=40)
    lines = sentences(12, 3)
    lines.insert(4, "")

    @contextlib.contextmanager
    def silent(total, *args, **kwargs):
        class Quiet:
            def update(self, n):
                pass

        yield Quiet()

    monkeypatch.setattr(translate_module, "decode_progress", silent)
    expected, _ = translate_lines(model, tokenizer, lines, decode, "cpu")
    monkeypatch.undo()

    counted = []
    real = progress_module.DecodeProgress.update
    monkeypatch.setattr(progress_module.DecodeProgress, "update",
                        lambda self, n: (counted.append(n), real(self, n)))
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 0.0)
    with caplog.at_level(logging.INFO):
        outputs, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert outputs == expected
    assert stats["batches"] >= 3 and len(counted) == stats["batches"]
    assert sum(counted) == 12  # the empty line is not decoded
    progress_lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert progress_lines and progress_lines[-1].startswith("decoding: ")
    assert "translated 13 sentences" in caplog.text
