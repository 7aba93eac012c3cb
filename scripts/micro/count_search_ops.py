"""Operations per beam-search step: the decoder call against the search around it, for our
engine and for Hugging Face ``generate`` on the exported model.

On a GPU every operation an eager step dispatches costs host time (Python, the dispatcher,
at least one kernel launch), so a step whose kernels are short is as slow as its count of
operations. This script counts them without a GPU: every operation the search dispatches
(views, reshapes and allocations left out: they launch nothing) is recorded by a
``TorchDispatchMode`` and attributed to the encoder, the decoder call, or the search around
the decoder (the top-k, the n-best lists, the finished flags, the cache reorder between
decoder calls), then divided by the decoder calls (the steps).

``--device cuda`` counts on a GPU, exactly what it runs. On a CPU the model takes two
CPU-only paths (matmul attention for one query, the contiguous cache) and the top-k its
block form; ``--gpu-paths`` takes the GPU's instead (SDPA, the reused cache buffers, one
``torch.topk``, the flags read every 8 steps), so that the CPU counts what a GPU's eager
step dispatches, except the non-finite check (on a GPU 3 operations on the step's
log-probabilities, on a CPU 1 on its top-k: a GPU's step dispatches 2 more). ``--marian`` counts
``MarianMTModel.generate`` (num_beams = K, the same length penalty and stopping rule) on the
exported model as well; it needs transformers (``make bench-install``). ``--precision bf16``
decodes under autocast as ``decode.precision=bf16`` does (our model's linear weights cast once:
``decode.quantize.decoding_model``), ``generate`` under the same autocast. ``--host-time D``
times each engine's wall time per decoding step on a model of the same layers and vocabulary
with d_model D (random weights): its kernels are tiny, so the time is mostly the host's
(Python and the dispatcher; a GPU adds its launches), a proxy for an eager step on a GPU whose
kernels are short (fastest of ``--repeats`` passes, the engines alternating).

    .venv-bench/bin/python scripts/micro/count_search_ops.py \\
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt --gpu-paths --marian

Prints one line per engine and returns ``{engine: {"steps", "encoder", "decoder", "search",
"search_ops", "decoder_ops"}}`` (and ``host_ms_per_step``, ``host_steps`` with
``--host-time``): operations per step (the encoder's per batch), and the search's and the
decoder's by name.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_common as bc  # noqa: E402

FREE = frozenset({
    "view", "reshape", "_unsafe_view", "_reshape_alias", "as_strided", "transpose", "t",
    "expand", "select", "slice", "unsqueeze", "squeeze", "permute", "alias", "split",
    "split_with_sizes", "narrow", "view_as", "detach", "unbind", "chunk", "diagonal",
    "resolve_conj", "resolve_neg", "lift_fresh", "empty", "empty_like", "new_empty",
    "empty_strided", "dropout", "size", "stride", "dim", "is_nonzero", "sym_size",
})
"""Operations that launch no kernel (views, allocations; dropout in eval mode returns its
input): not counted."""


class OpCounter(TorchDispatchMode):
    """Counts the dispatched operations (not those in :data:`FREE`) per part: ``part`` names
    the one running now (``search`` outside the encoder and decoder calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.part = "search"
        self.ops = {"encoder": Counter(), "decoder": Counter(), "search": Counter()}
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE:
            self.ops[self.part][name] += 1
        return func(*args, **(kwargs or {}))

    @contextmanager
    def within(self, part: str):
        """Attribute the operations of this block to ``part`` (and count one call of it)."""
        outer, self.part = self.part, part
        self.calls[part] += 1
        try:
            yield
        finally:
            self.part = outer


def attribute(counter: OpCounter, obj, method: str, part: str) -> None:
    """Wrap ``obj.method`` (on the instance) so its operations count as ``part``."""
    inner = getattr(obj, method)

    def wrapped(*args, **kwargs):
        with counter.within(part):
            return inner(*args, **kwargs)

    setattr(obj, method, wrapped)


@contextmanager
def gpu_paths(model):
    """The model and the search take the branches a GPU takes, on a CPU."""
    from transformer_nmt.decode import candidates
    from transformer_nmt.model.transformer import MultiHeadAttention

    new_cache = model.new_cache

    def buffered_cache():
        cache = new_cache()
        cache.contiguous = False  # the reused K/V buffers of other devices
        return cache

    with ExitStack() as stack:
        for target, name, value in ((MultiHeadAttention, "_cpu_step", lambda self, x: False),
                                    (candidates, "block_width", lambda vocab, k: None),
                                    (model, "new_cache", buffered_cache)):
            old = getattr(target, name)
            setattr(target, name, value)
            stack.callback(setattr, target, name, old)
        yield


@contextmanager
def compiled_calls(counter: OpCounter):
    """``decode.compile``'s step (aot_eager: traced, no code generated) counted as one
    operation, ``graph``, of the decoder part per call; the operations inside it are not
    counted (on CUDA they are one CUDA graph replay)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from transformer_nmt.decode import compiled_step

    call, compiled = compiled_step._call, compiled_step._compiled

    def counted(fn, device, *args):
        with counter.within("decoder"):
            counter.ops["decoder"]["graph"] += 1
            with _disable_current_modes():
                return call(fn, device, *args)

    compiled_step._call = counted
    compiled_step._compiled = lambda step, device, backend: compiled(step, device, "aot_eager")
    try:
        yield
    finally:
        compiled_step._call, compiled_step._compiled = call, compiled


def summary(counter: OpCounter, steps: int) -> dict:
    """Operations per step of the decoder and of the search, per batch of the encoder."""
    per = max(steps, 1)
    return {
        "steps": steps,
        "encoder": sum(counter.ops["encoder"].values()) / max(counter.calls["encoder"], 1),
        "decoder": sum(counter.ops["decoder"].values()) / per,
        "search": sum(counter.ops["search"].values()) / per,
        "search_ops": {k: v / per for k, v in counter.ops["search"].most_common()},
        "decoder_ops": {k: v / per for k, v in counter.ops["decoder"].most_common()},
    }


def search_config(args):
    """The DecodeConfig of our search as bench_decode.py runs it (``lenpen_form=fairseq``;
    ``--stopping``, beam by default), at ``args.precision``, without the CPU's packed weights."""
    from transformer_nmt.config import DecodeConfig

    return DecodeConfig(beam_size=args.beam, lenpen=0.6, lenpen_form="fairseq",
                        stopping=args.stopping,
                        max_len_a=1.0, max_len_b=50, max_tokens=args.max_tokens,
                        device=args.device, compile="true" if args.compile else "false",
                        precision=args.precision,
                        weight_prepack=False, sync_every="8" if args.gpu_paths else "auto")


def count_ours(model, tokenizer, lines, args) -> dict:
    """Our beam search as nmt-translate runs it (``lenpen_form=fairseq``, ``--stopping``)."""
    from transformer_nmt.decode.quantize import decoding_model
    from transformer_nmt.decode.translate import translate_lines

    cfg = search_config(args)
    model = decoding_model(copy.deepcopy(model), cfg, args.device)  # as nmt-translate decodes
    counter = OpCounter()
    attribute(counter, model, "encode", "encoder")
    attribute(counter, model, "decode", "decoder")
    with ExitStack() as stack:
        if args.gpu_paths:
            stack.enter_context(gpu_paths(model))
        if args.compile:
            stack.enter_context(compiled_calls(counter))
        translate_lines(model, tokenizer, lines, cfg, args.device)  # warm-up, not counted
        counter.calls.clear()
        counter.ops = {part: Counter() for part in counter.ops}
        with torch.no_grad(), counter:
            translate_lines(model, tokenizer, lines, cfg, args.device)
    return summary(counter, counter.calls["decoder"])


def count_marian(model, tokenizer, lines, args) -> dict:
    """``MarianMTModel.generate`` on the exported model, scripts/bench/bench_decode.py's call."""
    import bench_decode as bd

    marian = bc.port_to_marian(model).to(args.device).eval()
    bench_args = argparse.Namespace(beam=args.beam, lenpen=0.6, max_len_a=1.0, max_len_b=50,
                                    max_tokens=args.max_tokens, device=args.device,
                                    precision=args.precision)
    counter = OpCounter()
    attribute(counter, marian.model.encoder, "forward", "encoder")
    attribute(counter, marian.model.decoder, "forward", "decoder")
    bd.decode_marian(marian, tokenizer, lines[:2], bench_args)
    counter.calls.clear()
    with torch.no_grad(), counter:
        bd.decode_marian(marian, tokenizer, lines, bench_args)
    return summary(counter, counter.calls["decoder"])


def shrunk(model, d_model: int):
    """A model of ``model``'s layers, vocabulary and settings with ``d_model`` (d_ff twice it, 2
    heads), random weights: its kernels are tiny, so a step's time is the host's."""
    from transformer_nmt.model.transformer import Transformer

    cfg = dataclasses.replace(model.cfg, d_model=d_model, d_ff=2 * d_model, heads=2, d_k=None,
                              d_v=None)
    torch.manual_seed(0)
    return Transformer(cfg, model.vocab_size).to(next(model.parameters()).device).eval()


def host_time(model, tokenizer, lines, args) -> dict:
    """Wall ms per decoding step of each engine on :func:`shrunk` (``args.host_time``), the
    fastest of ``args.repeats`` passes, the engines alternating; ``{engine: (ms, steps of a
    pass)}``. A step is a call of the decoder, or of the compiled step with ``--compile``."""
    import bench_decode as bd

    from transformer_nmt.decode.quantize import decoding_model
    from transformer_nmt.decode.translate import translate_lines

    small = shrunk(model, args.host_time)
    calls = Counter()

    def counting(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    cfg = search_config(args)
    ours = decoding_model(copy.deepcopy(small), cfg, args.device)
    ours.decode = counting("ours", ours.decode)  # the eager step's decoder call
    engines = {"ours": lambda x: translate_lines(ours, tokenizer, x, cfg, args.device)}
    if args.marian:
        marian = bc.port_to_marian(small).to(args.device).eval()
        marian.model.decoder.forward = counting("marian", marian.model.decoder.forward)
        bench_args = argparse.Namespace(beam=args.beam, lenpen=0.6, max_len_a=1.0, max_len_b=50,
                                        max_tokens=args.max_tokens, device=args.device,
                                        precision=args.precision)
        engines["marian"] = lambda x: bd.decode_marian(marian, tokenizer, x, bench_args)
    best: dict[str, tuple[float, int]] = {}
    with ExitStack() as stack:
        if args.gpu_paths:
            stack.enter_context(gpu_paths(ours))
        if args.compile:  # a step is a call of the compiled step (the model's decode unused)
            from transformer_nmt.decode import compiled_step

            stack.callback(setattr, compiled_step, "_call", compiled_step._call)
            compiled_step._call = counting("ours", compiled_step._call)
        for run in engines.values():
            run(lines[:2])  # warm-up
        for _ in range(args.repeats):
            for name, run in engines.items():
                calls[name] = 0
                bd.sync(args)
                start = time.perf_counter()
                run(lines)
                bd.sync(args)
                if not calls[name]:
                    raise RuntimeError(f"{name}: no decoding step was counted")
                ms = (time.perf_counter() - start) * 1e3 / calls[name]
                best[name] = min(best.get(name, (math.inf, 0)), (ms, calls[name]))
    return best


def main(argv: list[str] | None = None) -> dict:
    """Count and print; see the module docstring for the result."""
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.data.bpe import SentencePieceTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bc.add_search_arguments(p, sentences=64)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--gpu-paths", action="store_true",
                   help="on a CPU, take the branches a GPU takes (see the docstring)")
    p.add_argument("--marian", action="store_true",
                   help="count Hugging Face generate on the exported model as well")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="decode under autocast at bf16 (our model's linear weights cast once, as "
                        "decode.precision=bf16 does; generate under the same autocast)")
    p.add_argument("--host-time", type=int, default=0, metavar="D_MODEL",
                   help="also time each engine's wall ms per decoding step on a model of the "
                        "same layers and vocabulary with this d_model (random weights, tiny "
                        "kernels: the host's time per step)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes of --host-time")
    p.add_argument("--stopping", default="beam", choices=["beam", "bound"],
                   help="our search's stopping rule: beam (the peers', bench_decode.py's) or "
                        "bound (decode.stopping's default, exact)")
    p.add_argument("--compile", action="store_true",
                   help="our search with decode.compile=true: its compiled step counts as one "
                        "operation, 'graph', per call (aot_eager; what it runs is not counted)")
    args = p.parse_args(argv)
    if args.gpu_paths and args.device != "cpu":
        p.error("--gpu-paths emulates a GPU's branches on a CPU; with --device cuda they run")
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.checkpoint, args.device)
    model.eval()
    tokenizer = SentencePieceTokenizer(args.spm)
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()[: args.sentences]
    results = {"ours": count_ours(model, tokenizer, lines, args)}
    if args.marian:
        results["marian"] = count_marian(model, tokenizer, lines, args)
    if args.host_time:
        for name, (ms, steps) in host_time(model, tokenizer, lines, args).items():
            results[name]["host_ms_per_step"], results[name]["host_steps"] = ms, steps
    where = "GPU paths on a CPU" if args.gpu_paths else args.device
    for name, r in results.items():
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(r["search_ops"].items())[:8])
        print(f"{name} ({where}): {r['steps']} steps, operations per step: decoder "
              f"{r['decoder']:.1f}, search {r['search']:.1f} ({top}); encoder {r['encoder']:.1f} "
              "per batch")
        if "host_ms_per_step" in r:
            print(f"{name} ({where}): {r['host_ms_per_step']:.3f} ms per decoding step with "
                  f"d_model {args.host_time} (fastest of {args.repeats} passes)")
    return results


if __name__ == "__main__":
    main()
