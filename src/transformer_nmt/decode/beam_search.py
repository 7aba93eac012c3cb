"""Batched beam search and greedy decoding over the decoder's incremental cache.

Paper section 6.1: "we used beam search with a beam size of 4 and length penalty
alpha = 0.6 [Wu et al. 2016]. ... We set the maximum output length during inference to
input length + 50, but terminate early when possible."

Shape legend (used in every shape comment below):
    B  sentences in the input batch
    A  sentences in the decoding batch (A <= B; finished ones leave it at the next read)
    W  beam width of the current step: 1 at the first step (all beams would be
       identical), K afterwards
    K  beam size
    C  candidates per sentence and step: min(2K, W*V)
    S  source length (tokens, padding included)
    D  d_model
    V  vocabulary size
    t  target tokens generated so far (bos and eos excluded)

Search, step by step (all of it tensor ops on the search's device; the host reads the
device only every ``sync_every`` steps, see "Host reads" below):
    1. One decoder call on the last token of every live beam, (A*W, 1) -> log-probabilities
       (A*W, V) in fp32 (:func:`next_token_log_probs`, shared with greedy search); ``pad`` and
       ``bos`` are never generated, ``eos`` is barred before ``min_len`` tokens and forced once a
       sentence reaches its maximum length.
    2. The best C = 2K tokens of every beam (per-row top-k over V), then the best C of the
       W*C cumulative scores of each sentence: the same candidates as a top-k over all
       W*V continuations (a sentence's best C continuations are each among their own
       beam's best C) without materialising the (A, W*V) sums
       (:mod:`transformer_nmt.decode.candidates`). At most K of them end in ``eos`` (one
       per beam), so at least K continue.
    3. Candidates ending in ``eos`` that rank among the top K of their sentence become
       finished hypotheses (with K = 1 this is exactly greedy decoding). Each sentence's
       n-best list is a tensor of (score, log-prob, length, beam) entries, best first: the
       newcomers are merged in by a stable sort, so one with the same score as an entry
       already there goes after it. The tokens are not copied: every step writes each new
       beam's (token, parent beam) into a (steps, B, K) back-pointer buffer, and the tokens of
       the returned hypotheses are walked back from it once, at the end.
    4. The best K candidates not ending in ``eos`` form the next beam.
    5. A sentence stops (``stopping="bound"``, the default) once no live hypothesis can beat
       its ``nbest``-th finished one, see
       :func:`~transformer_nmt.decode.search_update.best_possible_score`; or
       (``stopping="beam"``, fairseq's and Hugging Face's rule) once K hypotheses have
       finished. Its scores are set to -inf at once (nothing it computes afterwards can
       enter a result) and its rows are dropped at the next read: ``DecoderCache.reorder``
       re-indexes the
       self-attention K/V on the kept rows (beam reorder and dropping finished sentences
       in one gather) and the cross-attention K/V on the kept sentences, so finished
       sentences cost nothing afterwards. The cross-attention K/V hold one row per
       sentence, shared by its K beams (the encoder memory is never copied K times), so a
       beam reorder leaves them alone.

Host reads. A sentence's finished flag, and whether any row's logits were NaN or infinite,
stay on the device; the host reads them together every ``sync_every`` steps
(:func:`resolve_sync_every`: ``auto`` is 8 on CUDA, 1 elsewhere) and at the last step any
sentence may take, then drops the finished sentences. Between two reads the finished
sentences' rows are decoded with the others, masked; on a GPU that costs little and saves a
device synchronisation per step, on a CPU it is real work, hence 1 there. What the host needs
every step (is some sentence at its length limit, is ``t < min_len``) it knows from the length
limits it read once at the start. A decoding call reads the device ceil(steps /
``sync_every``) + 1 times for the flags, and 5 times besides (the source padding of the
encoder and of the first decoder call, the length limits, the results); the results do not
depend on ``sync_every`` (tests/unit/decode/test_device_search.py checks both, and that they
equal the previous search's, kept in tests/unit/decode/reference_beam_search.py).

Compiled step. With ``compile_step`` (``decode.compile``; ``auto`` = on CUDA) steps 1-5 run as
one compiled function over a :class:`~transformer_nmt.model.cache.StaticDecoderCache` and the
search's state in buffers of bucketed shapes (on CUDA ``reduce-overhead``: a CUDA graph per
bucket), the same update (:func:`~transformer_nmt.decode.search_update.beam_update`) as the
eager search, so the same tokens (:mod:`transformer_nmt.decode.compiled_step`; docs/model.md,
"Compiled decoding step"); greedy search compiles its whole step likewise
(:func:`~transformer_nmt.decode.search_update.greedy_update`).

Scores. A hypothesis Y (|Y| tokens counting its final ``eos``) has log-probability
log P(Y | X) and score log P(Y | X) / lp(|Y|), with the length penalty of
:func:`length_penalty`: ``gnmt`` ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14, used by the
paper) or ``fairseq`` |Y|^alpha (fairseq, Marian, Hugging Face).

Maximum length. For a source of ``src_len`` real tokens (non-pad tokens of
``src_tokens``, i.e. including the ``eos`` the batcher appends), a hypothesis holds at
most ``max_len = int(max_len_a * src_len + max_len_b)`` tokens before its ``eos``;
``eos`` is forced after ``max_len`` tokens. ``max_len`` is clamped to
``[min_len, model.cfg.max_positions - 1]`` so that decoder positions stay in range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, Stopping
from transformer_nmt.decode.cast import without_autograd
from transformer_nmt.decode.compiled_step import (
    resolve_compile,
    static_beam_search,
    static_greedy_search,
)
from transformer_nmt.decode.search_update import (  # noqa: F401 (length_penalty: public here)
    LENPEN_FORMS,
    SearchRule,
    beam_update,
    final_penalties,
    greedy_update,
    length_penalty,
)
from transformer_nmt.decode.sync import (  # noqa: F401 (NonFiniteScoresError: public here)
    BeamOutputs,
    NonFiniteScoresError,
    Reads,
    non_finite_error,
    read_flags,
    resolve_sync_every,
)

STOPPING_RULES = tuple(m.value for m in Stopping)  # ("bound", "beam")


@dataclass
class Hypothesis:
    """One finished translation.

    Attributes:
        tokens: generated token ids, without ``bos`` and ``eos``.
        score: ``log_prob / lp(len(tokens) + 1)`` (the ranking score; natural log).
        log_prob: log P(tokens + eos | source), natural log, summed over tokens.
    """

    tokens: list[int]
    score: float
    log_prob: float


def max_output_lengths(
    model: Any, src_tokens: Tensor, max_len_a: float, max_len_b: int, min_len: int = 1
) -> Tensor:
    """Per-sentence maximum output length (tokens before ``eos``).

    Args:
        model: the Transformer (its ``cfg.max_positions`` caps the length when present).
        src_tokens: (B, S) long, right-padded with PAD_ID.
        max_len_a, max_len_b: max_len = int(max_len_a * src_len + max_len_b), src_len being
            the non-pad tokens of each row (paper: source length + 50).
        min_len: lower clamp.

    Returns:
        (B,) long tensor on ``src_tokens.device``.
    """
    src_len = src_tokens.ne(PAD_ID).sum(1)  # (B,)
    max_len = (src_len.double() * max_len_a + max_len_b).floor().long()  # (B,)
    cap = getattr(getattr(model, "cfg", None), "max_positions", None)
    upper = int(cap) - 1 if cap is not None else None
    return max_len.clamp(min=max(min_len, 1), max=upper)


def _constrained_log_probs(
    model: Any, last: Tensor, memory: Tensor, src_mask: Tensor, cache: Any, t: int,
    min_len: int, max_len: Tensor, limit: bool, check_rows: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The decoder step of :func:`next_token_log_probs` without a host read.

    Args:
        limit: force ``eos`` on the rows of sentences with ``max_len == t`` (False: the
            caller knows that no sentence is at its limit; the result is the same, cheaper).
        check_rows: find the rows with non-finite log-probabilities (False: the caller reads
            them from its top-k; on a CPU such a row is all NaN).

    Returns:
        ``(lprobs, bad)``: (A*W, V) float32 constrained log-probabilities and (A*W,) bool, True
        for a row whose raw log-probabilities are not all finite (None without ``check_rows``).
    """
    logits = model.decode(last, memory, src_mask, cache)[:, -1, :].float()  # (A*W, V)
    # in place where no gradient is tracked (the searches): the same values, no second buffer
    lprobs = torch.log_softmax(logits, dim=-1, out=None if logits.requires_grad else logits)
    # (A*W,) the largest is NaN or infinite
    bad = ~torch.isfinite(lprobs.amax(dim=-1)) if check_rows else None
    lprobs[:, PAD_ID] = -math.inf
    lprobs[:, BOS_ID] = -math.inf
    if t < min_len:
        lprobs[:, EOS_ID] = -math.inf
    if limit:
        rows = max_len.eq(t).repeat_interleave(lprobs.size(0) // max_len.numel())  # (A*W,)
        eos_lp = lprobs[:, EOS_ID].clone()
        lprobs.masked_fill_(rows[:, None], -math.inf)
        lprobs[:, EOS_ID] = torch.where(rows, eos_lp, lprobs[:, EOS_ID])
    return lprobs, bad


def next_token_log_probs(
    model: Any,
    last: Tensor,
    memory: Tensor,
    src_mask: Tensor,
    cache: Any,
    t: int,
    min_len: int,
    max_len: Tensor,
) -> Tensor:
    """One decoder step over the cache: the next token's log-probabilities, constrained.

    The step :func:`beam_search` and :func:`greedy_search` take (so beam 1 equals greedy),
    here with its non-finite check read at once (the searches read it with their finished
    flags). ``pad`` and ``bos`` get -inf; ``eos`` gets -inf before ``min_len`` tokens; a
    sentence at its maximum length (``max_len == t``) may only produce ``eos``.

    Args:
        model: the Transformer (``decode`` with a cache).
        last: (A*W, 1) long, the last token of each live row; W = rows / A rows per sentence.
        memory: (A, S, D) encoder output; src_mask: (A, S) bool, True = real token.
        cache: the :class:`~transformer_nmt.model.cache.DecoderCache` of these rows (grows by 1).
        t: tokens generated so far (bos excluded).
        min_len: ``eos`` is barred while ``t < min_len``.
        max_len: (A,) long, maximum tokens before ``eos`` per sentence.

    Returns:
        (A*W, V) float32 natural-log probabilities.

    Raises:
        NonFiniteScoresError: a row of NaN or infinite logits (its largest log-probability,
            0 or below for any finite row, is then NaN or infinite).
    """
    lprobs, bad = _constrained_log_probs(
        model, last, memory, src_mask, cache, t, min_len, max_len, True)
    if bool(bad.any()):
        raise non_finite_error(t)
    return lprobs


def _check_arguments(src_tokens: Tensor, beam_size: int, nbest: int, lenpen_form: str,
                     stopping: str) -> None:
    """Raise ValueError for a non-2D input or a bad ``beam_size``, ``nbest``, ``lenpen_form``
    or ``stopping`` (:func:`beam_search`'s arguments)."""
    if src_tokens.dim() != 2:
        raise ValueError(f"src_tokens must be (B, S), got shape {tuple(src_tokens.shape)}")
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be >= 1")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be in [1, beam_size={beam_size}]")
    if lenpen_form not in LENPEN_FORMS:
        raise ValueError(f"lenpen_form={lenpen_form!r} is not one of {list(LENPEN_FORMS)}")
    if stopping not in STOPPING_RULES:
        raise ValueError(f"stopping={stopping!r} is not one of {list(STOPPING_RULES)}")


@without_autograd
def beam_search(
    model: Any,
    src_tokens: Tensor,
    *,
    beam_size: int = 4,
    lenpen: float = 0.6,
    lenpen_form: str = "gnmt",
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    min_len: int = 1,
    stopping: str = "bound",
    sync_every: int | str | None = None,
    compile_step: bool | str | None = False,
    compile_backend: Any = None,
) -> list[list[Hypothesis]]:
    """Translate a batch with beam search (paper section 6.1).

    Args:
        model: object with ``encode``, ``decode`` and ``new_cache`` as
            :class:`transformer_nmt.model.transformer.Transformer` (put it in eval mode; autocast,
            if any, is the caller's).
        src_tokens: (B, S) long, ``source + [eos]`` right-padded with PAD_ID, on the model's
            device.
        beam_size: K, live hypotheses kept per sentence.
        lenpen: alpha of the length penalty (0 = rank by raw log-probability).
        lenpen_form: ``gnmt`` ((5 + |Y|) / 6)^alpha or ``fairseq`` |Y|^alpha.
        max_len_a, max_len_b: maximum output length ``max_len_a * src_len + max_len_b``
            tokens (see the module docstring).
        nbest: hypotheses returned per sentence (<= beam_size).
        min_len: ``eos`` is barred before this many tokens (1: no empty outputs).
        stopping: ``bound``: a sentence stops once no live hypothesis can beat its
            ``nbest``-th finished one (exact under the length limit; tensor2tensor's rule);
            ``beam``: once ``beam_size`` hypotheses have finished (fairseq, Hugging Face
            ``early_stopping=True``).
        sync_every: decoding steps between two host reads of the finished flags
            (:func:`resolve_sync_every`; None = auto: 8 on CUDA, 1 elsewhere). The result
            does not depend on it.
        compile_step: run each step (the decoder call and the search's update) as one
            compiled function over a static cache (:func:`resolve_compile`: ``auto`` = on
            CUDA only); False: the eager step over the growing :class:`DecoderCache`. The
            same tokens either way.
        compile_backend: the ``torch.compile`` backend of the step (None: ``reduce-overhead``
            on CUDA, inductor elsewhere).

    Returns:
        For each of the B sentences, its best ``nbest`` hypotheses, best first (fewer only
        when fewer distinct hypotheses exist under the length limits). Every sentence ends
        after at most ``max_len + 1`` steps, whatever the scores.

    Raises:
        ValueError: on bad ``beam_size``/``nbest``/``lenpen_form``/``stopping``/``sync_every``
            or a non-2D input.
        NonFiniteScoresError: NaN or infinite logits.
    """
    _check_arguments(src_tokens, beam_size, nbest, lenpen_form, stopping)
    every = resolve_sync_every(sync_every, src_tokens.device)
    compiled = resolve_compile(compile_step, src_tokens.device)
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    rule = SearchRule(beam_size, lenpen, lenpen_form, stopping == "beam")
    # "beam" keeps the best K finished hypotheses (it stops at K), "bound" the best nbest.
    n_keep = beam_size if rule.count_finished else nbest
    memory, src_mask = model.encode(src_tokens)  # (B, S, D), (B, S)
    max_len = max_output_lengths(model, src_tokens, max_len_a, max_len_b, min_len)  # (B,)
    host = Reads(max_len.tolist(), every)
    out = BeamOutputs(bsz, max(host.max_len) + 1, rule.k, n_keep, src_tokens.device)
    if compiled:
        static_beam_search(model, memory, src_mask, max_len, host, rule, min_len, out,
                           compile_backend)
    else:
        _eager_beam_search(model, memory, src_mask, max_len, host, rule, min_len, out)
    return _hypotheses(out.out_f, out.out_i, out.back_pointers(), nbest)


def _eager_beam_search(model: Any, memory: Tensor, src_mask: Tensor, max_len: Tensor,
                       host: Reads, rule: SearchRule, min_len: int, out: BeamOutputs) -> None:
    """The loop of :func:`beam_search` over the growing cache, into ``out``."""
    bsz, device = memory.size(0), memory.device
    cache = model.new_cache()  # cross-attention K/V: one row per active sentence
    # State of the A active sentences (finished ones stay, masked, until the next read).
    fin_f, fin_i = out.out_f.clone(), out.out_i.clone()  # (A, n, 2) their finished n-best
    active = torch.ones(bsz, dtype=torch.bool, device=device)  # (A,)
    scores = torch.zeros(bsz, 1, device=device)  # (A, W) cumulative log-prob, fp32
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A*W, 1)
    bad_step = torch.full((), -1, dtype=torch.long, device=device)  # first non-finite step
    # (A,) lp of each sentence's longest hypothesis, for the stopping bound: kept, not
    # recomputed at every step
    lp_long = (None if rule.count_finished else
               final_penalties(max_len, rule.lenpen, rule.lenpen_form, scores.dtype))
    first_row: tuple[int, int, Tensor] | None = None  # (A, W, each sentence's first row)
    t = 0
    while True:
        n_act, width = scores.shape
        lprobs, bad = _constrained_log_probs(
            model, last, memory, src_mask, cache, t, min_len, max_len, t in host.limits,
            check_rows=device.type != "cpu")  # (A*W, V)
        u = beam_update(lprobs, bad, scores, fin_f, fin_i, active, bad_step, t, max_len, rule,
                        lp_long)
        fin_f, fin_i, active, bad_step = u.fin_f, u.fin_i, u.active, u.bad_step
        out.record(t, torch.stack([u.tokens, u.beams], 2))
        if first_row is None or first_row[:2] != (n_act, width):  # changes only at a read
            first_row = (n_act, width,
                         (torch.arange(n_act, device=device) * width).unsqueeze(1))  # (A, 1)
        rows = first_row[2] + u.beams  # (A, K) the rows each new beam extends
        new_scores, new_tokens, keep = u.scores, u.tokens, None
        if host.due(t):
            keep = out.read(host, active, bad_step, fin_f, fin_i)
            if keep is not None:
                if not keep.numel():
                    return
                rows, new_scores, new_tokens = rows[keep], new_scores[keep], new_tokens[keep]
                max_len, active = max_len[keep], active[keep]
                fin_f, fin_i = fin_f[keep], fin_i[keep]
                lp_long = lp_long[keep] if lp_long is not None else None
        cache.reorder(rows.reshape(-1), sources=keep)
        last = new_tokens.reshape(-1, 1)  # (A'*K, 1)
        scores = new_scores  # (A', K)
        t += 1


def _hypotheses(out_f: Tensor, out_i: Tensor, hist: Tensor, nbest: int) -> list[list[Hypothesis]]:
    """The finished n-best lists as :class:`Hypothesis` lists: two host reads (the scores; the
    lengths and back-pointers), then each hypothesis walked back to its first token on the
    host (on a GPU, one copy instead of a few kernels per step).

    Args:
        out_f: (B, n, 2) float (score, log-prob), best first; -inf score = no hypothesis.
        out_i: (B, n, 2) long (tokens before eos, beam of that step the eos extends).
        hist: (T, B, K, 2) long back-pointers (token, beam of the step before).

    Returns:
        Per sentence its first ``nbest`` hypotheses; one empty -inf hypothesis when none.
    """
    out_f, out_i = out_f[:, :nbest], out_i[:, :nbest]
    values = out_f.reshape(-1, 2).tolist()
    longs = torch.cat([out_i.reshape(-1), hist.reshape(-1)]).numpy(force=True)
    n_sent, n = out_i.shape[:2]
    ends = longs[: out_i.numel()].reshape(n_sent, n, 2)
    back = longs[out_i.numel():].reshape(hist.shape)  # (T, B, K, 2)
    lengths, beam = ends[..., 0], ends[..., 1].copy()  # (B, n)
    sent = np.arange(n_sent)[:, None]  # (B, 1)
    tokens = np.zeros((n_sent, n, hist.size(0)), dtype=np.int64)
    for s in range(hist.size(0) - 1, -1, -1):  # walk every hypothesis back to its first token
        entry = back[s][sent, beam]  # (B, n, 2)
        tokens[..., s] = entry[..., 0]
        beam = np.where(lengths > s, entry[..., 1], beam)
    results: list[list[Hypothesis]] = []
    for b in range(n_sent):
        hyps = []
        for j in range(n):
            score, log_prob = values[b * n + j]
            if score == -math.inf:
                break
            hyps.append(Hypothesis(tokens=tokens[b, j, : lengths[b, j]].tolist(), score=score,
                                   log_prob=log_prob))
        results.append(hyps or [Hypothesis(tokens=[], score=-math.inf, log_prob=-math.inf)])
    return results


@without_autograd
def greedy_search(
    model: Any,
    src_tokens: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    *,
    min_len: int = 1,
    sync_every: int | str | None = None,
    compile_step: bool | str | None = False,
    compile_backend: Any = None,
) -> list[list[Hypothesis]]:
    """Greedy decoding: the most probable next token at every step.

    Each sentence stops at its first ``eos`` (forced after ``max_len`` tokens, see
    :func:`max_output_lengths`); its row leaves the batch (cache included) at the next read
    of the finished flags, every ``sync_every`` steps, and is masked until then (with
    ``compile_step``: masked until the live sentences fit a smaller row bucket).

    Args:
        model, src_tokens, max_len_a, max_len_b, min_len, sync_every, compile_step,
            compile_backend: as in :func:`beam_search`.

    Returns:
        For each of the B sentences a one-element list; ``score == log_prob`` (no length
        penalty).

    Raises:
        NonFiniteScoresError: NaN or infinite logits.
    """
    if src_tokens.dim() != 2:
        raise ValueError(f"src_tokens must be (B, S), got shape {tuple(src_tokens.shape)}")
    every = resolve_sync_every(sync_every, src_tokens.device)
    compiled = resolve_compile(compile_step, src_tokens.device)
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    device = src_tokens.device
    memory, src_mask = model.encode(src_tokens)  # (B, S, D), (B, S)
    max_len = max_output_lengths(model, src_tokens, max_len_a, max_len_b, min_len)  # (B,)
    host = Reads(max_len.tolist(), every)
    # per sentence, and a spare row B the compiled search's dead rows write into
    history = torch.zeros(bsz + 1, max(host.max_len) + 1, dtype=torch.long, device=device)
    out = torch.zeros(bsz + 1, 2, device=device)  # (tokens before eos, log-prob) at eos
    if compiled:
        static_greedy_search(model, memory, src_mask, max_len, host, min_len, history, out,
                             compile_backend)
    else:
        _eager_greedy(model, memory, src_mask, max_len, host, min_len, history, out)
    rows = torch.cat([out[:bsz, :1].long(), history[:bsz]], 1).tolist()
    lps = out[:bsz, 1].tolist()
    return [[Hypothesis(tokens=row[1 : 1 + row[0]], score=lp_, log_prob=lp_)]
            for row, lp_ in zip(rows, lps)]


def _eager_greedy(model: Any, memory: Tensor, src_mask: Tensor, max_len: Tensor, host: Reads,
                  min_len: int, history: Tensor, out: Tensor) -> None:
    """The loop of :func:`greedy_search` without ``decode.compile``, into ``history`` and
    ``out`` (as :func:`~transformer_nmt.decode.compiled_step.static_greedy_search`); the
    finished sentences leave the batch at each read of the flags."""
    bsz, device = memory.size(0), memory.device
    cache = model.new_cache()  # cross-attention K/V: one row per active sentence
    sent_ids = torch.arange(bsz, device=device)  # (A,)
    log_probs = torch.zeros(bsz, device=device)  # (A,) running sum
    ended = torch.zeros(bsz, 2, device=device)  # (A, 2) (tokens before eos, log-prob) at eos
    active = torch.ones(bsz, dtype=torch.bool, device=device)  # (A,)
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A, 1)
    bad_step = torch.full((), -1, dtype=torch.long, device=device)
    t = 0
    while True:
        lprobs, bad = _constrained_log_probs(
            model, last, memory, src_mask, cache, t, min_len, max_len, t in host.limits
        )  # (A, V)
        best, log_probs, ended, active, bad_step = greedy_update(
            lprobs, bad, log_probs, ended, active, bad_step, t, max_len)
        if sent_ids.numel() == bsz:
            history[:bsz, t] = best
        else:
            history[:, t].index_copy_(0, sent_ids, best)
        if host.due(t):
            kept = read_flags(active, bad_step)
            if len(kept) < sent_ids.numel():
                gone = torch.tensor(sorted(set(range(sent_ids.numel())) - set(kept)),
                                    device=device)
                out.index_copy_(0, sent_ids[gone], ended[gone])
                if not kept:
                    return
                keep = torch.tensor(kept, device=device)  # (A',)
                host.keep(kept)
                sent_ids, max_len, active = sent_ids[keep], max_len[keep], active[keep]
                log_probs, ended, best = log_probs[keep], ended[keep], best[keep]
                cache.reorder(keep, sources=keep)
        last = best.unsqueeze(1)  # (A, 1)
        t += 1
