"""Translation (transformer_nmt.decode.translate) with a random tiny model and a real SentencePiece
model: input order, empty and over-long lines, n-best, precision (nmt-translate as a command:
tests/scenario/test_translate_command.py)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from helpers import new_model, sentences

from transformer_nmt.config import EOS_ID, DecodeConfig
from transformer_nmt.decode.beam_search import beam_search
from transformer_nmt.decode.translate import translate_lines


def test_translate_lines_order_empty_and_overlong(workspace, tokenizer, caplog):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, max_tokens=120, max_input_tokens=50)
    long_line = " ".join(["the big red dog runs in the park"] * 4)
    lines = sentences(9, 5)
    lines[2:2] = ["", "   "]
    lines.insert(6, long_line)
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.decode.translate"):
        outputs, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert len(outputs) == len(lines)
    assert outputs[2] == "" and outputs[3] == ""
    assert stats["empty"] == 2 and stats["truncated"] == 1
    assert "line 7" in caplog.text and "truncated" in caplog.text
    assert stats["batches"] >= 2  # max_tokens=120 forces several batches
    assert stats["sentences"] == len(lines) and stats["target_tokens"] > 0
    assert stats["sentences_per_second"] > 0 and stats["target_tokens_per_second"] > 0
    # Input order: each line alone gives the same translation.
    for line, out in zip(lines, outputs):
        if line.strip() and line is not long_line:
            assert translate_lines(model, tokenizer, [line], decode, "cpu")[0] == [out]
    # The over-long line is translated from its first max_input_tokens pieces.
    head = tokenizer.encode(long_line)[:50] + [EOS_ID]
    hyp = beam_search(model, torch.tensor([head]), beam_size=2, max_len_b=4)[0][0]
    assert outputs[6] == tokenizer.decode(hyp.tokens)
    # n-best lists, best first.
    nbest, _ = translate_lines(model, tokenizer, lines[:2], DecodeConfig(beam_size=3, nbest=3,
                               max_len_b=4), "cpu", return_hypotheses=True)
    for hyps in nbest:
        scores = [s for _, s in hyps]
        assert len(hyps) == 3 and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_translate_lines_reduced_precision(workspace, tokenizer, precision):
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    decode = DecodeConfig(beam_size=2, max_len_b=4, precision=precision)
    lines = sentences(4, 8)
    outputs, stats = translate_lines(model, tokenizer, lines, decode, "cpu")
    assert len(outputs) == 4 and all(outputs) and stats["precision"] == precision


ALLOC_PROBE = """
import resource, sys, torch
import transformer_nmt.cli  # the modules loaded when an entry point calls it
from transformer_nmt.runtime import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else False
torch.empty(16 << 20).fill_(1.0)  # 64 MiB: allocate, touch and free once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(16 << 20).fill_(1.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc settings")
def test_retain_freed_memory_stops_page_faults_on_reallocation():
    """A freed 64 MiB tensor allocated again costs 16k page faults (one per 4 KiB page) every
    time by default; after retain_freed_memory() (what nmt-translate / nmt-evaluate call)
    the ten reallocations fault at most twice in all (whether the first one reuses the freed
    block or takes a second one depends on where import-time allocations left the heap)."""
    faults = {}
    for mode in ("default", "retain"):
        out = subprocess.run([sys.executable, "-c", ALLOC_PROBE, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        faults[mode] = (out[0], int(out[1]))
    if faults["retain"][0] != "True":
        pytest.skip("the C library is not glibc")
    assert faults["default"][1] > 10 * 16_000 * 0.9, faults  # every reallocation faults again
    assert faults["retain"][1] < 2.1 * 16_384, faults
