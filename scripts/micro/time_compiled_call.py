"""The host's fixed cost of one call of a compiled decoding step: a function of one tiny
in-place operation compiled as ``decode.compile`` compiles the search's step (dynamic shapes,
its settings: :func:`transformer_nmt.decode.compiled_step.compile_settings`), called with the
settings entered once around the calls (as the search calls its step) or entered at every
call, and the same function uncompiled. Its work is nothing, so the time is the call's own:
Dynamo's guards, the compiled wrapper and, on CUDA (``reduce-overhead``), the CUDA graph's
replay and launch. Rounds alternate the three; prints the median microseconds per call.

    .venv/bin/python scripts/micro/time_compiled_call.py
    .venv/bin/python scripts/micro/time_compiled_call.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from transformer_nmt.decode import compiled_step


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time and print; returns ``{way: median us per call}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None,
                   help="torch.compile backend (default: decode.compile's, reduce-overhead on "
                        "CUDA, inductor elsewhere)")
    p.add_argument("--calls", type=int, default=2000, help="calls per round and way")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    state = torch.zeros(8, device=device)
    torch._dynamo.mark_static_address(state)

    def step(x: torch.Tensor) -> None:
        x.add_(1.0)

    fn = compiled_step._compiled(step, device, args.backend)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def once(n: int) -> None:
        with compiled_step.compile_settings():
            for _ in range(n):
                compiled_step._call(fn, device, state)

    def per_call(n: int) -> None:
        for _ in range(n):
            with compiled_step.compile_settings():
                compiled_step._call(fn, device, state)

    def eager(n: int) -> None:
        for _ in range(n):
            step(state)

    ways: dict[str, Callable[[int], None]] = {"compiled, settings entered once": once,
                                              "compiled, settings entered per call": per_call,
                                              "eager": eager}
    for run in ways.values():  # compiles (and records the CUDA graph), not timed
        run(3)
    sync()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, run in ways.items():
            sync()
            start = time.perf_counter()
            run(args.calls)
            sync()
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    calls = 9 + args.rounds * args.calls * len(ways)
    if int(state[0].item()) != calls:  # every call ran the step
        raise RuntimeError(f"the step ran {int(state[0].item())} times, not {calls}")
    result = {name: statistics.median(t) for name, t in times.items()}
    print(f"one call of a compiled step that does nothing, {device}, median of {args.rounds} "
          f"rounds of {args.calls} calls")
    print("| way | us per call |\n|---|---:|")
    for name, us in result.items():
        print(f"| {name} | {us:.1f} |")
    return result


if __name__ == "__main__":
    main()
