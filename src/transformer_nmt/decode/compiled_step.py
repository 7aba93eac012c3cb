"""The steps of beam and greedy search compiled over a static cache (``decode.compile``).

:func:`static_log_probs` computes a decoder step's constrained log-probabilities over a
:class:`~transformer_nmt.model.cache.StaticDecoderCache` with tensor ops only; :func:`beam_step`
is a whole step of beam search, that decoder step and the search's update
(:func:`~transformer_nmt.decode.search_update.beam_update`), writing the search's state
(:class:`BeamState`) and the next step's inputs in place. ``torch.compile`` traces each with
symbolic shapes (rows, positions read, capacity, padded source length), so one compiled graph
serves every bucket, and on CUDA (mode ``reduce-overhead``) records a CUDA graph per bucket and
replays it: a beam search step is then one replay, and two operations besides (the position,
the back-pointers copied out). :func:`static_beam_search` is beam search's loop around it;
:func:`greedy_step` and :func:`static_greedy_search` are greedy search's. docs/model.md,
"Compiled decoding step", has the design.

Shape legend as in :mod:`transformer_nmt.decode.beam_search`; R the static cache's rows, N its
sentences (R = N x K).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.decode.search_update import SearchRule, beam_update, greedy_update
from transformer_nmt.decode.sync import BeamOutputs, Reads, read_flags
from transformer_nmt.model.cache import BufferPool, padded_index, row_bucket


def resolve_compile(value: bool | str | None, device: torch.device | str) -> bool:
    """Whether the decoder step runs compiled (``decode.compile``).

    Args:
        value: ``true``/``false`` (bools or their text), or ``auto``/None: on a CUDA device only
            (on a CPU compiling costs more than it saves, docs/model.md).
        device: where the search runs.

    Raises:
        ValueError: anything else (names the value).
    """
    text = str(value).strip().lower() if value is not None else "auto"
    if text == "auto":
        return torch.device(device).type == "cuda"
    if text in ("true", "false"):
        return text == "true"
    raise ValueError(f"compile={value!r} must be auto, true or false (run the decoder step "
                     "compiled over a static cache)")


def static_log_probs(model: Any, cache: Any, min_len: int) -> tuple[Tensor, Tensor]:
    """The decoder step of :func:`~transformer_nmt.decode.beam_search.next_token_log_probs`,
    constraints included, over a :class:`~transformer_nmt.model.cache.StaticDecoderCache`, in
    tensor ops only (the function ``decode.compile`` compiles): (R, V) float32 constrained
    log-probabilities and (R,) bool non-finite flags of every cache row."""
    logits = model.decode_static(cache)  # (R, V)
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    bad = ~torch.isfinite(lprobs.amax(dim=-1))  # (R,)
    col = torch.arange(lprobs.size(-1), device=lprobs.device)  # (V,)
    pos = cache.position
    barred = col.eq(PAD_ID) | col.eq(BOS_ID) | (col.eq(EOS_ID) & pos.lt(min_len))  # (V,)
    lprobs = lprobs.masked_fill(barred, -math.inf)
    at_limit = cache.max_len.repeat_interleave(cache.width).eq(pos)  # (R,) eos forced
    lprobs = lprobs.masked_fill(at_limit[:, None] & col.ne(EOS_ID), -math.inf)
    return lprobs, bad


RECOMPILE_LIMIT = 256
"""Graphs a compiled step may hold (one serves every bucket)."""


def _fx_config() -> Any:
    """``torch.fx.experimental._config`` where it has ``use_duck_shape``, else None."""
    try:
        config = importlib.import_module("torch.fx.experimental._config")
    except ImportError:
        return None
    return config if hasattr(config, "use_duck_shape") else None


_FX_CONFIG = _fx_config()  # looked up once, not at every step


def _no_duck_sizing() -> contextlib.AbstractContextManager:
    """Tracing without "duck sizing" (``use_duck_shape``): a bucket's size that equals another
    size at trace time (d_k, say) is not tied to it (which would make it static). A no-op on a
    torch without that setting."""
    return (_FX_CONFIG.patch(use_duck_shape=False) if _FX_CONFIG is not None
            else contextlib.nullcontext())


_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> BufferPool
_COMPILED: dict[Any, Callable] = {}


def _compiled(step: Callable, device: torch.device, backend: Any) -> Callable:
    """``step`` (:func:`beam_step`, :func:`greedy_step` or :func:`static_log_probs`) under
    ``torch.compile`` with dynamic shapes (the buckets' sizes symbolic: one compilation serves
    them all): mode ``reduce-overhead`` on CUDA without ``backend`` (a CUDA graph recorded per
    bucket), else ``backend`` (default inductor)."""
    key = (step, device.type, backend)
    if key not in _COMPILED:
        if backend is None and device.type == "cuda":
            fn = torch.compile(step, mode="reduce-overhead", dynamic=True)
        else:
            fn = torch.compile(step, backend=backend or "inductor", dynamic=True)
        _COMPILED[key] = fn
    return _COMPILED[key]


def _static_cache(model: Any, memory: Tensor, src_mask: Tensor, width: int,
                  steps: int) -> tuple[BufferPool, Any]:
    """The model's buffer pool and a :class:`StaticDecoderCache` set up for ``memory``
    (N', S, D): ``width`` rows per sentence, ``steps`` positions, K/V in the autocast dtype
    when autocast is on."""
    device = memory.device
    dtype = (torch.get_autocast_dtype(device.type)
             if torch.is_autocast_enabled(device.type) else memory.dtype)
    pool = _POOLS.setdefault(model, BufferPool())
    cache = model.new_static_cache(pool, width, steps, dtype, device)
    model.start_static(cache, memory, src_mask)
    return pool, cache


@contextlib.contextmanager
def compile_settings() -> Iterator[None]:
    """The settings a compiled step is traced under, entered once around a search's calls
    (:func:`_call`), not at every step (entering them is host time per step:
    scripts/micro/time_compiled_call.py): the floats a step meets (length penalty, embedding
    scale, LayerNorm eps) are constants, sizes are not duck-sized (:func:`_no_duck_sizing`),
    :data:`RECOMPILE_LIMIT` graphs."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, specialize_float=True), \
            _no_duck_sizing():
        yield


def _call(fn: Callable, device: torch.device, *args: Any) -> Any:
    """One call of a compiled step, inside :func:`compile_settings`."""
    if device.type == "cuda":  # the outputs of the previous replay are done with
        torch.compiler.cudagraph_mark_step_begin()
    return fn(*args)


class _SearchState:
    """A compiled search's per-sentence tensors, in pool buffers of the cache's row bucket N (a
    row per sentence searched or finished since the last move to a smaller bucket, then dead
    rows, which never finish): ``active`` (N,) bool and ``bad_step`` 0-d long here, the rest
    named by the search (``_take``), with what it records per step and keeps per sentence."""

    def __init__(self, pool: BufferPool, device: torch.device) -> None:
        self.pool, self.device = pool, device
        self.bad_step = pool.get("search_bad_step", (), torch.long, device)

    def _per_sentence(self) -> tuple[Tensor, ...]:
        """The buffers with a row per sentence that a move to another bucket gathers."""
        raise NotImplementedError

    def _take(self, n: int) -> None:
        """Point the buffers at the pool's tensors of the bucket of ``n`` sentences."""
        raise NotImplementedError

    def _dead(self, live: int) -> None:
        """Mark the rows past ``live`` dead."""
        self.active[live:] = False

    def start(self, n: int, live: int) -> None:
        """``live`` sentences in a bucket of ``n``, at the first step."""
        self._take(n)
        self.active.copy_(torch.arange(n, device=self.device) < live)
        self.bad_step.fill_(-1)

    def leave(self, padded: Tensor, live: int) -> None:
        """Keep the sentences ``padded[:live]`` in that order, in the buffers of the bucket of
        ``padded`` (N',) long; the rest are dead."""
        # gathered before the buffers change (the same ones when the bucket does not)
        kept = [x.index_select(0, padded) for x in self._per_sentence()]
        self._take(padded.numel())
        for x, new in zip(self._per_sentence(), kept):
            x.copy_(new)
        self._dead(live)

    def record(self, t: int, where: Tensor) -> None:
        """Copy out step ``t``'s outputs of the state rows, into the rows ``where`` (N,)."""
        raise NotImplementedError

    def store(self, rows: Tensor, sentences: Tensor) -> None:
        """Keep the results of the finished state ``rows`` as those of ``sentences``."""
        raise NotImplementedError


class BeamState(_SearchState):
    """Beam search's state (:class:`_SearchState`): ``scores`` (N, K) float32 cumulative
    log-probabilities (-inf: a dead beam), ``fin_f`` / ``fin_i`` (N, n, 2) the finished
    n-best, and ``step`` (N, K, 2) long, the (token, beam) back-pointers of the last step,
    recorded into ``out``."""

    def __init__(self, pool: BufferPool, rule: SearchRule, out: BeamOutputs,
                 device: torch.device) -> None:
        super().__init__(pool, device)
        self.rule, self.out, self.n_keep = rule, out, out.out_f.size(1)

    def _per_sentence(self) -> tuple[Tensor, ...]:
        return self.scores, self.fin_f, self.fin_i, self.active

    def _take(self, n: int) -> None:
        g, k, m, dev = self.pool.get, self.rule.k, self.n_keep, self.device
        self.scores = g("beam_scores", (n, k), torch.float32, dev)
        self.fin_f = g("beam_fin_f", (n, m, 2), torch.float32, dev)
        self.fin_i = g("beam_fin_i", (n, m, 2), torch.long, dev)
        self.active = g("beam_active", (n,), torch.bool, dev)
        self.step = g("beam_step", (n, k, 2), torch.long, dev)

    def start(self, n: int, live: int) -> None:
        """As :meth:`_SearchState.start`: one live beam each (the others -inf: every beam
        holds ``bos`` then), nothing finished."""
        super().start(n, live)
        self.scores.fill_(-math.inf)
        self.scores[:live, 0] = 0.0
        self.fin_f.fill_(-math.inf)
        self.fin_i.zero_()

    def _dead(self, live: int) -> None:
        super()._dead(live)
        self.scores[live:] = -math.inf

    def record(self, t: int, where: Tensor) -> None:
        self.out.record(t, self.step, where)

    def store(self, rows: Tensor, sentences: Tensor) -> None:
        self.out.store(rows, sentences, self.fin_f, self.fin_i)


class GreedyState(_SearchState):
    """Greedy search's state (:class:`_SearchState`): ``log_probs`` (N,) running sums and
    ``ended`` (N, 2) (tokens before ``eos``, log-probability) at each sentence's ``eos``; the
    step's tokens (the cache's ``tokens``) recorded into ``history`` (B + 1, T) long, ``ended``
    kept in ``out`` (B + 1, 2) (row B: the spare row of the dead ones)."""

    def __init__(self, pool: BufferPool, cache: Any, history: Tensor, out: Tensor) -> None:
        super().__init__(pool, history.device)
        self.cache, self.history, self.out = cache, history, out

    def _per_sentence(self) -> tuple[Tensor, ...]:
        return self.log_probs, self.ended, self.active

    def _take(self, n: int) -> None:
        g, dev = self.pool.get, self.device
        self.log_probs = g("greedy_log_probs", (n,), torch.float32, dev)
        self.ended = g("greedy_ended", (n, 2), torch.float32, dev)
        self.active = g("greedy_active", (n,), torch.bool, dev)

    def start(self, n: int, live: int) -> None:
        """As :meth:`_SearchState.start`: nothing generated, nothing ended."""
        super().start(n, live)
        self.log_probs.zero_()
        self.ended.zero_()

    def record(self, t: int, where: Tensor) -> None:
        self.history[:, t].index_copy_(0, where, self.cache.tokens)

    def store(self, rows: Tensor, sentences: Tensor) -> None:
        self.out.index_copy_(0, sentences, self.ended.index_select(0, rows))


def beam_step(model: Any, cache: Any, state: BeamState, min_len: int) -> None:
    """A whole step of beam search in tensor ops only (the function ``decode.compile``
    compiles for beam search): the decoder call over the static cache
    (:func:`static_log_probs`) and the search's update
    (:func:`~transformer_nmt.decode.search_update.beam_update`) at ``cache.position``, written
    into ``state`` and into the cache's inputs of the next step (``order``: the rows each new
    beam extends; ``tokens``: the tokens they add)."""
    lprobs, bad = static_log_probs(model, cache, min_len)  # (R, V), (R,)
    u = beam_update(lprobs, bad, state.scores, state.fin_f, state.fin_i, state.active,
                    state.bad_step, cache.position, cache.max_len, state.rule)
    n, k = u.scores.shape
    state.scores.copy_(u.scores)
    state.fin_f.copy_(u.fin_f)
    state.fin_i.copy_(u.fin_i)
    state.active.copy_(u.active)
    state.bad_step.copy_(u.bad_step)
    state.step.copy_(torch.stack([u.tokens, u.beams], 2))
    cache.order.copy_((torch.arange(n, device=u.beams.device) * k).unsqueeze(1)
                      .add(u.beams).view(-1))
    cache.tokens.copy_(u.tokens.view(-1))


def greedy_step(model: Any, cache: Any, state: GreedyState, min_len: int) -> None:
    """A whole step of greedy search in tensor ops only (the function ``decode.compile``
    compiles for greedy search): the decoder call over the static cache
    (:func:`static_log_probs`) and :func:`~transformer_nmt.decode.search_update.greedy_update`
    at ``cache.position``, written into ``state`` and into the cache's ``tokens`` (the next
    step's inputs; the cache's ``order`` stays the identity)."""
    lprobs, bad = static_log_probs(model, cache, min_len)  # (N, V), (N,)
    u = greedy_update(lprobs, bad, state.log_probs, state.ended, state.active, state.bad_step,
                      cache.position, cache.max_len)
    state.log_probs.copy_(u.log_probs)
    state.ended.copy_(u.ended)
    state.active.copy_(u.active)
    state.bad_step.copy_(u.bad_step)
    cache.tokens.copy_(u.tokens)


def _sentence_rows(slots: list[int | None], spare: int, device: torch.device) -> Tensor:
    """(N,) long: the row of ``out.hist`` each state row writes, its sentence, or ``spare``
    (row B, never read) for the rows that hold none."""
    return torch.tensor([spare if s is None else s for s in slots], device=device)


def _start(model: Any, memory: Tensor, src_mask: Tensor, max_len: Tensor, width: int,
           host: Reads) -> tuple[BufferPool, Any]:
    """The pool and the static cache of a compiled search, its length limits and first tokens
    (``bos``) set."""
    pool, cache = _static_cache(model, memory, src_mask, width, max(host.max_len) + 1)
    n = cache.rows // width
    cache.max_len.copy_(max_len.index_select(0, padded_index(memory.size(0), n, memory.device)))
    cache.tokens.fill_(BOS_ID)
    return pool, cache


@compile_settings()
def _run(step: Callable, backend: Any, model: Any, cache: Any, state: _SearchState,
         min_len: int, host: Reads, bsz: int) -> None:
    """The loop of a compiled search of ``bsz`` sentences, inside :func:`compile_settings`:
    per step, the position set (and the K/V moved to the next span when it is reached), one
    call of ``step`` compiled (:func:`_compiled`; the whole step), the step's outputs
    recorded. Every ``host.sync_every`` steps the host reads the flags and the state keeps the
    results of the sentences that finished; their rows stay, inactive, until the live
    sentences fit a smaller row bucket, and are then dropped from the cache and the state (a
    gather outside the graph, at most log2(B) times a batch)."""
    device, n = cache.device, cache.rows // cache.width
    state.start(n, bsz)
    # the sentence each state row holds: None for the rows past the batch and for those whose
    # results are kept; on the device, ``where``, B for the rows past the batch
    slots: list[int | None] = list(range(bsz)) + [None] * (n - bsz)
    where = _sentence_rows(slots, bsz, device)
    fn = _compiled(step, device, backend)
    t = 0
    while True:
        cache.begin_step(t)
        cache.step_width = cache.width if t else 1  # the search's rows per sentence
        _call(fn, device, model, cache, state, min_len)
        state.record(t, where)
        if host.due(t):
            active = read_flags(state.active, state.bad_step)  # state rows
            live = set(active)
            done = [r for r, s in enumerate(slots) if s is not None and r not in live]
            if done:
                rows = torch.tensor([done, [slots[r] for r in done]], device=device)
                state.store(rows[0], rows[1])
                for r in done:
                    slots[r] = None
            if not active:
                return
            host.retain([slots[r] for r in active])
            cache.sentences = len(active)
            if row_bucket(len(active)) < n:
                n = row_bucket(len(active))
                kept = active + [active[0]] * (n - len(active))
                padded = torch.tensor(kept, device=device)
                cache.leave(padded, len(active))
                state.leave(padded, len(active))
                slots = [slots[r] for r in active] + [None] * (n - len(active))
                where = _sentence_rows(slots, bsz, device)
        t += 1


def static_beam_search(model: Any, memory: Tensor, src_mask: Tensor, max_len: Tensor,
                       host: Reads, rule: SearchRule, min_len: int, out: BeamOutputs,
                       backend: Any) -> None:
    """The loop of :func:`~transformer_nmt.decode.beam_search.beam_search` with its whole
    step compiled (:func:`beam_step`), into ``out``: the step's back-pointers copied into
    ``out.hist`` after each call, the n-best of the sentences that finished kept at each read
    of the flags (:func:`_run`).

    Args:
        memory: (B, S, D), src_mask: (B, S) from the encoder; max_len: (B,) long.

    Raises:
        NonFiniteScoresError: NaN or infinite logits (at a read of the flags).
    """
    pool, cache = _start(model, memory, src_mask, max_len, rule.k, host)
    state = BeamState(pool, rule, out, memory.device)
    _run(beam_step, backend, model, cache, state, min_len, host, memory.size(0))


def static_greedy_search(model: Any, memory: Tensor, src_mask: Tensor, max_len: Tensor,
                         host: Reads, min_len: int, history: Tensor, out: Tensor,
                         backend: Any) -> None:
    """The loop of :func:`~transformer_nmt.decode.beam_search.greedy_search` with its whole
    step compiled (:func:`greedy_step`): each step's tokens copied into ``history``
    (B + 1, T) long, each sentence's (tokens before ``eos``, log-probability) into ``out``
    (B + 1, 2) float32 at the read of the flags after it ended (:func:`_run`).

    Args:
        memory: (B, S, D), src_mask: (B, S) from the encoder; max_len: (B,) long.

    Raises:
        NonFiniteScoresError: NaN or infinite logits (at a read of the flags).
    """
    pool, cache = _start(model, memory, src_mask, max_len, 1, host)
    state = GreedyState(pool, cache, history, out)
    _run(greedy_step, backend, model, cache, state, min_len, host, memory.size(0))
