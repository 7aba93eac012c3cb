"""The previous beam and greedy search, kept verbatim as the test oracle of
:mod:`transformer_nmt.decode.beam_search`.

It reads the device every step (the non-finite and at-limit flags, ``done.any()``, and each
finished hypothesis' tokens, kept in a Python list per sentence); the search in ``src/`` keeps
its n-best lists on the device and must give the same hypotheses, token for token
(tests/unit/decode/test_device_search.py, scripts/micro/check_search_identity.py).

Its own description follows.

Batched beam search and greedy decoding over the decoder's incremental cache.

Paper section 6.1: "we used beam search with a beam size of 4 and length penalty
alpha = 0.6 [Wu et al. 2016]. ... We set the maximum output length during inference to
input length + 50, but terminate early when possible."

Shape legend (used in every shape comment below):
    B  sentences in the input batch
    A  sentences still being decoded (active; A <= B, shrinks as sentences finish)
    W  beam width of the current step: 1 at the first step (all beams would be
       identical), K afterwards
    K  beam size
    C  candidates per sentence and step: min(2K, W*V)
    S  source length (tokens, padding included)
    D  d_model
    V  vocabulary size
    t  target tokens generated so far (bos and eos excluded)

Search, step by step (all per-hypothesis work is tensor ops; Python only touches the
hypotheses that finish and beat what their sentence already has):
    1. One decoder call on the last token of every live beam, (A*W, 1) -> log-probabilities
       (A*W, V) in fp32 (:func:`next_token_log_probs`, shared with greedy search); ``pad`` and
       ``bos`` are never generated, ``eos`` is barred before ``min_len`` tokens and forced once a
       sentence reaches its maximum length.
    2. The best C = 2K tokens of every beam (per-row top-k over V), then the best C of the
       W*C cumulative scores of each sentence: the same candidates as a top-k over all
       W*V continuations (a sentence's best C continuations are each among their own
       beam's best C) without materialising the (A, W*V) sums. At most K of them end in
       ``eos`` (one per beam), so at least K continue.
    3. Candidates ending in ``eos`` that rank among the top K of their sentence become
       finished hypotheses (with K = 1 this is exactly greedy decoding).
    4. The best K candidates not ending in ``eos`` form the next beam.
    5. A sentence stops (``stopping="bound"``, the default) once no live hypothesis can beat
       its ``nbest``-th finished one, see :func:`_best_possible_score`; or
       (``stopping="beam"``, fairseq's and Hugging Face's rule) once K hypotheses have
       finished. Its rows are dropped: ``DecoderCache.reorder`` re-indexes the
       self-attention K/V on the kept rows (beam reorder and dropping finished sentences
       in one gather) and the cross-attention K/V on the kept sentences, so finished
       sentences cost nothing afterwards. The cross-attention K/V hold one row per
       sentence, shared by its K beams (the encoder memory is never copied K times), so a
       beam reorder leaves them alone.

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

    Shared by :func:`beam_search` and :func:`greedy_search` (so beam 1 equals greedy).
    ``pad`` and ``bos`` get -inf; ``eos`` gets -inf before ``min_len`` tokens; a sentence
    at its maximum length (``max_len == t``) may only produce ``eos``.

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
    logits = model.decode(last, memory, src_mask, cache)  # (A*W, 1, V)
    lprobs = torch.log_softmax(logits[:, -1, :].float(), dim=-1)  # (A*W, V)
    at_limit = max_len.eq(t)  # (A,) sentences whose next token must be eos
    # one host read for both flags: a non-finite row, a sentence at its limit
    non_finite, any_at_limit = torch.stack(
        [~torch.isfinite(lprobs.amax(dim=-1)).all(), at_limit.any()]).tolist()
    if non_finite:
        raise NonFiniteScoresError(
            f"the model gave NaN or infinite logits at output position {t + 1} (NaN or inf "
            "parameters, or logits beyond the range of the decoding precision)")
    lprobs[:, PAD_ID] = -math.inf
    lprobs[:, BOS_ID] = -math.inf
    if t < min_len:
        lprobs[:, EOS_ID] = -math.inf
    if any_at_limit:
        rows = at_limit.repeat_interleave(lprobs.size(0) // max_len.numel())  # (A*W,)
        eos_lp = lprobs[rows, EOS_ID]
        lprobs[rows] = -math.inf
        lprobs[rows, EOS_ID] = eos_lp
    return lprobs


class _Finished:
    """The best ``n`` finished hypotheses of one sentence (a short list kept sorted)."""

    __slots__ = ("hyps", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.hyps: list[Hypothesis] = []

    def add(self, hyp: Hypothesis) -> None:
        hyps = self.hyps
        if len(hyps) == self.n and hyp.score <= hyps[-1].score:
            return
        pos = len(hyps)
        while pos > 0 and hyps[pos - 1].score < hyp.score:
            pos -= 1
        hyps.insert(pos, hyp)
        del hyps[self.n :]

    def threshold(self) -> float:
        """Score a new hypothesis must beat to enter: the n-th best, -inf while fewer."""
        return self.hyps[-1].score if len(self.hyps) == self.n else -math.inf


@torch.inference_mode()
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

    Returns:
        For each of the B sentences, its best ``nbest`` hypotheses, best first (fewer only
        when fewer distinct hypotheses exist under the length limits). Every sentence ends
        after at most ``max_len + 1`` steps, whatever the scores.

    Raises:
        ValueError: on bad ``beam_size``/``nbest``/``lenpen_form``/``stopping`` or a non-2D
            input.
        NonFiniteScoresError: NaN or infinite logits.
    """
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
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    device = src_tokens.device
    k = beam_size
    count_finished = stopping == "beam"

    memory, src_mask = model.encode(src_tokens)  # (B, S, D), (B, S)
    cache = model.new_cache()  # cross-attention K/V: one row per active sentence
    max_len = max_output_lengths(model, src_tokens, max_len_a, max_len_b, min_len)  # (B,)
    # "beam" keeps the best K finished hypotheses (it stops at K), "bound" the best nbest.
    finished = [_Finished(k if count_finished else nbest) for _ in range(bsz)]

    # State of the A active sentences, W beams each (W = 1 before the first step).
    sent_ids = torch.arange(bsz, device=device)  # (A,) original sentence index
    sent_list = list(range(bsz))
    scores = torch.zeros(bsz, 1, device=device)  # (A, W) cumulative log-prob, fp32
    history = torch.empty(bsz, 0, dtype=torch.long, device=device)  # (A*W, t)
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A*W, 1)
    thresholds = torch.full((bsz,), -math.inf, device=device)  # (A,) n-th best finished

    t = 0
    while sent_ids.numel() > 0:
        n_act, width = scores.shape
        lprobs = next_token_log_probs(
            model, last, memory, src_mask, cache, t, min_len, max_len
        )  # (A*W, V)
        vocab = lprobs.size(-1)

        per_row = min(2 * k, vocab)
        row_lp, row_tokens = lprobs.topk(per_row, dim=1)  # (A*W, C'), sorted best first
        cand = (scores.view(-1, 1) + row_lp).view(n_act, width * per_row)  # (A, W*C')
        n_cand = min(2 * k, width * per_row)
        cand_scores, cand_pos = cand.topk(n_cand, dim=1)  # (A, C), sorted best first
        cand_beams = cand_pos // per_row  # (A, C) beam within the sentence
        cand_tokens = row_tokens.view(n_act, -1).gather(1, cand_pos)  # (A, C)
        is_eos = cand_tokens.eq(EOS_ID)  # (A, C)

        # --- finished hypotheses: eos among the top K, better than the sentence's n-th best
        lp_now = length_penalty(float(t + 1), lenpen, lenpen_form)
        top_k = min(k, n_cand)
        fin_scores = cand_scores[:, :top_k] / lp_now  # (A, K)
        fin = is_eos[:, :top_k] & torch.isfinite(fin_scores) & (fin_scores > thresholds[:, None])
        fin_pos = fin.nonzero()  # (F, 2) rows (sentence, candidate)
        if fin_pos.numel() > 0:
            a_idx, c_idx = fin_pos[:, 0], fin_pos[:, 1]
            src_rows = a_idx * width + cand_beams[a_idx, c_idx]  # (F,) rows of history
            toks = history.index_select(0, src_rows).tolist()  # F lists of t tokens
            lps = cand_scores[a_idx, c_idx].tolist()
            norm = fin_scores[a_idx, c_idx].tolist()
            touched: dict[int, float] = {}
            for a, tok, lp_, sc in zip(a_idx.tolist(), toks, lps, norm):
                box = finished[sent_list[a]]
                box.add(Hypothesis(tokens=tok, score=sc, log_prob=lp_))
                touched[a] = box.threshold()
            idx = torch.tensor(list(touched), dtype=torch.long, device=device)
            thresholds[idx] = torch.tensor(list(touched.values()), device=device)

        # --- next beam: the best K candidates that do not end in eos
        live_scores = cand_scores.masked_fill(is_eos, -math.inf)  # (A, C)
        if n_cand < k:  # tiny vocabulary at the first step: pad with dead beams
            pad = torch.full((n_act, k - n_cand), -math.inf, device=device)
            live_scores = torch.cat([live_scores, pad], dim=1)  # (A, K')
            cand_beams = torch.cat([cand_beams, cand_beams.new_zeros(n_act, k - n_cand)], 1)
            cand_tokens = torch.cat(
                [cand_tokens, cand_tokens.new_full((n_act, k - n_cand), EOS_ID)], 1
            )
        new_scores, sel = live_scores.topk(k, dim=1)  # (A, K), (A, K)
        new_beams = cand_beams.gather(1, sel)  # (A, K)
        new_tokens = cand_tokens.gather(1, sel)  # (A, K)

        # --- early termination and dropping finished sentences
        if count_finished:  # K finished (the K-th best is finite), or no live beam left
            done = thresholds.gt(-math.inf) | new_scores[:, 0].eq(-math.inf)  # (A,)
        else:  # exact bound; all-dead beams give -inf <= anything
            bound = _best_possible_score(new_scores[:, 0], t + 1, max_len, lenpen, lenpen_form)
            done = bound <= thresholds  # (A,)
        done |= max_len.le(t)  # eos was forced at this step: nothing may go on, whatever the scores
        rows = (torch.arange(n_act, device=device) * width).unsqueeze(1) + new_beams  # (A, K)
        keep = None
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (A',)
            rows, new_scores, new_tokens = rows[keep], new_scores[keep], new_tokens[keep]
            sent_ids, max_len, thresholds = sent_ids[keep], max_len[keep], thresholds[keep]
            sent_list = sent_ids.tolist()
        if sent_ids.numel() == 0:
            break
        flat_rows = rows.reshape(-1)  # (A'*K,)
        cache.reorder(flat_rows, sources=keep)
        history = torch.cat(
            [history.index_select(0, flat_rows), new_tokens.reshape(-1, 1)], dim=1
        )  # (A'*K, t + 1)
        last = new_tokens.reshape(-1, 1)  # (A'*K, 1)
        scores = new_scores  # (A', K)
        t += 1

    return [_result(box, nbest) for box in finished]


def _result(box: _Finished, nbest: int) -> list[Hypothesis]:
    """The sentence's best ``nbest`` hypotheses, best first; an empty one if none finished."""
    if box.hyps:
        return box.hyps[:nbest]
    return [Hypothesis(tokens=[], score=-math.inf, log_prob=-math.inf)]


@torch.inference_mode()
def greedy_search(
    model: Any,
    src_tokens: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    *,
    min_len: int = 1,
) -> list[list[Hypothesis]]:
    """Greedy decoding: the most probable next token at every step.

    Each sentence stops at its first ``eos`` (forced after ``max_len`` tokens, see
    :func:`max_output_lengths`) and its row leaves the batch (cache included).

    Args:
        model, src_tokens, max_len_a, max_len_b, min_len: as in :func:`beam_search`.

    Returns:
        For each of the B sentences a one-element list; ``score == log_prob`` (no length
        penalty).

    Raises:
        NonFiniteScoresError: NaN or infinite logits.
    """
    if src_tokens.dim() != 2:
        raise ValueError(f"src_tokens must be (B, S), got shape {tuple(src_tokens.shape)}")
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    device = src_tokens.device
    memory, src_mask = model.encode(src_tokens)  # (B, S, D), (B, S)
    cache = model.new_cache()
    max_len = max_output_lengths(model, src_tokens, max_len_a, max_len_b, min_len)  # (B,)
    sent_ids = torch.arange(bsz, device=device)  # (A,)
    history = torch.empty(bsz, 0, dtype=torch.long, device=device)  # (A, t)
    log_probs = torch.zeros(bsz, device=device)  # (A,)
    last = torch.full((bsz, 1), BOS_ID, dtype=torch.long, device=device)  # (A, 1)
    out: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    t = 0
    while sent_ids.numel() > 0:
        lprobs = next_token_log_probs(
            model, last, memory, src_mask, cache, t, min_len, max_len
        )  # (A, V)
        best_lp, best = lprobs.max(dim=1)  # (A,), (A,)
        log_probs = log_probs + best_lp
        history = torch.cat([history, best.unsqueeze(1)], dim=1)  # (A, t + 1)
        done = best.eq(EOS_ID) | max_len.le(t)  # (A,) eos, or the maximum length reached
        if bool(done.any()):
            idx = done.nonzero().squeeze(1)
            for a, toks, lp_ in zip(
                sent_ids[idx].tolist(), history[idx, :-1].tolist(), log_probs[idx].tolist()
            ):
                out[a] = [Hypothesis(tokens=toks, score=lp_, log_prob=lp_)]
            keep = (~done).nonzero().squeeze(1)  # (A',)
            if keep.numel() == 0:
                break
            sent_ids, max_len = sent_ids[keep], max_len[keep]
            history, log_probs, best = history[keep], log_probs[keep], best[keep]
            cache.reorder(keep, sources=keep)
        last = best.unsqueeze(1)  # (A, 1)
        t += 1
    return out
