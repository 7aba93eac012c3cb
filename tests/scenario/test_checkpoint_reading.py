"""Every checkpoint is read through one function (checkpoint.read_checkpoint, weights_only=True):
a pickle payload, a truncated or an empty averaged.pt is one line in nmt-translate (its
vocabulary check included), and nothing of a payload runs."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import torch

from transformer_nmt.config import compose
from transformer_nmt.errors import UserError


class _Payload:
    """Unpickling this calls ``os.mkdir(marker)``: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture
def averaged(workspace, tokenizer, tmp_path):
    """A run with a good ``averaged.pt`` of a tiny model and one line of input:
    ``(overrides, averaged, its bytes)``."""
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    root, cfg = workspace
    path = tmp_path / "run" / "checkpoints" / "averaged.pt"
    write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=1), cfg, 1)
    source = tmp_path / "in.en"
    source.write_text("A dog runs.\n")
    overrides = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
                 "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6",
                 *DECODE_MODEL, f"translate.input={source}"]
    return overrides, path, path.read_bytes()


def _damage(path, kind: str, marker) -> str:
    """Write a damaged ``path``; returns what the error says about it."""
    good = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
        return "an empty file (0 bytes)"
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
        return f"truncated or not a checkpoint ({len(good) // 2:,} bytes;"
    if kind == "pickle":  # a bare pickle, as an attacker would send it
        path.write_bytes(pickle.dumps({"model": _Payload(str(marker))}))
    else:  # the same payload in torch's zip format
        torch.save({"model": _Payload(str(marker))}, path)
    return ("it holds Python objects other than tensors and plain values "
            f"({path.stat().st_size:,} bytes), which are refused "
            "because loading them could run code")


@pytest.mark.parametrize("kind", ["empty", "truncated", "pickle", "zip-pickle"])
def test_translate_with_a_damaged_or_hostile_averaged_pt_is_one_error(averaged, tmp_path, kind):
    from transformer_nmt.decode.translate import translate

    overrides, path, _ = averaged
    marker = tmp_path / "payload-ran"
    words = _damage(path, kind, marker)
    with pytest.raises(UserError) as e:
        translate(compose(overrides))
    assert str(e.value).startswith(f"cannot read checkpoint {path}: {words}")
    assert "weights_only=False" not in str(e.value)
    assert not marker.exists()


def test_nmt_translate_with_a_pickle_payload_is_one_line(averaged, tmp_path):
    overrides, path, _ = averaged
    marker = tmp_path / "payload-ran"
    words = _damage(path, "pickle", marker)
    proc = subprocess.run([sys.executable, "-m", "transformer_nmt.cli.translate", *overrides],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot read checkpoint {path}: {words}")
    assert not marker.exists() and proc.stdout == ""
