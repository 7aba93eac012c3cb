"""scripts/micro/count_decode_buckets.py: the buckets it counts are those of the compiled
step's static cache, it runs the same steps as the eager search, and with --compile the
graphs torch.compile builds for all the buckets are at most two."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import count_decode_buckets  # noqa: E402


def _run(workspace, tokenizer, tmp_path, *extra):
    """The script on the workspace's 12 test sentences with a tiny model: (its result, the
    checkpoint, the source file)."""
    from transformer_nmt.fileio import raw_path, spm_model_path

    _, cfg = workspace
    path = tmp_path / "model.pt"
    write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=3), cfg, step=10)
    source = raw_path(cfg.data, "test_2016_flickr", "en")
    result = count_decode_buckets.main([
        "--checkpoint", str(path), "--spm", str(spm_model_path(cfg.data)), "--input",
        str(source), "--max-tokens", "40", "--beam", "3", "--threads", "1", *extra])
    return result, path, source


def test_buckets_cover_the_eager_searchs_steps(workspace, tokenizer, tmp_path, capsys):
    import transformer_nmt.decode.compiled_step as compiled_step
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.config import DecodeConfig
    from transformer_nmt.decode.translate import translate_lines
    from transformer_nmt.model.cache import LENGTH_BUCKET

    before = compiled_step._compiled
    result, path, source = _run(workspace, tokenizer, tmp_path)
    buckets = result["buckets"]
    assert compiled_step._compiled is before  # the eager stand-in is taken out again
    assert result["graphs"] is None and result["same_as_eager"] is None
    # rows: beam x a power of two of sentences; lengths: multiples of the length bucket
    assert buckets and all(rows % 3 == 0 and (rows // 3) & (rows // 3 - 1) == 0
                           for rows, _, _, _ in buckets)
    assert all(c % LENGTH_BUCKET == 0 and sb % LENGTH_BUCKET == 0 for _, c, _, sb in buckets)
    # the positions read: a multiple of the length bucket, at most the capacity, and fewer
    # than the capacity's in all (12 sentences of up to 50 + their length output tokens)
    assert all(p % LENGTH_BUCKET == 0 and p <= c for _, c, p, _ in buckets)
    assert len({p for _, _, p, _ in buckets}) > 1
    assert result["positions"] == sum(r * p * n for (r, _, p, _), n in buckets.items())
    assert result["positions"] < result["capacity_positions"]
    # the eager search over the same batches takes as many decoder steps
    model, _ = load_model(str(path), "cpu")
    model.eval()
    calls = 0
    decode = model.decode

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return decode(*args, **kwargs)

    model.decode = counted
    lines = source.read_text(encoding="utf-8").splitlines()
    translate_lines(model, tokenizer, lines, DecodeConfig(
        beam_size=3, lenpen=0.6, lenpen_form="fairseq", stopping="beam", max_len_a=1.0,
        max_len_b=50, max_tokens=40, device="cpu", compile="false"), "cpu")
    assert sum(buckets.values()) == calls
    out = capsys.readouterr().out
    assert f"{len(buckets)} buckets, {calls} steps, 12 sentences" in out


@pytest.mark.heavy
def test_with_compile_two_graphs_serve_every_bucket(workspace, tokenizer, tmp_path, capsys):
    result, _, _ = _run(workspace, tokenizer, tmp_path, "--compile")
    assert len(result["buckets"]) > 2 and 1 <= result["graphs"] <= 2
    assert result["same_as_eager"] is True
    assert f"{result['graphs']} graphs compiled for them; translations equal to the eager " \
        "search's" in capsys.readouterr().out
