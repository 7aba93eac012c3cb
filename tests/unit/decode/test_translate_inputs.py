"""translate.input that is not a regular file: a pipe or a device is read as a stream, a folder
or a socket is named for what it is, a missing path says so."""

from __future__ import annotations

import gzip
import os
import socket
import threading
from pathlib import Path

import pytest

from transformer_nmt.decode.translate import read_input
from transformer_nmt.errors import UserError


def _feed(fifo: Path, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("data", [b"A dog runs.\r\nTwo cats.\n",
                                  gzip.compress(b"A dog runs.\r\nTwo cats.\n", mtime=0)],
                         ids=["text", "gzip"])
def test_a_pipe_is_read_once_as_a_stream(tmp_path, data):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = _feed(fifo, data)
    assert read_input(fifo) == ["A dog runs.", "Two cats."]
    writer.join(timeout=30)


def test_dev_null_is_no_lines_and_other_kinds_are_named(tmp_path):
    assert read_input(os.devnull) == []
    with pytest.raises(UserError, match=f"^translate.input={tmp_path} is a folder, not a text "
                                        "file; give a file, a pipe, or leave translate.input "
                                        "unset to read standard input$"):
        read_input(tmp_path)
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(UserError, match=f"^translate.input={sock_path} is a socket"):
            read_input(sock_path)
    with pytest.raises(FileNotFoundError,
                       match=f"^translate.input={tmp_path / 'no.en'}: no such file$"):
        read_input(tmp_path / "no.en")


def test_translate_reads_a_pipe(workspace, tokenizer, tmp_path):
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    from transformer_nmt.config import compose
    from transformer_nmt.decode.translate import translate

    root, cfg = workspace
    ckpt = tmp_path / "checkpoint_1.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, seed=1), cfg, 1)
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.de"
    writer = _feed(fifo, b"A dog runs.\nTwo people sit.\nA cat.\n")
    stats = translate(compose([
        f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
        "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6", *DECODE_MODEL,
        f"decode.checkpoint={ckpt}", f"translate.input={fifo}", f"translate.output={out}"]))
    writer.join(timeout=30)
    assert stats["sentences"] == 3 and len(out.read_text().splitlines()) == 3
