"""fp32 linear layers on a CPU: PyTorch's ``F.linear`` against
:class:`transformer_nmt.decode.prepack.PackedLinear` (the weight packed once by oneDNN), at a
decoder step's shapes, and whether a row's result depends on the rows around it.

For each (rows, in, out) both run on the same input, alternating, for ``--rounds`` rounds; the
median time of each and their largest difference are printed. Then, for each, the first
``n`` rows of a 300-row product computed alone are compared bit for bit with those of the
whole product, for the ``n`` of ``--alone``.

    .venv/bin/python scripts/micro/bench_prepack.py
    .venv/bin/python scripts/micro/bench_prepack.py --rows 12,555 --shapes 256x8000 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt.decode.prepack import PackedLinear, prepack_supported
from transformer_nmt.runtime import retain_freed_memory


def mean_us(fn, calls: int) -> float:
    """Microseconds per call of ``fn()`` over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def layer_parser(description: str, rows: str, alone: str) -> argparse.ArgumentParser:
    """The options of the layer benchmarks under scripts/micro: ``--rows``, ``--shapes`` (the
    default model's decoder layers), ``--rounds``, ``--alone`` and ``--threads``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rows", default=rows,
                   help="comma-separated row counts (a step's beams, A*W)")
    p.add_argument("--shapes", default="256x768,256x256,256x1024,1024x256,256x8000",
                   help="comma-separated INxOUT: the default model's W^Q|W^K|W^V, W^O, W_1, "
                        "W_2 and pre-softmax projection")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--alone", default=alone,
                   help="row counts whose product alone is compared with the rows of a "
                        "300-row product")
    p.add_argument("--threads", type=int, default=2)
    return p


def prepare(args) -> list[tuple[int, int]]:
    """Set ``--threads``, keep freed memory (as decoding does), seed 0; the ``--shapes`` as
    (in, out) pairs."""
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    torch.manual_seed(0)
    return [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]


def layer_setup(argv: list[str] | None, description: str, rows: str, alone: str,
                supported: bool, refusal: str) -> tuple[argparse.Namespace, list[tuple[int, int]]]:
    """A layer benchmark's start: its options (:func:`layer_parser`), a one-line exit with
    ``refusal`` where the kernel it times is not ``supported``, then :func:`prepare`."""
    args = layer_parser(description, rows, alone).parse_args(argv)
    if not supported:
        raise SystemExit(f"error: {refusal}")
    return args, prepare(args)


def rows_alone_differ(fn, in_features: int, alone: str) -> list[int] | str:
    """The row counts m of ``alone`` (comma-separated) whose product ``fn(x[:m])`` differs
    from the first m rows of ``fn(x)`` for a random (300, ``in_features``) x; ``"none"``."""
    x = torch.randn(300, in_features)
    full = fn(x)
    differ = [m for m in (int(v) for v in alone.split(","))
              if not torch.equal(fn(x[:m]), full[:m])]
    return differ or "none"


def main(argv: list[str] | None = None) -> None:
    args, shapes = layer_setup(argv, __doc__.split("\n")[0], "12,555,2000", "1,2,3,4,7,12,100",
                               prepack_supported(),
                               "this PyTorch build packs no weights with oneDNN")
    print("| rows | in x out | F.linear (us) | packed (us) | F.linear / packed | max diff |")
    print("|---:|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for k, n in shapes:
            linear = nn.Linear(k, n).eval()
            packed = PackedLinear(linear)
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k)
                diff = float((packed(x) - linear(x)).abs().max())
                calls = max(3, int(3e7 / (rows * k * n) + 1))
                plain_t, packed_t = [], []
                for _ in range(args.rounds):
                    plain_t.append(mean_us(lambda: F.linear(x, linear.weight, linear.bias),
                                              calls))
                    packed_t.append(mean_us(lambda: packed(x), calls))
                a, b = statistics.median(plain_t), statistics.median(packed_t)
                print(f"| {rows} | {k} x {n} | {a:,.0f} | {b:,.0f} | {a / b:.2f} | {diff:.1e} |",
                      flush=True)
        print("\nrows whose product alone differs from the same rows of a 300-row product:")
        for k, n in shapes:
            linear = nn.Linear(k, n).eval()
            packed = PackedLinear(linear)
            for name, fn in (("F.linear", linear), ("packed", packed)):
                print(f"  {k} x {n} {name}: {rows_alone_differ(fn, k, args.alone)}")


if __name__ == "__main__":
    main()
