"""Helpers of the decoding tests (test_translate, test_evaluate, test_checkpoint): a tiny
SentencePiece workspace on made-up English-like sentences, random tiny models and their
checkpoint files. The ``workspace`` and ``tokenizer`` fixtures (tests/conftest.py) use them."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from transformer_nmt.checkpoint import save_checkpoint
from transformer_nmt.config import compose, to_plain
from transformer_nmt.model.transformer import Transformer

TINY_MODEL = (
    "model.d_model=32", "model.d_ff=64", "model.heads=2", "model.encoder_layers=1",
    "model.decoder_layers=1",
)
"""The one tiny Transformer of the tests."""

WORDS = ["a", "dog", "cat", "man", "woman", "child", "runs", "sits", "plays", "walks", "on", "in",
         "the", "red", "blue", "green", "big", "small", "street", "park", "water", "ball", "house",
         "near", "with", "two", "three", "people"]
DECODE_MODEL = [*TINY_MODEL, "model.dropout=0.0", "model.max_positions=128"]


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."
            for _ in range(n)]


def make_cfg(root: Path, *extra: str):
    return compose([
        f"data.root={root / 'data'}", f"run_dir={root / 'runs' / 'tiny'}", "name=tiny",
        "data.vocab_size=60", "data.test_splits=[test_2016_flickr]", "decode.beam_size=2",
        "decode.max_len_b=6", *DECODE_MODEL, *extra,
    ])


def new_model(cfg, vocab_size: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg.model, vocab_size=vocab_size).eval()


def write_checkpoint(path: Path, model: Transformer, cfg, step: int) -> None:
    save_checkpoint(path, {
        "model": model.state_dict(), "config": to_plain(cfg),
        "vocab_size": model.vocab_size, "step": step,
    })
