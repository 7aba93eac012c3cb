"""The shape buckets ``decode.compile`` meets on an input: how many CUDA graphs the compiled
decoder step records (one per bucket) before its first timed pass, how many steps each
serves, and the self-attention K/V positions the steps reorder and read.

The search runs as ``decode.compile=true`` runs it (the static cache, its row, cache-length and
source-length buckets), with the step computed eagerly instead of compiled, so that the count
needs no GPU (about a minute for 1,000 sentences on two CPU cores). Prints one line per bucket
(cache rows R, cache length C, positions read P, padded source length Sb: steps) and the
total, with the row-positions the steps reorder and read (the sum of R x P over the steps)
beside those of the whole capacity (R x C): the K/V traffic of the step's gather and
attention, per layer and head, in positions. ``--compile``
compiles the step as ``decode.compile`` does, with the ``aot_eager`` backend (the graphs
traced, no code generated), counts the graphs ``torch.compile`` builds for all the buckets,
and says whether the translations equal the eager search's.

    .venv/bin/python scripts/micro/count_decode_buckets.py \
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

import torch
from torch._dynamo.testing import CompileCounterWithBackend

import transformer_nmt.decode.compiled_step as compiled_step
from transformer_nmt.checkpoint import load_model
from transformer_nmt.config import DecodeConfig
from transformer_nmt.data.bpe import SentencePieceTokenizer
from transformer_nmt.decode.translate import translate_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_common as bc  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    """Run the search and print the buckets: ``{"buckets": {(R, C, P, Sb): steps}, "graphs":
    graphs compiled (None without --compile), "same_as_eager": bool or None, "positions":
    sum of R x P over the steps, "capacity_positions": sum of R x C}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bc.add_search_arguments(p, sentences=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true",
                   help="compile the step (aot_eager) and count the graphs built")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    buckets: Counter = Counter()
    # aot_eager, counting the graphs it is given (frame_count)
    backend = CompileCounterWithBackend("aot_eager") if args.compile else None
    original = compiled_step._compiled

    def counted(step_fn, device, _backend):  # the step (compiled or not), its shapes counted
        fn = original(step_fn, device, backend) if backend else step_fn

        def step(model, cache, *rest):
            rows, length = cache.rows, cache.capacity
            buckets[(rows, length, cache.span, cache.cross_attn_mask.shape[-1])] += 1
            return fn(model, cache, *rest)
        return step

    model, _ = load_model(args.checkpoint, "cpu")
    model.eval()
    with open(args.input, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][: args.sentences]
    cfg = DecodeConfig(beam_size=args.beam, lenpen=0.6, lenpen_form="fairseq", stopping="beam",
                       max_len_a=1.0, max_len_b=50, max_tokens=args.max_tokens, device="cpu",
                       compile="true")
    tokenizer = SentencePieceTokenizer(args.spm)
    compiled_step._compiled = counted
    try:
        outputs, _ = translate_lines(model, tokenizer, lines, cfg, "cpu")
    finally:
        compiled_step._compiled = original
    for (rows, length, span, src), steps in sorted(buckets.items()):
        print(f"R {rows:5d}  C {length:4d}  P {span:4d}  Sb {src:4d}: {steps} steps")
    print(f"{len(buckets)} buckets, {sum(buckets.values())} steps, "
          f"{len(lines)} sentences, max_tokens {args.max_tokens}, beam {args.beam}")
    read = sum(r * span * n for (r, _, span, _), n in buckets.items())
    whole = sum(r * c * n for (r, c, _, _), n in buckets.items())
    print(f"K/V row-positions reordered and read per layer and head: {read:,} "
          f"({read / whole:.2f} of the whole capacity's {whole:,})")
    same = None
    if backend:
        eager, _ = translate_lines(model, tokenizer, lines,
                                   dataclasses.replace(cfg, compile="false"), "cpu")
        same = outputs == eager
        print(f"{backend.frame_count} graphs compiled for them; translations "
              f"{'equal to' if same else 'DIFFERENT from'} the eager search's")
    return {"buckets": buckets, "graphs": backend.frame_count if backend else None,
            "same_as_eager": same, "positions": read, "capacity_positions": whole}


if __name__ == "__main__":
    main()
