"""Peak memory of a linear layer on a CPU after it has met many distinct row counts: PyTorch's
``F.linear``, the oneDNN packed product called with the exact rows, and
:class:`transformer_nmt.decode.prepack.PackedLinear` (which computes them in batches of
``packed_rows`` rows).

A decoding job calls each linear layer with as many distinct row counts as its steps hold live
rows. Each mode runs in its own process (peak RSS is per process), with the malloc settings
decoding uses (``retain_freed_memory``), and calls the layer once for each of ``--counts`` row
counts drawn without replacement from 1..``--max-rows`` (seed 0), on random inputs; it prints
the process's peak RSS before and after, and the distinct row counts the product was called
with.

    .venv/bin/python scripts/micro/packed_memory.py
    .venv/bin/python scripts/micro/packed_memory.py --shape 256x8000 --counts 1000 --max-rows 2048
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("plain", "packed_exact", "packed")
"""``F.linear``; the packed product with the exact rows; ``PackedLinear`` (padded rows)."""


def peak_rss_mib() -> float:
    """This process's peak resident set size, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_mode(mode: str, in_features: int, out_features: int, counts: int, max_rows: int,
             threads: int) -> dict:
    """Call the layer in ``mode`` once per row count; peak RSS before and after (MiB) and the
    distinct row counts the product met."""
    from transformer_nmt.decode.prepack import PackedLinear, packed_rows
    from transformer_nmt.runtime import retain_freed_memory

    torch.set_num_threads(threads)
    retain_freed_memory()
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features).eval()
    packed = PackedLinear(layer)
    rows = random.Random(0).sample(range(1, max_rows + 1), counts)
    before = peak_rss_mib()
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, in_features)
            if mode == "plain":
                y = F.linear(x, layer.weight, layer.bias)
            elif mode == "packed_exact":
                y = torch.ops.mkldnn._linear_pointwise(x, packed.packed_weight, packed.bias,
                                                       "none", [], "")
            else:
                y = packed(x)
            del y
    met = len({packed_rows(m) for m in rows}) if mode == "packed" else len(set(rows))
    return {"mode": mode, "rss_before_mib": round(before), "rss_after_mib": round(peak_rss_mib()),
            "row_counts_met": met}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="256x8000",
                   help="INxOUT (default: the default model's pre-softmax projection)")
    p.add_argument("--counts", type=int, default=1000, help="distinct row counts to call with")
    p.add_argument("--max-rows", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = p.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    if args.counts > args.max_rows:
        p.error(f"--counts {args.counts} exceeds --max-rows {args.max_rows}")
    if args.mode:
        print(json.dumps(run_mode(args.mode, k, n, args.counts, args.max_rows, args.threads)))
        return []
    results = []
    for mode in MODES:
        proc = subprocess.run([sys.executable, __file__, "--mode", mode, "--shape", args.shape,
                               "--counts", str(args.counts), "--max-rows", str(args.max_rows),
                               "--threads", str(args.threads)],
                              capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"| mode ({args.shape}, {args.counts} row counts in 1..{args.max_rows}) | row counts "
          "met | peak RSS before, MiB | after, MiB | growth, MiB |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['mode']} | {r['row_counts_met']} | {r['rss_before_mib']} | "
              f"{r['rss_after_mib']} | {r['rss_after_mib'] - r['rss_before_mib']} |")
    return results


if __name__ == "__main__":
    main()
