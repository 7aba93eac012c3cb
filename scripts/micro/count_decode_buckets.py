"""The shape buckets ``decode.compile`` meets on an input: how many graphs the compiled decoder
step builds before its first timed pass, and how many steps each serves.

The search runs as ``decode.compile=true`` runs it (the static cache, its row, cache-length and
source-length buckets), with the step computed eagerly instead of compiled, so that the count
needs no GPU (about a minute for 1,000 sentences on two CPU cores). Prints one line per bucket
(cache rows R, cache length C, padded source length Sb: steps) and the total.

    .venv/bin/python scripts/micro/count_decode_buckets.py \
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

import transformer_nmt.decode.compiled_step as compiled_step
from transformer_nmt.checkpoint import load_model
from transformer_nmt.config import DecodeConfig
from transformer_nmt.data.bpe import SentencePieceTokenizer
from transformer_nmt.decode.translate import translate_lines


def main(argv: list[str] | None = None) -> Counter:
    """Run the search and print the buckets; returns ``{(R, C, Sb): steps}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--spm", default="data/spm/multi30k_en_de/spm.model")
    p.add_argument("--input", default="data/raw/multi30k_en_de/test_2016_flickr.en")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=8000, help="source tokens per batch")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    buckets: Counter = Counter()

    def counted(device, backend):  # the step uncompiled, its cache's shapes counted
        def step(model, cache, min_len):
            rows, _, length, _ = cache.self_k[0].shape
            buckets[(rows, length, cache.cross_attn_mask.shape[-1])] += 1
            return compiled_step.static_log_probs(model, cache, min_len)
        return step

    model, _ = load_model(args.checkpoint, "cpu")
    model.eval()
    with open(args.input, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][: args.sentences]
    cfg = DecodeConfig(beam_size=args.beam, lenpen=0.6, lenpen_form="fairseq", stopping="beam",
                       max_len_a=1.0, max_len_b=50, max_tokens=args.max_tokens, device="cpu",
                       compile="true")
    compiled, compiled_step._compiled_step = compiled_step._compiled_step, counted
    try:
        translate_lines(model, SentencePieceTokenizer(args.spm), lines, cfg, "cpu")
    finally:
        compiled_step._compiled_step = compiled
    for (rows, length, src), steps in sorted(buckets.items()):
        print(f"R {rows:5d}  C {length:4d}  Sb {src:4d}: {steps} steps")
    print(f"{len(buckets)} buckets (graphs to compile), {sum(buckets.values())} steps, "
          f"{len(lines)} sentences, max_tokens {args.max_tokens}, beam {args.beam}")
    return buckets


if __name__ == "__main__":
    main()
