"""Helpers shared by the tests: a tiny SentencePiece workspace on made-up English-like
sentences, random tiny models and their checkpoint files (the ``workspace`` and ``tokenizer``
fixtures of tests/conftest.py use them), ``nmt-train`` as a subprocess, and an aten-op
counter."""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_nmt.checkpoint import save_checkpoint
from transformer_nmt.config import compose, to_plain
from transformer_nmt.model.transformer import Transformer

TINY_MODEL = (
    "model.d_model=32", "model.d_ff=64", "model.heads=2", "model.encoder_layers=1",
    "model.decoder_layers=1", "model.init=xavier",
)
"""The one tiny Transformer of the tests, initialised the same way whichever experiment it
joins (the Multi30k experiments choose fairseq's initialisation)."""

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


def run_with_averaged_model(cfg, run_dir: Path, vocab_size: int, seed: int):
    """A copy of ``cfg`` whose run folder ``run_dir`` holds an averaged.pt of a new model
    (``new_model(cfg, vocab_size, seed)``, step 6), decoded on the CPU."""
    cfg = copy.deepcopy(cfg)
    cfg.run_dir = str(run_dir)
    write_checkpoint(run_dir / "checkpoints" / "averaged.pt", new_model(cfg, vocab_size, seed),
                     cfg, 6)
    cfg.decode.device = "cpu"
    return cfg


def train_env() -> dict[str, str]:
    """The environment of an ``nmt-train`` subprocess: one thread, no distributed variables."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def train_command(overrides: list[str]) -> list[str]:
    """``nmt-train`` with Hydra ``overrides``, run by this interpreter."""
    return [sys.executable, "-m", "transformer_nmt.cli.train", *overrides]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until ``path`` exists; fail the test when ``proc`` exits first or after
    ``timeout`` seconds (then ``proc`` is killed)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"training exited ({proc.returncode}) before {path} appeared:\n"
                        f"{err[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


class CountOps(TorchDispatchMode):
    """Records the aten operation (overload packet name) of every dispatched call in ``ops``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))
