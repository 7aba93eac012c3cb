"""nmt-translate's progress: standard output holds the same translations in the same order as
the library call, and standard error reports how many sentences were decoded."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import DECODE_MODEL, new_model, sentences, write_checkpoint

from transformer_nmt.config import compose
from transformer_nmt.decode.translate import translate_lines


def test_translate_output_unchanged_and_count_reported(workspace, tokenizer, tmp_path):
    root, cfg = workspace
    ckpt = tmp_path / "model.pt"
    model = new_model(cfg, tokenizer.vocab_size, 3)
    write_checkpoint(ckpt, model, cfg, 1)
    args = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}",
            f"decode.checkpoint={ckpt}", "decode.beam_size=2", "decode.max_len_b=4",
            "decode.max_tokens=40", "decode.device=cpu", *DECODE_MODEL, "data.vocab_size=60"]
    lines = sentences(20, 11)
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.translate", *args], check=False,
        input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    expected, stats = translate_lines(model, tokenizer, lines, compose(args).decode, "cpu")
    assert stats["batches"] >= 3
    assert proc.stdout == "".join(f"{line}\n" for line in expected)
    assert "translated 20 sentences" in proc.stderr and "sentences/s" in proc.stderr
    assert "\r" not in proc.stderr  # no bar when standard error is not a terminal
