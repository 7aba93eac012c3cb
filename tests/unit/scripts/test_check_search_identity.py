"""scripts/micro/check_search_identity.py on a run folder: the search and the previous one
agree on every sentence, and the script says so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import check_search_identity  # noqa: E402


def test_check_search_identity_on_a_run_folder(workspace, tokenizer, capsys):
    from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir

    _, cfg = workspace
    run = Path(cfg.run_dir)
    path = checkpoint_dir(run) / AVERAGED_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=3), cfg, step=10)
    assert check_search_identity.main(["--run", str(run), "--beams", "2,3"]) == 0
    out = capsys.readouterr().out
    assert f"model {path}, 12 sentences" in out
    assert "beam 2: 0 of 12 sentences differ" in out and "beam 3: 0 of 12 sentences differ" in out


@pytest.mark.heavy
def test_check_search_identity_with_the_compiled_search(workspace, tokenizer, capsys):
    """--compile: decode.compile's search (its whole step compiled; aot_eager here) against
    the previous search, on every sentence; beam 1 is greedy search."""
    from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir

    _, cfg = workspace
    run = Path(cfg.run_dir)
    path = checkpoint_dir(run) / AVERAGED_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=4), cfg, step=10)
    assert check_search_identity.main(["--run", str(run), "--beams", "1,4,5", "--compile",
                                       "--compile-backend", "aot_eager"]) == 0
    out = capsys.readouterr().out
    assert f"model {path}, 12 sentences" in out and "decode.compile" in out
    for beam in (1, 4, 5):
        assert f"beam {beam}: 0 of 12 sentences differ" in out
