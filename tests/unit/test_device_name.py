"""The hardware that decoding speed is recorded with: ``runtime.device_name`` names a CPU by its
model, the vector instructions PyTorch's kernels use and the thread count, and
``translate_lines`` (our engine and CTranslate2) puts it beside every speed figure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import new_model, sentences, write_checkpoint

from transformer_nmt.config import DecodeConfig
from transformer_nmt.decode.translate import translate_lines
from transformer_nmt.runtime import cpu_model, device_name


def test_a_cpu_is_named_by_model_vector_level_and_threads():
    name = device_name(torch.device("cpu"))
    assert name == (f"cpu ({cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, "
                    f"{torch.get_num_threads()} threads)")
    assert device_name("cpu") == name
    info = Path("/proc/cpuinfo")
    if info.exists():
        models = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                  if line.startswith("model name")]
        if models:
            assert cpu_model() == models[0]


def test_translate_lines_records_the_hardware_with_its_speed(workspace, tokenizer, tmp_path):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=4)
    decode = DecodeConfig(beam_size=2, max_len_b=4, max_tokens=30)
    lines = sentences(4, 5)
    _, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert stats["hardware"] == device_name("cpu") and stats["device"] == "cpu"

    pytest.importorskip("ctranslate2")
    from transformer_nmt.fileio import spm_model_path
    from transformer_nmt.interop import ctranslate2 as ct2

    ckpt = tmp_path / "checkpoints" / "checkpoint_1.pt"
    ckpt.parent.mkdir(parents=True)
    write_checkpoint(ckpt, model, cfg, 1)
    engine = ct2.CTranslate2Engine(ct2.cached_ctranslate2(ckpt, spm_model_path(cfg.data)),
                                   max_positions=cfg.model.max_positions, threads=1)
    decode.lenpen_form, decode.stopping = "fairseq", "beam"
    _, stats = translate_lines(engine, tokenizer, lines, decode)
    assert stats["hardware"] == device_name("cpu")
