"""scripts/micro/count_search_ops.py: the operations it counts fall where they run (decoder
call, search around it, encoder), per decoder call; --gpu-paths takes the GPU's attention and
cache on a CPU and puts the CPU's back afterwards; generate is counted the same way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import count_search_ops  # noqa: E402


def _run(workspace, tokenizer, tmp_path, *extra):
    from transformer_nmt.fileio import raw_path, spm_model_path

    _, cfg = workspace
    path = tmp_path / "model.pt"
    write_checkpoint(path, new_model(cfg, tokenizer.vocab_size, seed=3), cfg, step=10)
    return count_search_ops.main([
        "--checkpoint", str(path), "--spm", str(spm_model_path(cfg.data)), "--input",
        str(raw_path(cfg.data, "test_2016_flickr", "en")), "--sentences", "6",
        "--beam", "3", "--threads", "1", *extra])


def test_operations_are_counted_per_decoder_call_where_they_run(workspace, tokenizer, tmp_path,
                                                                capsys):
    from transformer_nmt.decode import candidates
    from transformer_nmt.model.transformer import MultiHeadAttention

    cpu_step, block_width = MultiHeadAttention._cpu_step, candidates.block_width
    cpu = _run(workspace, tokenizer, tmp_path)["ours"]
    gpu = _run(workspace, tokenizer, tmp_path, "--gpu-paths")["ours"]
    # the CPU's branches are back
    assert MultiHeadAttention._cpu_step is cpu_step and candidates.block_width is block_width
    for r in (cpu, gpu):
        assert r["steps"] > 1 and r["encoder"] > 0 and r["decoder"] > 0 and r["search"] > 0
        # the search picks each step's candidates and reorders the cache between calls
        assert r["search_ops"]["topk"] >= 1 and r["search_ops"].get("index_select", 0) > 0
        assert "embedding" in r["decoder_ops"] and "embedding" not in r["search_ops"]
        assert not set(count_search_ops.FREE) & set(r["decoder_ops"])
    # one query per row: matmuls on a CPU, SDPA on the GPU's path
    assert "matmul" in cpu["decoder_ops"]
    assert "scaled_dot_product_attention" not in cpu["decoder_ops"]
    assert "scaled_dot_product_attention" in gpu["decoder_ops"]
    assert "matmul" not in gpu["decoder_ops"]
    out = capsys.readouterr().out
    assert f"ours (cpu): {cpu['steps']} steps, operations per step: decoder" in out
    assert "ours (GPU paths on a CPU):" in out


def test_generate_is_counted_beside_ours(workspace, tokenizer, tmp_path):
    pytest.importorskip("transformers")
    result = _run(workspace, tokenizer, tmp_path, "--marian")
    marian = result["marian"]
    assert marian["steps"] > 1 and marian["decoder"] > 0 and marian["search"] > 0
    assert "embedding" in marian["decoder_ops"]


def test_host_time_is_timed_per_step_on_a_model_of_the_same_layers_and_vocabulary(
        workspace, tokenizer, tmp_path, capsys):
    pytest.importorskip("transformers")
    from transformer_nmt.checkpoint import load_model

    result = _run(workspace, tokenizer, tmp_path, "--gpu-paths", "--marian", "--host-time", "8",
                  "--repeats", "1")
    out = capsys.readouterr().out
    for name in ("ours", "marian"):
        assert 0 < result[name]["host_ms_per_step"] < 1e4 and result[name]["host_steps"] > 1
        assert f"{name} (GPU paths on a CPU): {result[name]['host_ms_per_step']:.3f} ms per " \
            "decoding step with d_model 8 (fastest of 1 passes)" in out
    model, _ = load_model(tmp_path / "model.pt", "cpu")
    small = count_search_ops.shrunk(model, 8)
    assert small.cfg.d_model == 8 and small.cfg.d_ff == 16 and small.cfg.heads == 2
    assert small.vocab_size == model.vocab_size
    assert (small.cfg.encoder_layers, small.cfg.decoder_layers) == (
        model.cfg.encoder_layers, model.cfg.decoder_layers)


def test_bf16_counts_the_search_as_nmt_translate_runs_it(workspace, tokenizer, tmp_path):
    # decode.precision=bf16: autocast, the linear weights cast once (decoding_model); the
    # step's operations then include its activations' casts, never a weight's
    fp32 = _run(workspace, tokenizer, tmp_path, "--gpu-paths")["ours"]
    bf16 = _run(workspace, tokenizer, tmp_path, "--gpu-paths", "--precision", "bf16")["ours"]
    casts = bf16["decoder_ops"].get("_to_copy", 0) + bf16["decoder_ops"].get("to", 0)
    assert 0 < casts < fp32["decoder_ops"]["linear"]  # fewer casts than linear calls


def test_gpu_paths_with_cuda_is_refused(workspace, tokenizer, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _run(workspace, tokenizer, tmp_path, "--gpu-paths", "--device", "cuda")
    assert e.value.code == 2
    assert "--gpu-paths emulates" in capsys.readouterr().err


@pytest.mark.heavy
def test_the_compiled_step_counts_as_one_graph_per_step(workspace, tokenizer, tmp_path):
    """--compile: one 'graph' per decoding step stands for the decoder call and the search's
    update; outside it, the position and the back-pointers (2 per step) and the reads of the
    flags every 8 steps, where sentences leave; the compiling functions are put back."""
    from transformer_nmt.decode import compiled_step

    call, compiled = compiled_step._call, compiled_step._compiled
    r = _run(workspace, tokenizer, tmp_path, "--gpu-paths", "--compile")["ours"]
    assert compiled_step._call is call and compiled_step._compiled is compiled
    assert r["steps"] > 1 and r["decoder_ops"] == {"graph": 1.0}
    assert "topk" not in r["search_ops"] and "embedding" not in r["search_ops"]
    assert 2 <= r["search"] < 12, r["search_ops"]


@pytest.mark.heavy
def test_host_time_of_the_compiled_step_is_per_call_of_it(workspace, tokenizer, tmp_path,
                                                          monkeypatch):
    """--compile --host-time: a step is a call of the compiled step (the model's eager decode
    is not called), so the pass's time is divided by its steps, not by none."""
    from transformer_nmt.decode import compiled_step

    compiled = compiled_step._compiled
    monkeypatch.setattr(compiled_step, "_compiled",  # aot_eager: no code generated in a test
                        lambda step, device, backend: compiled(step, device, "aot_eager"))
    call = compiled_step._call
    r = _run(workspace, tokenizer, tmp_path, "--compile", "--host-time", "8", "--repeats",
             "1")["ours"]
    assert compiled_step._call is call
    assert r["host_steps"] > 1 and 0 < r["host_ms_per_step"] < 1e4
