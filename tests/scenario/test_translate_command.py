"""nmt-translate as a user runs it: text on stdin, only the translations on stdout (a random
tiny model and the decoding workspace of tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import DECODE_MODEL, new_model, write_checkpoint


def test_translate_cli_prints_only_translations(workspace, tokenizer, tmp_path):
    root, cfg = workspace
    ckpt = tmp_path / "model.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, 3), cfg, 1)
    args = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}",
            f"decode.checkpoint={ckpt}",
            "decode.beam_size=2", "decode.max_len_b=4", "decode.device=cpu", *DECODE_MODEL,
            "data.vocab_size=60"]
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.translate", *args], check=False,
        input="A dog runs.\n\nTwo people in the park.\n", capture_output=True, text=True,
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # 3 lines + final newline
    assert "sentences/s" in proc.stderr
