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
       its ``nbest``-th finished one, see :func:`_best_possible_score`; or
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

Compiled step. With ``compile_step`` (``decode.compile``; ``auto`` = on CUDA) step 1 runs over
a :class:`~transformer_nmt.model.cache.StaticDecoderCache` of bucketed shapes, compiled by
``torch.compile`` (on CUDA ``reduce-overhead``: a CUDA graph per bucket), the constraints as
tensor ops (:mod:`transformer_nmt.decode.compiled_step`); the rest of the search is the
same, and so are the tokens (docs/model.md, "Compiled decoding step").

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

import torch
from torch import Tensor

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, LenpenForm, Stopping
from transformer_nmt.decode.candidates import candidates
from transformer_nmt.decode.cast import without_autograd
from transformer_nmt.decode.compiled_step import StaticStep, resolve_compile
from transformer_nmt.decode.sync import Reads, resolve_sync_every


class NonFiniteScoresError(ValueError):
    """The model gave NaN or infinite logits (NaN weights, or fp16 logits that overflow)."""


LENPEN_FORMS = tuple(m.value for m in LenpenForm)  # ("gnmt", "fairseq")
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


def length_penalty(length: float | Tensor, alpha: float, form: str = "gnmt"):
    """Length penalty lp(|Y|) that divides a hypothesis' log-probability.

    Args:
        length: |Y|, output tokens counting the final ``eos`` (int, float or tensor).
        alpha: exponent; 0 disables the penalty (lp = 1).
        form: ``gnmt``: ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14; the paper's, section
            6.1); ``fairseq``: |Y|^alpha.

    Returns:
        lp(|Y|), same type as ``length`` (float for Python numbers).

    Raises:
        ValueError: for an unknown ``form``.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return (length * 1.0) ** alpha
    raise ValueError(f"lenpen_form={form!r} is not one of {list(LENPEN_FORMS)}")


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


def _best_possible_score(
    log_prob: Tensor, t: int, max_len: Tensor, alpha: float, form: str
) -> Tensor:
    """Upper bound on the final score of any descendant of a live hypothesis.

    A live hypothesis with ``t`` tokens and log-probability ``s <= 0`` ends, at the
    earliest, with |Y| = t + 1 (just ``eos``) and, at the latest, with
    |Y| = max_len + 1. Its final log-probability is at most ``s`` (log-probabilities only
    fall), and with ``s <= 0`` the quotient ``s / lp`` is largest for the largest lp. lp is
    monotone in |Y| (increasing for alpha > 0, decreasing for alpha < 0), so the largest
    lp is at one end of the range: the bound is ``s / max(lp(t + 1), lp(max_len + 1))``.
    This is exact (never cuts a hypothesis that could still win); with alpha = 0 it is
    ``s`` itself.

    Args:
        log_prob: (A,) best live log-probability per sentence (-inf when none is live).
        t: tokens of the live hypotheses.
        max_len: (A,) long, maximum tokens before ``eos`` per sentence.

    Returns:
        (A,) float bound.
    """
    lp_short = length_penalty(float(t + 1), alpha, form)
    lp_long = length_penalty((max_len + 1).to(log_prob.dtype), alpha, form)  # (A,)
    return log_prob / lp_long.clamp(min=lp_short)


def _non_finite_error(t: int) -> NonFiniteScoresError:
    return NonFiniteScoresError(
        f"the model gave NaN or infinite logits at output position {t + 1} (NaN or inf "
        "parameters, or logits beyond the range of the decoding precision)")


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
        raise _non_finite_error(t)
    return lprobs


def _read_flags(active: Tensor, bad_step: Tensor) -> list[int]:
    """The one host read between steps: the active flags (A,) and the first step with
    non-finite scores; raises :class:`NonFiniteScoresError` when there is one. Returns the
    indices of the active rows."""
    flags = torch.cat([active.long(), bad_step.view(1)]).tolist()
    if flags[-1] >= 0:
        raise _non_finite_error(flags[-1])
    return [i for i, a in enumerate(flags[:-1]) if a]


def _note_non_finite(bad: Tensor, active: Tensor, bad_step: Tensor, t: int) -> Tensor:
    """``bad_step`` (a 0-d long, -1 while none) set to ``t`` when an active row's scores are
    not finite for the first time."""
    width = bad.numel() // active.numel()
    hit = (bad.view(-1, width).any(1) & active).any()
    return torch.where(hit & bad_step.lt(0), t, bad_step)


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


def _merge_finished(fin_f: Tensor, fin_i: Tensor, cand_scores: Tensor, cand_beams: Tensor,
                    is_eos: Tensor, t: int, top_k: int, lp_now: float) -> tuple[Tensor, Tensor]:
    """Each sentence's finished n-best after step ``t``: the candidates among its best
    ``top_k`` that end in ``eos`` (score ``log-prob / lp_now``) merged into ``fin_f`` (A, n, 2)
    (score, log-prob) / ``fin_i`` (A, n, 2) (steps, beam) by a stable sort, so that a newcomer
    with an equal score goes after the hypotheses already there. ``cand_*``, ``is_eos``:
    (A, C) sorted best first. Returns the new (A, n, 2) pair."""
    n_keep = fin_f.size(1)
    fin_scores = cand_scores[:, :top_k] / lp_now  # (A, K)
    fin = is_eos[:, :top_k] & torch.isfinite(fin_scores)  # (A, K)
    new_f = torch.stack([fin_scores.masked_fill(~fin, -math.inf), cand_scores[:, :top_k]], 2)
    new_i = torch.stack([torch.full_like(cand_beams[:, :top_k], t), cand_beams[:, :top_k]], 2)
    all_f, all_i = torch.cat([fin_f, new_f], 1), torch.cat([fin_i, new_i], 1)  # (A, n+K, 2)
    order = all_f[:, :, 0].sort(dim=1, descending=True, stable=True).indices[:, :n_keep]
    order = order.unsqueeze(2).expand(-1, -1, 2)  # (A, n, 2)
    return all_f.gather(1, order), all_i.gather(1, order)


def _next_beams(cand_scores: Tensor, cand_beams: Tensor, cand_tokens: Tensor, is_eos: Tensor,
                k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The next beam of each sentence: its best ``k`` candidates that do not end in ``eos``
    (``cand_*``, ``is_eos``: (A, C) sorted best first; fewer than ``k`` candidates, a tiny
    vocabulary at the first step, are padded with dead beams). Returns (A, K) scores, beams
    extended and tokens."""
    n_act, n_cand = cand_scores.shape
    live_scores = cand_scores.masked_fill(is_eos, -math.inf)  # (A, C)
    if n_cand < k:
        pad = torch.full((n_act, k - n_cand), -math.inf, device=cand_scores.device)
        live_scores = torch.cat([live_scores, pad], dim=1)  # (A, K')
        cand_beams = torch.cat([cand_beams, cand_beams.new_zeros(n_act, k - n_cand)], 1)
        cand_tokens = torch.cat([cand_tokens, cand_tokens.new_full((n_act, k - n_cand), EOS_ID)],
                                1)
    new_scores, sel = live_scores.topk(k, dim=1)  # (A, K), (A, K)
    return new_scores, cand_beams.gather(1, sel), cand_tokens.gather(1, sel)


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
        compile_step: run the decoder step compiled over a static cache
            (:func:`resolve_compile`: ``auto`` = on CUDA only); False: the eager step over
            the growing :class:`DecoderCache`. The same tokens either way.
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
    device = src_tokens.device
    k = beam_size
    count_finished = stopping == "beam"
    # "beam" keeps the best K finished hypotheses (it stops at K), "bound" the best nbest.
    n_keep = k if count_finished else nbest

    memory, src_mask = model.encode(src_tokens)  # (B, S, D), (B, S)
    max_len = max_output_lengths(model, src_tokens, max_len_a, max_len_b, min_len)  # (B,)
    host = Reads(max_len.tolist(), every)
    steps = max(host.max_len) + 1
    static = (StaticStep(model, memory, src_mask, k, steps, compile_backend)
              if compiled else None)
    # cross-attention K/V: one row per active sentence
    cache = model.new_cache() if static is None else static.cache

    # Back-pointers of every step: hist[t, b, j] = (token, beam of step t it extends) of beam
    # j of sentence b after step t; the tokens of any hypothesis are read back at the end.
    hist = torch.zeros(steps, bsz, k, 2, dtype=torch.long, device=device)
    # Finished n-best of every sentence, best first (ties: the earlier first): (score,
    # log-prob) and (steps taken = tokens before eos, beam it extends); -inf score = empty.
    out_f = torch.full((bsz, n_keep, 2), -math.inf, device=device)
    out_i = torch.zeros(bsz, n_keep, 2, dtype=torch.long, device=device)

    # State of the A active sentences (finished ones stay, masked, until the next read).
    sent_ids = torch.arange(bsz, device=device)  # (A,) original sentence index
    fin_f, fin_i = out_f.clone(), out_i.clone()  # (A, n, 2) their finished n-best
    active = torch.ones(bsz, dtype=torch.bool, device=device)  # (A,)
    scores = torch.zeros(bsz, 1, device=device)  # (A, W) cumulative log-prob, fp32
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A*W, 1)
    bad_step = torch.full((), -1, dtype=torch.long, device=device)  # first non-finite step

    t = 0
    while True:
        n_act, width = scores.shape
        if static is None:
            lprobs, bad = _constrained_log_probs(
                model, last, memory, src_mask, cache, t, min_len, max_len, t in host.limits,
                check_rows=device.type != "cpu")  # (A*W, V)
        else:
            lprobs, bad = static(last, t, min_len, max_len)
        cand_scores, cand_beams, cand_tokens = candidates(lprobs, scores, k)  # (A, C) each
        if bad is None:  # a CPU's log_softmax turns a non-finite row all NaN: one comes first
            bad = cand_scores[:, 0].isnan()  # (A,)
        bad_step = _note_non_finite(bad, active, bad_step, t)
        n_cand = cand_scores.size(1)
        is_eos = cand_tokens.eq(EOS_ID)  # (A, C)

        # --- finished hypotheses: eos among the top K, merged into the sentence's n-best by a
        # stable sort (an equal newcomer goes after the hypotheses already there)
        lp_now = length_penalty(float(t + 1), lenpen, lenpen_form)
        fin_f, fin_i = _merge_finished(fin_f, fin_i, cand_scores, cand_beams, is_eos, t,
                                       min(k, n_cand), lp_now)
        thresholds = fin_f[:, -1, 0]  # (A,) n-th best finished, -inf while fewer

        # --- next beam: the best K candidates that do not end in eos
        new_scores, new_beams, new_tokens = _next_beams(cand_scores, cand_beams, cand_tokens,
                                                        is_eos, k)  # (A, K) each
        step_hist = torch.stack([new_tokens, new_beams], 2)  # (A, K, 2)
        if n_act == bsz:
            hist[t].copy_(step_hist)
        else:
            hist[t].index_copy_(0, sent_ids, step_hist)

        # --- early termination: finished sentences are masked now, dropped at the next read
        active = active & ~_sentence_done(new_scores[:, 0], thresholds, t, max_len,
                                          count_finished, lenpen, lenpen_form)
        new_scores = new_scores.masked_fill(~active.unsqueeze(1), -math.inf)
        rows = (torch.arange(n_act, device=device) * width).unsqueeze(1) + new_beams  # (A, K)
        keep = None
        if host.due(t):
            kept = _read_flags(active, bad_step)
            if len(kept) < n_act:
                gone = torch.tensor(sorted(set(range(n_act)) - set(kept)), device=device)
                out_f.index_copy_(0, sent_ids[gone], fin_f[gone])
                out_i.index_copy_(0, sent_ids[gone], fin_i[gone])
                if not kept:
                    break
                keep = torch.tensor(kept, device=device)  # (A',)
                host.keep(kept)
                rows, new_scores, new_tokens = rows[keep], new_scores[keep], new_tokens[keep]
                sent_ids, max_len, active = sent_ids[keep], max_len[keep], active[keep]
                fin_f, fin_i = fin_f[keep], fin_i[keep]
        cache.reorder(rows.reshape(-1), sources=keep)
        last = new_tokens.reshape(-1, 1)  # (A'*K, 1)
        scores = new_scores  # (A', K)
        t += 1

    return _hypotheses(out_f, out_i, hist[: t + 1], nbest)


def _sentence_done(best_live: Tensor, thresholds: Tensor, t: int, max_len: Tensor,
                   count_finished: bool, lenpen: float, lenpen_form: str) -> Tensor:
    """(A,) bool: the sentences whose search ends after step ``t``.

    ``count_finished`` (``stopping="beam"``): K hypotheses finished (the K-th best,
    ``thresholds``, is finite) or no live beam left (``best_live`` -inf); else the exact bound:
    no live hypothesis can beat the n-th best finished one (all-dead beams give -inf <=
    anything). A sentence at its maximum length (eos was forced at this step) always ends.
    """
    if count_finished:
        done = thresholds.gt(-math.inf) | best_live.eq(-math.inf)
    else:
        bound = _best_possible_score(best_live, t + 1, max_len, lenpen, lenpen_form)
        done = bound <= thresholds
    return done | max_len.le(t)


def _hypotheses(out_f: Tensor, out_i: Tensor, hist: Tensor, nbest: int) -> list[list[Hypothesis]]:
    """The finished n-best lists as :class:`Hypothesis` lists (two host reads).

    Args:
        out_f: (B, n, 2) float (score, log-prob), best first; -inf score = no hypothesis.
        out_i: (B, n, 2) long (tokens before eos, beam of that step the eos extends).
        hist: (T, B, K, 2) long back-pointers (token, beam of the step before).

    Returns:
        Per sentence its first ``nbest`` hypotheses; one empty -inf hypothesis when none.
    """
    out_f, out_i = out_f[:, :nbest], out_i[:, :nbest]
    lengths, beam = out_i[..., 0], out_i[..., 1].clone()  # (B, n)
    n_steps = hist.size(0)
    sent = torch.arange(out_i.size(0), device=out_i.device).unsqueeze(1)  # (B, 1)
    tokens = torch.zeros(*lengths.shape, n_steps, dtype=torch.long, device=out_i.device)
    for s in range(n_steps - 1, -1, -1):  # walk every hypothesis back to its first token
        entry = hist[s][sent, beam]  # (B, n, 2)
        tokens[..., s] = entry[..., 0]
        beam = torch.where(lengths.gt(s), entry[..., 1], beam)
    flat = torch.cat([lengths.reshape(-1, 1), tokens.reshape(lengths.numel(), -1)], 1).tolist()
    values = out_f.reshape(-1, 2).tolist()
    results: list[list[Hypothesis]] = []
    n = lengths.size(1)
    for b in range(lengths.size(0)):
        hyps = []
        for j in range(b * n, b * n + n):
            score, log_prob = values[j]
            if score == -math.inf:
                break
            hyps.append(Hypothesis(tokens=flat[j][1 : 1 + flat[j][0]], score=score,
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
    of the finished flags, every ``sync_every`` steps, and is masked until then.

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
    steps = max(host.max_len) + 1
    static = (StaticStep(model, memory, src_mask, 1, steps, compile_backend)
              if compiled else None)
    cache = model.new_cache() if static is None else static.cache
    history = torch.zeros(bsz, steps, dtype=torch.long, device=device)  # (B, T) per sentence
    sent_ids = torch.arange(bsz, device=device)  # (A,)
    log_probs = torch.zeros(bsz, device=device)  # (A,) running sum
    ended = torch.zeros(bsz, 2, device=device)  # (A, 2) (tokens before eos, log-prob) at eos
    out = torch.zeros(bsz, 2, device=device)  # (B, 2) the same per original sentence
    active = torch.ones(bsz, dtype=torch.bool, device=device)  # (A,)
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A, 1)
    bad_step = torch.full((), -1, dtype=torch.long, device=device)
    t = 0
    while True:
        if static is None:
            lprobs, bad = _constrained_log_probs(
                model, last, memory, src_mask, cache, t, min_len, max_len, t in host.limits
            )  # (A, V)
        else:
            lprobs, bad = static(last, t, min_len, max_len)
        bad_step = _note_non_finite(bad, active, bad_step, t)
        best_lp, best = lprobs.max(dim=1)  # (A,), (A,)
        log_probs = log_probs + best_lp
        if sent_ids.numel() == bsz:
            history[:, t] = best
        else:
            history[:, t].index_copy_(0, sent_ids, best)
        now = (best.eq(EOS_ID) | max_len.le(t)) & active  # (A,) eos, or the maximum length
        ended = torch.where(now.unsqueeze(1), torch.stack([log_probs.new_full(
            log_probs.shape, float(t)), log_probs], 1), ended)
        active = active & ~now
        keep = None
        if host.due(t):
            kept = _read_flags(active, bad_step)
            if len(kept) < sent_ids.numel():
                gone = torch.tensor(sorted(set(range(sent_ids.numel())) - set(kept)),
                                    device=device)
                out.index_copy_(0, sent_ids[gone], ended[gone])
                if not kept:
                    break
                keep = torch.tensor(kept, device=device)  # (A',)
                host.keep(kept)
                sent_ids, max_len, active = sent_ids[keep], max_len[keep], active[keep]
                log_probs, ended, best = log_probs[keep], ended[keep], best[keep]
                cache.reorder(keep, sources=keep)
        last = best.unsqueeze(1)  # (A, 1)
        t += 1
    rows = torch.cat([out[:, :1].long(), history], 1).tolist()
    lps = out[:, 1].tolist()
    return [[Hypothesis(tokens=row[1 : 1 + row[0]], score=lp_, log_prob=lp_)]
            for row, lp_ in zip(rows, lps)]
