"""The decoder step over a static cache of bucketed shapes (``decode.compile``): the same
logits as the growing cache, the same hypotheses as the reference search when compiled
(backend aot_eager on a CPU), and at most two compiled graphs for every bucket of shapes."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.decode import reference_beam_search as reference
from tests.unit.decode.test_beam_search import random_sources, tiny_model
from tests.unit.decode.test_device_search import (  # noqa: F401 (fixture)
    batch,
    reversal_pairs,
    stops_at_non_finite,
    trained_model,
)
from transformer_nmt.config import BOS_ID
from transformer_nmt.decode import compiled_step
from transformer_nmt.decode.beam_search import beam_search, greedy_search
from transformer_nmt.decode.compiled_step import resolve_compile
from transformer_nmt.model.cache import BufferPool, StaticDecoderCache

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)


def test_static_cache_step_equals_growing_cache():
    """Steps with beam reorders and a sentence leaving, across every span of positions read
    (16, 32 and the whole capacity, 48): the static cache's logits (padded rows and length,
    masked keys) equal the growing cache's to 1e-5 (fp32)."""
    model = tiny_model(seed=3, vocab=30, norm="pre")
    src = random_sources([6, 3, 9], seed=2)
    memory, src_mask = model.encode(src)
    k, g = 3, torch.Generator().manual_seed(0)
    growing = model.new_cache()
    static = model.new_static_cache(BufferPool(), k, 40, torch.float32, torch.device("cpu"))
    model.start_static(static, memory, src_mask)
    last = torch.full((3, 1), BOS_ID)
    n, spans = 3, set()
    with torch.no_grad():
        for t in range(40):
            want = model.decode(last, memory, src_mask, growing)[:, -1]  # (n*W, V)
            static.set_step(last, t, torch.full((n,), 50))
            got = static.step_output(model.decode_static(static))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            spans.add((static.span, static.capacity))
            width = last.size(0) // n
            rows = (torch.arange(n)[:, None] * width
                    + torch.randint(0, width, (n, k), generator=g)).reshape(-1)
            keep = None
            if t == 3:  # the middle sentence leaves; the kept ones swap places
                keep = torch.tensor([2, 0])
                rows = rows.view(n, k)[keep].reshape(-1)
                memory, src_mask, n = memory[keep], src_mask[keep], 2
            growing.reorder(rows, sources=keep)
            static.reorder(rows, sources=keep)
            last = torch.randint(4, 30, (n * k, 1), generator=g)
    assert spans == {(16, 48), (32, 48), (48, 48)}


def counting_backend() -> CompileCounterWithBackend:
    """A ``torch.compile`` backend: aot_eager, counting the graphs it compiles
    (``frame_count``)."""
    return CompileCounterWithBackend("aot_eager")


AOT_EAGER = counting_backend()
"""One backend for the equality tests, so that they share the graphs of equal shapes."""


def same_tokens(got, want, where):
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want], where
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert a.score == pytest.approx(b.score, abs=1e-5, rel=1e-5), where


@pytest.mark.parametrize("beam", [4, 5])
def test_compiled_search_equals_reference_on_a_random_model(beam):
    """Both stopping rules, n-best 1 and 2, both length-penalty forms, the flags read every
    step, every 3 and every 8 (sentences leave the compiled step's state at different
    steps, into smaller row buckets): the reference's hypotheses."""
    model = tiny_model(seed=21, vocab=30)
    src = random_sources([7, 2, 12, 5, 9], seed=6)
    backend = AOT_EAGER
    for nbest, stopping, form, every in ((1, "bound", "gnmt", 1), (2, "beam", "fairseq", 3),
                                         (2, "bound", "fairseq", 8)):
        kwargs = {"beam_size": beam, "nbest": nbest, "stopping": stopping, "max_len_b": 6,
                  "lenpen_form": form}
        got = beam_search(model, src, compile_step=True, compile_backend=backend,
                          sync_every=every, **kwargs)
        same_tokens(got, reference.beam_search(model, src, **kwargs), (kwargs, every))
    for every in (1, 3, 8):
        got = greedy_search(model, src, 1.0, 6, compile_step=True, compile_backend=backend,
                            sync_every=every)
        same_tokens(got, reference.greedy_search(model, src, 1.0, 6), ("greedy", every))


def test_compiled_search_equals_reference_on_a_trained_model(trained_model):  # noqa: F811
    src, _, _ = batch(reversal_pairs(6, seed=7))
    backend = AOT_EAGER
    for beam in (4, 5):
        kwargs = {"beam_size": beam, "max_len_b": 5}
        got = beam_search(trained_model, src, compile_step=True, compile_backend=backend,
                          **kwargs)
        same_tokens(got, reference.beam_search(trained_model, src, **kwargs), kwargs)


@pytest.mark.parametrize("beam", [1, 2])
def test_compiled_graphs_serve_every_bucket(monkeypatch, beam):
    """Batches of varying sentence and source lengths: the whole beam (greedy) step is traced
    with symbolic shapes, so one graph serves every (rows, capacity, positions read, source
    length) bucket, the positions read the whole capacity or less, however many steps and
    batches; a second pass compiles nothing; the hypotheses are the eager search's."""
    model = tiny_model(seed=22, vocab=30)
    backend = counting_backend()

    def search(src, **kwargs):
        if beam == 1:
            return greedy_search(model, src, 1.0, 6, **kwargs)
        return beam_search(model, src, beam_size=beam, max_len_b=6, **kwargs)

    buckets: set[tuple[int, int, int, int]] = set()
    steps = []
    begin_step = StaticDecoderCache.begin_step

    def noting(cache, t):
        begin_step(cache, t)
        buckets.add((cache.rows, cache.capacity, cache.cross_attn_mask.size(-1), cache.span))
        steps.append(t)

    monkeypatch.setattr(StaticDecoderCache, "begin_step", noting)
    batches = [random_sources([3, 5, 9, 4, 6], seed=1), random_sources([18, 17], seed=2)]
    for src in batches:
        got = search(src, compile_step=True, compile_backend=backend)
        same_tokens(got, search(src), src.shape)
    assert {c for _, c, _, _ in buckets} == {16, 32}  # two capacities, two source lengths
    assert {s for _, _, s, _ in buckets} == {16, 32} and len({r for r, _, _, _ in buckets}) >= 2
    assert {(c, p) for _, c, _, p in buckets} == {(16, 16), (32, 16), (32, 32)}
    assert backend.frame_count == 1 < len(buckets) < len(steps)
    graphs = backend.frame_count
    for src in batches:
        search(src, compile_step=True, compile_backend=backend)
    assert backend.frame_count == graphs


class CountOps(TorchDispatchMode):
    """Counts the operations dispatched (views and allocations left out) outside the compiled
    step, and the calls of the compiled step, whose own operations it does not see."""

    FREE = ("view", "_unsafe_view", "slice", "select", "expand", "alias", "empty", "detach",
            "lift_fresh", "unsqueeze", "reshape", "as_strided")

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in self.FREE:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("beam", [1, 4])
def test_whole_step_is_one_call_with_few_operations_around_it(monkeypatch, beam):
    """Beam (greedy) search with ``decode.compile``: per step, one call of the compiled step
    (decoder and search update, one graph, no break) and 2 operations outside it (the
    position set, the step's back-pointers or tokens copied out), besides the reads of the
    finished flags every 8 steps and the K/V's moves to a longer span (at step 16 here, a
    read's step too); the finished sentences leave the cache and the state only when the
    live ones fit a smaller row bucket."""
    from torch.utils._python_dispatch import _disable_current_modes

    model = tiny_model(seed=24, vocab=30)
    src = random_sources([9, 2, 6, 13, 4, 7, 3, 11], seed=2)
    kwargs = {"max_len_b": 20, "sync_every": 8, "compile_backend": AOT_EAGER}

    def search(**more):
        if beam == 1:
            return greedy_search(model, src, **kwargs, **more)
        return beam_search(model, src, beam_size=beam, **kwargs, **more)

    search(compile_step=True)  # compiled here, not counted
    counter, call, first = CountOps(), compiled_step._call, []
    at_call: list[int] = []

    def counted_call(fn, device, *args):
        counter.calls += 1
        at_call.append(len(counter.ops))
        if not first:
            first.append(args)
        with _disable_current_modes():
            return call(fn, device, *args)

    monkeypatch.setattr(compiled_step, "_call", counted_call)
    reads, read = [], compiled_step.read_flags  # the calls made before each read of the flags
    monkeypatch.setattr(compiled_step, "read_flags",
                        lambda *a: reads.append(counter.calls) or read(*a))
    shrinks, leave = [], StaticDecoderCache.leave  # (sentences before, after) per move
    monkeypatch.setattr(StaticDecoderCache, "leave", lambda cache, padded, live: shrinks.append(
        (cache.rows // cache.width, padded.numel())) or leave(cache, padded, live))
    with counter:
        got = search(compile_step=True)
    same_tokens(got, search(compile_step=False), "counted")
    assert counter.calls > 16 and len(reads) >= 3
    # the operations between two calls of the step, those of a read of the flags left out
    gaps = [b - a for a, b in zip(at_call, at_call[1:])]
    quiet = [g for i, g in enumerate(gaps) if i + 1 not in reads]  # no read in between
    assert set(quiet) == {2}, (quiet, counter.ops)
    # finished sentences leave the cache only for a smaller row bucket (8 -> 4 -> 2 at most)
    assert 1 <= len(shrinks) <= 2 and all(new < old for old, new in shrinks), shrinks
    with torch.inference_mode():  # as the search runs it
        step = compiled_step.greedy_step if beam == 1 else compiled_step.beam_step
        explained = torch._dynamo.explain(step)(*first[0])
    assert explained.graph_count == 1 and explained.graph_break_count == 0


def test_compiled_search_stops_at_non_finite_logits():
    """NaN weights: the compiled search raises at its first read of the flags, naming the first
    output position, as the eager search does."""
    stops_at_non_finite(compile_step=True, compile_backend=AOT_EAGER)


def test_compile_values():
    assert resolve_compile("auto", "cpu") is False
    assert resolve_compile(None, "cuda") is True
    assert resolve_compile("True", "cpu") is True
    assert resolve_compile(False, "cuda") is False
    with pytest.raises(ValueError, match="compile='sometimes'"):
        resolve_compile("sometimes", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_search_with_cuda_graphs_equals_eager():
    """reduce-overhead (a CUDA graph per bucket) on the GPU: the eager search's tokens, and
    no compiled graph skipped by CUDA graphs (a skipped one would launch its kernels one by
    one)."""
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    model = tiny_model(seed=23, vocab=30).cuda()
    src = random_sources([7, 2, 12, 5, 9, 4, 3], seed=8).cuda()
    for beam in (1, 4):
        kwargs = {"max_len_b": 6}
        if beam == 1:
            want = greedy_search(model, src, 1.0, 6)
            got = greedy_search(model, src, 1.0, 6, compile_step=True)
        else:
            want = beam_search(model, src, beam_size=beam, **kwargs)
            got = beam_search(model, src, beam_size=beam, compile_step=True, **kwargs)
        same_tokens(got, want, f"beam {beam}")
    assert counters["inductor"]["cudagraph_skips"] == skips
