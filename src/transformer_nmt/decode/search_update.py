"""The searches' updates after each decoder call, in tensor ops only: :func:`beam_update` and
:func:`greedy_update`, each shared by the eager search
(:func:`~transformer_nmt.decode.beam_search.beam_search`,
:func:`~transformer_nmt.decode.beam_search.greedy_search`) and the whole step compiled with the
decoder (:mod:`transformer_nmt.decode.compiled_step`).

Paper section 6.1 (beam size 4, length penalty alpha = 0.6 after Wu et al. 2016). The step
number ``t`` is a Python int in the eager search and a 0-d long tensor in the compiled one (a
Python value would be a constant of the traced graph); both give the same numbers: the length
penalty is computed in float64 and rounded to float32 once, as a Python float meeting a float32
tensor is. Shape legend as in :mod:`transformer_nmt.decode.beam_search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from transformer_nmt.config import EOS_ID, LenpenForm
from transformer_nmt.decode.candidates import candidates

LENPEN_FORMS = tuple(m.value for m in LenpenForm)  # ("gnmt", "fairseq")


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


def _lp_at(length: int | Tensor, alpha: float, form: str) -> float | Tensor:
    """lp(``length``) for a Python int (a float) or a 0-d long tensor (a 0-d float32 tensor,
    computed in float64 and rounded once, as the float meets a float32 tensor)."""
    if isinstance(length, int):
        return length_penalty(float(length), alpha, form)
    return length_penalty(length.double(), alpha, form).float()


def final_penalties(max_len: Tensor, alpha: float, form: str,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """(A,) lp(max_len + 1) in ``dtype``: the length penalty of each sentence's longest
    hypothesis, which :func:`best_possible_score` divides by (a constant of the sentence)."""
    return length_penalty((max_len + 1).to(dtype), alpha, form)


def best_possible_score(log_prob: Tensor, t: int | Tensor, max_len: Tensor, alpha: float,
                        form: str, lp_long: Tensor | None = None) -> Tensor:
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
        t: tokens of the live hypotheses (int or 0-d long tensor).
        max_len: (A,) long, maximum tokens before ``eos`` per sentence.
        lp_long: (A,) :func:`final_penalties` of ``max_len``, when the caller keeps them
            (None: computed here).

    Returns:
        (A,) float bound.
    """
    lp_short = _lp_at(t + 1, alpha, form)
    if lp_long is None:
        lp_long = final_penalties(max_len, alpha, form, log_prob.dtype)  # (A,)
    return log_prob / lp_long.clamp(min=lp_short)


def note_non_finite(bad: Tensor, active: Tensor, bad_step: Tensor, t: int | Tensor) -> Tensor:
    """``bad_step`` (a 0-d long, -1 while none) set to ``t`` when an active sentence's rows
    (``bad``: (A*W,) bool) are not finite for the first time."""
    width = bad.numel() // active.numel()
    hit = (bad.view(-1, width).any(1) & active).any()
    return torch.where(hit & bad_step.lt(0), t, bad_step)


def merge_finished(fin_f: Tensor, fin_i: Tensor, cand_scores: Tensor, cand_beams: Tensor,
                   is_eos: Tensor, t: int | Tensor, top_k: int, lp_now: float | Tensor
                   ) -> tuple[Tensor, Tensor]:
    """Each sentence's finished n-best after step ``t``: the candidates among its best
    ``top_k`` that end in ``eos`` (score ``log-prob / lp_now``) merged into ``fin_f`` (A, n, 2)
    (score, log-prob) / ``fin_i`` (A, n, 2) (steps, beam) by a stable sort, so that a newcomer
    with an equal score goes after the hypotheses already there. ``cand_*``, ``is_eos``:
    (A, C) sorted best first. Returns the new (A, n, 2) pair."""
    n_keep = fin_f.size(1)
    beams = cand_beams[:, :top_k]  # (A, K)
    fin_scores = cand_scores[:, :top_k] / lp_now  # (A, K)
    fin = is_eos[:, :top_k] & torch.isfinite(fin_scores)  # (A, K)
    new_f = torch.stack([torch.where(fin, fin_scores, -math.inf), cand_scores[:, :top_k]], 2)
    steps = torch.full_like(beams, t) if isinstance(t, int) else t.expand_as(beams)
    new_i = torch.stack([steps, beams], 2)
    all_f, all_i = torch.cat([fin_f, new_f], 1), torch.cat([fin_i, new_i], 1)  # (A, n+K, 2)
    order = all_f[:, :, 0].sort(dim=1, descending=True, stable=True).indices[:, :n_keep]
    order = order.unsqueeze(2).expand(-1, -1, 2)  # (A, n, 2)
    return all_f.gather(1, order), all_i.gather(1, order)


def next_beams(cand_scores: Tensor, cand_beams: Tensor, cand_tokens: Tensor, is_eos: Tensor,
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


@dataclass(frozen=True)
class SearchRule:
    """The constants of one beam search: beam size K, length penalty alpha and form, and the
    stopping rule (``count_finished``: ``stopping="beam"``, else the exact bound)."""

    k: int
    lenpen: float
    lenpen_form: str
    count_finished: bool


def sentence_done(best_live: Tensor, thresholds: Tensor, t: int | Tensor, max_len: Tensor,
                  rule: SearchRule, lp_long: Tensor | None = None) -> Tensor:
    """(A,) bool: the sentences whose search ends after step ``t``.

    ``rule.count_finished`` (``stopping="beam"``): K hypotheses finished (the K-th best,
    ``thresholds``, is finite) or no live beam left (``best_live`` -inf); else the exact bound:
    no live hypothesis can beat the n-th best finished one (all-dead beams give -inf <=
    anything). A sentence at its maximum length (eos was forced at this step) always ends.
    ``lp_long``: as in :func:`best_possible_score`.
    """
    if rule.count_finished:
        done = thresholds.gt(-math.inf) | best_live.eq(-math.inf)
    else:
        bound = best_possible_score(best_live, t + 1, max_len, rule.lenpen, rule.lenpen_form,
                                    lp_long)
        done = bound <= thresholds
    return done | max_len.le(t)


class BeamUpdate(NamedTuple):
    """What :func:`beam_update` returns: the next beams' scores (A, K) (-inf for the sentences
    that ended), the beam each extends and the token it adds (A, K) long, the finished n-best
    ``fin_f``/``fin_i`` (A, n, 2), the active flags (A,) bool and ``bad_step`` (0-d long)."""

    scores: Tensor
    beams: Tensor
    tokens: Tensor
    fin_f: Tensor
    fin_i: Tensor
    active: Tensor
    bad_step: Tensor


def beam_update(lprobs: Tensor, bad: Tensor | None, scores: Tensor, fin_f: Tensor,
                fin_i: Tensor, active: Tensor, bad_step: Tensor, t: int | Tensor,
                max_len: Tensor, rule: SearchRule, lp_long: Tensor | None = None
                ) -> BeamUpdate:
    """One step of beam search after the decoder call (steps 2-5 of
    :mod:`transformer_nmt.decode.beam_search`'s docstring), with no host read.

    Args:
        lprobs: (A*W, V) float32 constrained log-probabilities of the next token.
        bad: (A*W,) bool, rows whose log-probabilities are not all finite; None: read from the
            candidates (a CPU's log-softmax turns such a row all NaN, and a NaN comes first).
        scores: (A, W) cumulative log-probabilities of the live beams (-inf: dead).
        fin_f, fin_i: (A, n, 2) the finished n-best (score, log-prob) / (steps, beam).
        active: (A,) bool; bad_step: 0-d long, the first step with non-finite scores or -1.
        t: tokens generated before this step (int, or 0-d long tensor).
        max_len: (A,) long, maximum tokens before ``eos`` per sentence.
        rule: the search's constants.
        lp_long: (A,) :func:`final_penalties` of ``max_len`` for the exact stopping bound, when
            the caller keeps them (None: computed at each step).
    """
    k = rule.k
    cand_scores, cand_beams, cand_tokens = candidates(lprobs, scores, k)  # (A, C) each
    if bad is None:
        bad = cand_scores[:, 0].isnan()  # (A,)
    bad_step = note_non_finite(bad, active, bad_step, t)
    is_eos = cand_tokens.eq(EOS_ID)  # (A, C)
    # finished hypotheses: eos among the top K, merged into the sentence's n-best by a stable
    # sort (an equal newcomer goes after the hypotheses already there)
    lp_now = _lp_at(t + 1, rule.lenpen, rule.lenpen_form)
    fin_f, fin_i = merge_finished(fin_f, fin_i, cand_scores, cand_beams, is_eos, t,
                                  min(k, cand_scores.size(1)), lp_now)
    # next beam: the best K candidates that do not end in eos
    new_scores, new_beams, new_tokens = next_beams(cand_scores, cand_beams, cand_tokens,
                                                   is_eos, k)  # (A, K) each
    # early termination: finished sentences are masked now (dropped at the next read)
    active = active & ~sentence_done(new_scores[:, 0], fin_f[:, -1, 0], t, max_len, rule,
                                     lp_long)
    new_scores = torch.where(active.unsqueeze(1), new_scores, -math.inf)
    return BeamUpdate(new_scores, new_beams, new_tokens, fin_f, fin_i, active, bad_step)


class GreedyUpdate(NamedTuple):
    """What :func:`greedy_update` returns: the step's tokens (A,) long, the running
    log-probabilities (A,), ``ended`` (A, 2) (tokens before ``eos``, log-probability) of each
    sentence at its ``eos``, the active flags (A,) bool and ``bad_step`` (0-d long)."""

    tokens: Tensor
    log_probs: Tensor
    ended: Tensor
    active: Tensor
    bad_step: Tensor


def greedy_update(lprobs: Tensor, bad: Tensor, log_probs: Tensor, ended: Tensor,
                  active: Tensor, bad_step: Tensor, t: int | Tensor, max_len: Tensor
                  ) -> GreedyUpdate:
    """One step of greedy search after the decoder call, with no host read: each row's most
    probable token; a sentence ends at its ``eos`` or at ``max_len`` (eos forced there), its
    length and log-probability kept in ``ended`` (rows that ended before keep theirs).

    Args:
        lprobs: (A, V) float32 constrained log-probabilities; bad: (A,) bool non-finite rows.
        log_probs: (A,) running sums; ended: (A, 2); active: (A,) bool; bad_step: 0-d long.
        t: tokens generated before this step (int, or 0-d long tensor).
        max_len: (A,) long, maximum tokens before ``eos`` per sentence.
    """
    bad_step = note_non_finite(bad, active, bad_step, t)
    best_lp, best = lprobs.max(dim=1)  # (A,), (A,)
    log_probs = log_probs + best_lp
    now = (best.eq(EOS_ID) | max_len.le(t)) & active  # (A,)
    length = (log_probs.new_full(log_probs.shape, float(t)) if isinstance(t, int)
              else t.to(log_probs.dtype).expand_as(log_probs))  # (A,)
    ended = torch.where(now.unsqueeze(1), torch.stack([length, log_probs], 1), ended)
    return GreedyUpdate(best, log_probs, ended, active & ~now, bad_step)
