"""The host's fixed cost of one call of a compiled decoding step: a function of one tiny
in-place operation compiled as ``decode.compile`` compiles the search's step (dynamic shapes,
its settings: :func:`transformer_nmt.decode.compiled_step.compile_settings`), called with the
settings entered once around the calls (as the search calls its step) or entered at every
call, and the same function uncompiled. Its work is nothing, so the time is the call's own:
Dynamo's guards, the compiled wrapper and, on CUDA (``reduce-overhead``), the CUDA graph's
replay and launch. Rounds alternate the three; prints the median microseconds per call.

``--guards L1,L2,...`` adds the real beam search step (:func:`compiled_step.beam_step`, beam 4,
one sentence, a random model of d_model 16 with L decoder layers) compiled by a backend that
runs its graph at the first call only and returns those outputs after: a call's time is then
Dynamo's alone, the guards it checks over the step's inputs (the model's parameters, the
cache's K/V of every layer, the search state) before any compiled code runs. Those guards are
host work of the same size on any device; the difference of two layer counts is their cost
per decoder layer.

    .venv/bin/python scripts/micro/time_compiled_call.py
    .venv/bin/python scripts/micro/time_compiled_call.py --guards 1,6
    .venv/bin/python scripts/micro/time_compiled_call.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from transformer_nmt.config import EOS_ID, ModelConfig
from transformer_nmt.decode import compiled_step
from transformer_nmt.decode.search_update import SearchRule
from transformer_nmt.decode.sync import BeamOutputs, Reads
from transformer_nmt.model.transformer import Transformer


class GuardsOnly:
    """A ``torch.compile`` backend whose compiled function runs the traced graph at its first
    call and returns those outputs at every later one, counting the calls: what a call costs
    past the first is Dynamo's (guards, frame), not the graph's."""

    def __init__(self) -> None:
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        outputs: list = []

        def run(*args: object) -> object:
            self.calls += 1
            if not outputs:
                outputs.append(gm(*args))
            return outputs[0]

        return run


def beam_step_calls(layers: int, backend: GuardsOnly,
                    device: torch.device) -> Callable[[int], None]:
    """``n`` calls of :func:`compiled_step.beam_step` compiled by ``backend`` (dynamic shapes,
    as ``decode.compile``), at the first step of one sentence and beam 4, for a random model
    of d_model 16 with ``layers`` decoder layers, inside inference mode and
    ``compile_settings()`` entered once (as the search calls its step)."""
    cfg = ModelConfig(d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=layers,
                      dropout=0.0)
    model = Transformer(cfg, 64).to(device).eval()
    k = 4
    src = torch.randint(4, 64, (1, 10), device=device)
    src[:, -1] = EOS_ID
    with torch.inference_mode():
        memory, mask = model.encode(src)
        max_len = torch.full((1,), 60, device=device)
        host = Reads(max_len.tolist(), 8)
        pool, cache = compiled_step._start(model, memory, mask, max_len, k, host)
        state = compiled_step.BeamState(pool, SearchRule(k, 0.6, "gnmt", False),
                                        BeamOutputs(1, 61, k, 1, device), device)
        state.start(cache.rows // k, 1)
        cache.begin_step(0)
    fn = torch.compile(lambda *a: compiled_step.beam_step(*a), backend=backend, dynamic=True)

    def calls(n: int) -> None:
        with torch.inference_mode(), compiled_step.compile_settings():
            for _ in range(n):
                fn(model, cache, state, 1)

    return calls


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time and print; returns ``{way: median us per call}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None,
                   help="torch.compile backend (default: decode.compile's, reduce-overhead on "
                        "CUDA, inductor elsewhere)")
    p.add_argument("--calls", type=int, default=2000, help="calls per round and way")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--guards", default="",
                   help="decoder layer counts, e.g. 1,6: also time the beam step's guards alone")
    args = p.parse_args(argv)
    try:
        guard_layers = sorted({int(x) for x in args.guards.split(",") if x.strip()})
    except ValueError:
        guard_layers = [0]
    if guard_layers and guard_layers[0] < 1:
        p.error(f"--guards {args.guards!r}: decoder layer counts (at least 1) separated by "
                "commas")
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
    backend = GuardsOnly()
    for layers in guard_layers:
        ways[f"beam step's guards, {layers} decoder layer(s)"] = beam_step_calls(layers, backend,
                                                                                 device)
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
    calls = 9 + args.rounds * args.calls * 3  # the three ways of the trivial step
    if int(state[0].item()) != calls:  # every call ran the step
        raise RuntimeError(f"the step ran {int(state[0].item())} times, not {calls}")
    expected = len(guard_layers) * (3 + args.rounds * args.calls)
    if backend.graphs != len(guard_layers) or backend.calls != expected:
        raise RuntimeError(f"the beam steps compiled {backend.graphs} graphs and were called "
                           f"{backend.calls} times, not {len(guard_layers)} and {expected}: a "
                           "recompilation or a call that skipped Dynamo")
    result = {name: statistics.median(t) for name, t in times.items()}
    print(f"one call of a compiled step, {device}, median of {args.rounds} rounds of "
          f"{args.calls} calls (the first three ways: a step that does nothing)")
    print("| way | us per call |\n|---|---:|")
    for name, us in result.items():
        print(f"| {name} | {us:.1f} |")
    if len(guard_layers) >= 2:  # sorted, distinct
        lo, hi = guard_layers[0], guard_layers[-1]
        slope = (result[f"beam step's guards, {hi} decoder layer(s)"]
                 - result[f"beam step's guards, {lo} decoder layer(s)"]) / (hi - lo)
        result["guards per decoder layer"] = slope
        print(f"guards per decoder layer: {slope:.1f} us")
    return result


if __name__ == "__main__":
    main()
