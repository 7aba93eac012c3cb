"""Beam search's per-row top-k on a CPU: ``torch.topk`` against
:func:`transformer_nmt.decode.candidates.row_topk` (blocks of columns), and the row-maximum pass
each replaces, on log-probabilities of the shape of one decoding step.

Both run on the same matrix, alternating, for ``--rounds`` rounds; the median of each is
printed, and the two results are checked equal.

    .venv/bin/python scripts/micro/bench_row_topk.py --rows 1184 --vocab 8000 --k 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transformer_nmt.decode.candidates import block_width, row_topk
from transformer_nmt.runtime import retain_freed_memory


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1184, help="R: beams of one step (A*W)")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--k", type=int, default=8, help="per row: 2K for beam size K")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    g = torch.Generator().manual_seed(0)
    x = torch.log_softmax(3 * torch.randn(args.rows, args.vocab, generator=g), dim=-1)
    want, got = x.topk(args.k, dim=1), row_topk(x, args.k)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    runs = {
        "torch.topk + row max (before)": lambda: (x.topk(args.k, dim=1), x.amax(dim=-1)),
        "row_topk (after)": lambda: row_topk(x, args.k),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(f"{args.rows} x {args.vocab}, k {args.k}, block width "
          f"{block_width(args.vocab, args.k)}, {args.threads} threads, median of {args.rounds}:")
    for name, t in times.items():
        print(f"  {name:32s} {statistics.median(t) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
