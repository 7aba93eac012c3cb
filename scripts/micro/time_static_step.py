"""The compiled decoding step's work against the positions it reads: one decoder step over a
:class:`~transformer_nmt.model.cache.StaticDecoderCache` (``decode.compile``'s cache), run
eagerly, timed at every span P = 16, 32, ... up to the cache length C.

The step gathers each layer's self-attention K/V rows (the beam reorder) and attends over P
positions; P = C is a step that reads the whole capacity. ``--compile`` times the step as
``decode.compile`` runs it (``torch.compile`` with dynamic shapes: inductor on a CPU,
``reduce-overhead`` on CUDA; compiled before the timing). Random weights, a small vocabulary
(so that the output projection does not hide the attention side), a random beam reorder
pending at every step. Prints ms per step for each P and its ratio to P = C.

    .venv/bin/python scripts/micro/time_static_step.py --sentences 64 --capacity 80
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from transformer_nmt.config import EOS_ID, ModelConfig
from transformer_nmt.decode import compiled_step
from transformer_nmt.decode.compiled_step import static_log_probs
from transformer_nmt.model.cache import LENGTH_BUCKET, BufferPool
from transformer_nmt.model.transformer import Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_common as bc  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    """Time the step at every span: ``[{"span": P, "capacity": C, "rows": R, "ms": best ms per
    step, "ratio": ms over the P = C step's}]``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6, help="decoder layers")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--sentences", type=int, default=64, help="N; rows R = N x beam")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--capacity", type=int, default=80, help="cache length C (a multiple of 16)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per span (the fastest)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="the compiled step")
    args = p.parse_args(argv)
    if args.capacity % LENGTH_BUCKET or args.capacity < LENGTH_BUCKET:
        p.error(f"--capacity {args.capacity} is not a positive multiple of {LENGTH_BUCKET}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = ModelConfig(d_model=args.d_model, d_ff=args.d_ff, heads=args.heads, encoder_layers=1,
                      decoder_layers=args.layers, dropout=0.0)
    model = Transformer(cfg, args.vocab).to(device).eval()
    n, k = args.sentences, args.beam
    src = torch.randint(4, args.vocab, (n, args.src_len), device=device)
    src[:, -1] = EOS_ID
    results = []
    with torch.inference_mode(), compiled_step.compile_settings():
        memory, src_mask = model.encode(src)
        if args.compile:
            _, cache = compiled_step._static_cache(model, memory, src_mask, k, args.capacity - 1)
            fn = compiled_step._compiled(static_log_probs, device, None)

            def run():
                compiled_step._call(fn, device, model, cache, 1)
        else:
            cache = model.new_static_cache(BufferPool(), k, args.capacity - 1, memory.dtype,
                                           device)
            model.start_static(cache, memory, src_mask)

            def run():
                static_log_probs(model, cache, 1)
        last = torch.randint(4, args.vocab, (n * k, 1), device=device)
        max_len = torch.full((n,), args.capacity - 2, device=device)
        base = torch.arange(n * k, device=device) // k * k
        spans = range(LENGTH_BUCKET, args.capacity + 1, LENGTH_BUCKET)
        for span in [*spans, *spans]:  # round 1 untimed: compiles, records graphs
            if span == LENGTH_BUCKET:  # a batch's start: the span grows from 16 again
                model.start_static(cache, memory, src_mask)
            best = float("inf")
            for _ in range(args.repeats + 1):  # the first untimed
                cache.set_step(last, span - 1, max_len)
                cache.reorder(base + torch.randint(0, k, (n * k,), device=device))
                cache.set_step(last, span - 1, max_len)
                assert cache.span == span
                bc.sync_device(device)
                start = time.perf_counter()
                run()
                bc.sync_device(device)
                best = min(best, time.perf_counter() - start)
            results.append({"span": span, "capacity": args.capacity, "rows": cache.rows,
                            "ms": best * 1e3})
        results = results[len(spans):]
    whole = results[-1]["ms"]
    print(f"decoder step over the static cache: R {results[0]['rows']} rows, C "
          f"{args.capacity}, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"vocabulary {args.vocab}, {device}, {args.threads} thread(s), "
          f"{'compiled' if args.compile else 'eager'}")
    print("| P (positions read) | ms / step | / the P = C step |\n|---:|---:|---:|")
    for r in results:
        r["ratio"] = r["ms"] / whole
        print(f"| {r['span']} | {r['ms']:.2f} | {r['ratio']:.2f} |")
    return results


if __name__ == "__main__":
    main()
