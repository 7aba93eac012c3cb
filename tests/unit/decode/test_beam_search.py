"""Beam search and greedy decoding on tiny random Transformers (paper section 6.1)."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.decode.beam_search import (
    NonFiniteScoresError,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_lengths,
    next_token_log_probs,
)
from transformer_nmt.model.cache import DecoderCache
from transformer_nmt.model.transformer import Transformer

VOCAB = 8
# Tokens a hypothesis may contain (pad and bos are never generated; eos only ends it).
CONTENT = [i for i in range(VOCAB) if i not in (PAD_ID, BOS_ID, EOS_ID)]


def tiny_model(seed: int = 0, vocab: int = VOCAB, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        name="test", encoder_layers=2, decoder_layers=2, d_model=16, d_ff=32, heads=2,
        dropout=0.0, max_positions=64,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return Transformer(cfg, vocab_size=vocab).eval()


class NoEarlyEos(torch.nn.Module):
    """Wraps a model and lowers the eos logit, so hypotheses run to the length limit."""

    def __init__(self, model: Transformer, shift: float = 30.0):
        super().__init__()
        self.model, self.shift, self.cfg = model, shift, model.cfg

    def encode(self, src_tokens):
        return self.model.encode(src_tokens)

    def new_cache(self):
        return self.model.new_cache()

    def decode(self, tgt_tokens, memory, src_mask, cache=None):
        logits = self.model.decode(tgt_tokens, memory, src_mask, cache).clone()
        logits[..., EOS_ID] -= self.shift
        return logits


class RecordingCache(DecoderCache):
    """A cache that records (target rows, source rows) after every ``reorder``."""

    seen: ClassVar[list[tuple[int, int]]] = []

    def reorder(self, indices, sources=None):
        super().reorder(indices, sources)
        RecordingCache.seen.append((indices.numel(), self.sources))


class WithRecordingCache(NoEarlyEos):
    def __init__(self, model):
        super().__init__(model, shift=0.0)

    def new_cache(self):
        return RecordingCache(len(self.model.decoder_layers))


def random_sources(lengths: list[int], seed: int = 1) -> torch.Tensor:
    """(B, S) source + eos rows, right-padded, with the given real lengths (eos included)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        idx = torch.randint(0, len(CONTENT), (n - 1,), generator=g)
        out[i, : n - 1] = torch.tensor(CONTENT)[idx]
        out[i, n - 1] = EOS_ID
    return out


def sequence_log_probs(model, src: torch.Tensor, seqs: list[list[int]]) -> list[float]:
    """log P(seq + eos | src) by teacher forcing (no cache), with pad/bos never allowed and
    eos barred at the first position, as the search does (min_len=1)."""
    n = len(seqs)
    width = max(len(s) for s in seqs) + 1
    tgt_in = torch.full((n, width), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((n, width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        tgt_in[i, : len(s) + 1] = torch.tensor([BOS_ID] + s)
        tgt_out[i, : len(s) + 1] = torch.tensor(s + [EOS_ID])
    with torch.no_grad():
        memory, src_mask = model.encode(src.expand(n, -1))
        logits = model.decode(tgt_in, memory, src_mask)  # (n, T, V)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(2, tgt_out.unsqueeze(2)).squeeze(2)
    mask = tgt_out.ne(PAD_ID)
    return (lp * mask).sum(1).tolist()


def test_length_penalty_formulas():
    for length, alpha in [(1, 0.6), (10, 0.6), (37, 1.0), (5, 0.0), (3, 2.0)]:
        assert length_penalty(length, alpha, "gnmt") == pytest.approx(((5 + length) / 6) ** alpha)
        assert length_penalty(length, alpha, "fairseq") == pytest.approx(length**alpha)
    assert length_penalty(1, 0.6, "gnmt") == pytest.approx(1.0)  # (5+1)/6 = 1
    lengths = torch.tensor([1.0, 4.0, 9.0])
    torch.testing.assert_close(length_penalty(lengths, 0.6, "gnmt"), ((5 + lengths) / 6) ** 0.6)
    torch.testing.assert_close(length_penalty(lengths, 0.6, "fairseq"), lengths**0.6)
    with pytest.raises(ValueError, match="lenpen_form"):
        length_penalty(3, 0.6, "marian")


def test_beam_one_equals_greedy():
    model = tiny_model(seed=3)
    src = random_sources([6, 3, 9, 5, 2, 7])
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=4)
    beam = beam_search(model, src, beam_size=1, lenpen=0.0, max_len_a=1.0, max_len_b=4)
    for g, b in zip(greedy, beam):
        assert g[0].tokens == b[0].tokens
        assert g[0].log_prob == pytest.approx(b[0].log_prob, abs=1e-5)


@pytest.mark.parametrize(
    "lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq"), (0.0, "gnmt"), (2.0, "gnmt")]
)
def test_large_beam_equals_exhaustive_search(lenpen, form):
    """Every sequence of 1..max_len content tokens + eos, scored by teacher forcing."""
    model = tiny_model(seed=7)
    src = random_sources([4])
    max_len = 3  # max_len_a = 0, max_len_b = 3
    seqs = [list(s) for n in range(1, max_len + 1) for s in itertools.product(CONTENT, repeat=n)]
    log_probs = sequence_log_probs(model, src, seqs)
    scored = sorted(
        ((lp / length_penalty(len(s) + 1, lenpen, form), lp, s) for s, lp in zip(seqs, log_probs)),
        key=lambda x: -x[0],
    )
    nbest = 5
    # K = 150 holds every expansion at every step (at most 25 prefixes x 6 tokens).
    hyps = beam_search(
        model, src, beam_size=150, lenpen=lenpen, lenpen_form=form,
        max_len_a=0.0, max_len_b=max_len, nbest=nbest,
    )[0]
    assert len(hyps) == nbest
    for hyp, (score, lp, seq) in zip(hyps, scored[:nbest]):
        assert hyp.tokens == seq
        assert hyp.score == pytest.approx(score, abs=1e-5)
        assert hyp.log_prob == pytest.approx(lp, abs=1e-5)


@torch.no_grad()
def reference_beam_stopping_at_k(model, src_row, k, lenpen, form, max_len):
    """Textbook beam search for one sentence with fairseq's rule (stop once K hypotheses
    have finished): no cache (every prefix re-decoded in full), every continuation scored."""
    memory, src_mask = model.encode(src_row)
    beams, finished = [([], 0.0)], []
    for t in range(max_len + 1):
        cands = []
        for toks, score in beams:
            tgt = torch.tensor([[BOS_ID] + toks])
            lp = torch.log_softmax(model.decode(tgt, memory, src_mask)[0, -1].float(), -1)
            lp[PAD_ID] = lp[BOS_ID] = -math.inf
            if t == 0:
                lp[EOS_ID] = -math.inf
            if t == max_len:
                lp[[i for i in range(lp.numel()) if i != EOS_ID]] = -math.inf
            cands += [(score + float(lp[v]), toks, v) for v in range(lp.numel())]
        cands.sort(key=lambda c: -c[0])
        beams = []
        for rank, (score, toks, v) in enumerate(cands[: 2 * k]):
            if v == EOS_ID:
                if rank < k and math.isfinite(score):
                    finished.append((score / length_penalty(t + 1, lenpen, form), score, toks))
            elif len(beams) < k:
                beams.append((toks + [v], score))
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        if len(finished) == k:
            break
    return finished


@pytest.mark.parametrize("lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq")])
def test_stopping_at_k_finished_equals_reference(lenpen, form):
    """``stopping="beam"`` (batched, cached, per-row top-k) equals the textbook search."""
    model = NoEarlyEos(tiny_model(seed=12, vocab=24), shift=-2.5)  # eos likelier: stops early
    lengths = [6, 2, 9, 4, 7]
    src = random_sources(lengths, seed=8)
    got = beam_search(model, src, beam_size=3, lenpen=lenpen, lenpen_form=form, max_len_a=1.0,
                      max_len_b=3, nbest=3, stopping="beam")
    for i, n in enumerate(lengths):
        ref = reference_beam_stopping_at_k(model, src[i : i + 1, :n], 3, lenpen, form, n + 3)
        assert [h.tokens for h in got[i]] == [toks for _, _, toks in ref]
        assert [h.score for h in got[i]] == pytest.approx([sc for sc, _, _ in ref], abs=1e-5)
        assert [h.log_prob for h in got[i]] == pytest.approx([lp for _, lp, _ in ref], abs=1e-5)
    # most searches ended before the length limit, i.e. on the K-finished rule
    assert sum(max(len(h.tokens) for h in hyps) < n + 3 for hyps, n in zip(got, lengths)) >= 3
    with pytest.raises(ValueError, match="stopping"):
        beam_search(model, src, stopping="never")


def test_small_beam_scores_match_teacher_forcing():
    """The cache, beam reorder and batch shrinking keep every hypothesis' score exact."""
    model = tiny_model(seed=11, vocab=40)
    src = random_sources([7, 3, 12, 5], seed=4)
    results = beam_search(model, src, beam_size=4, lenpen=0.6, max_len_a=1.0, max_len_b=5, nbest=4)
    for i, hyps in enumerate(results):
        row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        tf = sequence_log_probs(model, row, [h.tokens for h in hyps])
        for h, lp in zip(hyps, tf):
            assert h.log_prob == pytest.approx(lp, abs=1e-4)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_equals_one_at_a_time(beam_size):
    model = tiny_model(seed=5, vocab=30)
    lengths = [9, 2, 6, 13, 4, 7]
    src = random_sources(lengths, seed=2)
    kwargs = {"beam_size": beam_size, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 3,
              "nbest": beam_size}
    batched = beam_search(model, src, **kwargs)
    for i, n in enumerate(lengths):
        single = beam_search(model, src[i : i + 1, :n], **kwargs)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[i]]
        for a, b in zip(single, batched[i]):
            assert a.score == pytest.approx(b.score, abs=1e-4)
    greedy_batched = greedy_search(model, src, 1.0, 3)
    for i, n in enumerate(lengths):
        assert greedy_search(model, src[i : i + 1, :n], 1.0, 3)[0][0].tokens == (
            greedy_batched[i][0].tokens
        )


def test_beams_share_one_cross_attention_row_per_sentence():
    """The cross-attention K/V keep one row per active sentence (never K copies), through
    beam reorders and sentences leaving the batch; results as with the plain model."""
    model = tiny_model(seed=6, vocab=30)
    src = random_sources([9, 2, 6, 13, 4, 7], seed=3)
    kwargs = {"beam_size": 3, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 4, "nbest": 3}
    RecordingCache.seen = []
    recorded = beam_search(WithRecordingCache(model), src, **kwargs)
    seen = RecordingCache.seen
    assert seen[0] == (18, 6)  # first step: each sentence's row becomes 3 beams, K/V stay 6 rows
    assert all(rows == 3 * sources for rows, sources in seen), seen
    assert 0 < seen[-1][1] < 6  # finished sentences left the batch
    plain = beam_search(model, src, **kwargs)
    for a, b in zip(plain, recorded):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)


def test_max_length_respected():
    model = NoEarlyEos(tiny_model(seed=2, vocab=20))
    lengths = [3, 8, 5, 11]
    src = random_sources(lengths, seed=9)
    a, b = 0.5, 2
    limits = max_output_lengths(model, src, a, b).tolist()
    assert limits == [int(a * n + b) for n in lengths]
    for hyps, limit in zip(beam_search(model, src, beam_size=3, max_len_a=a, max_len_b=b), limits):
        # eos is pushed down by 30 nats, so every hypothesis runs to the limit, no further.
        assert len(hyps[0].tokens) == limit
    for hyps, limit in zip(greedy_search(model, src, a, b), limits):
        assert len(hyps[0].tokens) == limit
    # The decoder's positional table caps the length.
    assert max_output_lengths(model, src, 100.0, 0).max().item() == 63


def test_nbest_sorted_and_scores_normalised():
    model = tiny_model(seed=8, vocab=25)
    src = random_sources([5, 9, 3], seed=6)
    for form in ("gnmt", "fairseq"):
        results = beam_search(
            model, src, beam_size=5, lenpen=0.8, lenpen_form=form, max_len_b=6, nbest=5
        )
        for hyps in results:
            assert len(hyps) == 5
            scores = [h.score for h in hyps]
            assert scores == sorted(scores, reverse=True)
            assert len({tuple(h.tokens) for h in hyps}) == 5
            for h in hyps:
                assert h.score == pytest.approx(
                    h.log_prob / length_penalty(len(h.tokens) + 1, 0.8, form), rel=1e-6
                )
                assert all(tok not in (PAD_ID, BOS_ID, EOS_ID) for tok in h.tokens)


def test_bad_arguments():
    model = tiny_model()
    src = random_sources([3])
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, src, beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="lenpen_form"):
        beam_search(model, src, lenpen_form="marian")
    assert beam_search(model, src[:0]) == []
    assert math.isfinite(beam_search(model, src)[0][0].score)


def test_next_token_step_constraints_and_grouped_rows():
    """The shared step: log-probs of a full decoder pass, pad/bos barred, eos at min/max length."""
    model = tiny_model(seed=5)
    src = torch.tensor([[4, 5, 6, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID]])
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        width = 3  # three rows per sentence share its cross-attention K/V
        last = torch.full((2 * width, 1), BOS_ID, dtype=torch.long)
        lp = next_token_log_probs(
            model, last, memory, src_mask, model.new_cache(), 0, 0, torch.tensor([5, 0])
        )  # min_len 0; sentence 1 is at its limit
        lp_min = next_token_log_probs(
            model, last, memory, src_mask, model.new_cache(), 0, 1, torch.tensor([5, 5])
        )
        ref = torch.log_softmax(model.decode(last[::width], memory, src_mask)[:, -1].float(), -1)
    assert lp.shape == (2 * width, VOCAB) and lp.dtype == torch.float32
    assert torch.isinf(lp[:, [PAD_ID, BOS_ID]]).all()
    assert torch.isinf(lp_min[:, EOS_ID]).all()  # t = 0 < min_len = 1
    torch.testing.assert_close(lp_min[:width, 4:], lp[:width, 4:])
    ok = [i for i in range(VOCAB) if i not in (PAD_ID, BOS_ID, EOS_ID)]
    torch.testing.assert_close(lp[:width, ok], ref[0, ok].expand(width, -1))
    # at the limit only eos is left, with its own log-probability
    assert torch.isinf(lp[width:, ok]).all()
    torch.testing.assert_close(lp[width:, EOS_ID], ref[1, EOS_ID].expand(width))


class InfLogits(NoEarlyEos):
    """fp16 logits that overflow: +inf for one token from the third output position on."""

    def __init__(self, model):
        super().__init__(model, shift=0.0)

    def decode(self, tgt_tokens, memory, src_mask, cache=None):
        logits = self.model.decode(tgt_tokens, memory, src_mask, cache).clone()
        if cache is not None and cache.length >= 3:
            logits[..., CONTENT[0]] = math.inf
        return logits


@pytest.mark.parametrize("kind", ["nan_weights", "inf_logits"])
@pytest.mark.parametrize("search", ["beam_bound", "beam_beam", "greedy"])
def test_24_03_non_finite_scores_are_an_error_not_a_hang(kind, search):
    import signal

    model = tiny_model(3)
    if kind == "nan_weights":  # what a run stopped by non-finite losses may have saved
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(math.nan)
    else:
        model = InfLogits(model)
    src = random_sources([5, 3, 7])

    def timeout(*_):
        raise TimeoutError("the search did not end")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        with pytest.raises(NonFiniteScoresError, match="NaN or infinite logits"):
            if search == "greedy":
                greedy_search(model, src, 1.0, 4)
            else:
                beam_search(model, src, beam_size=3, max_len_b=4, lenpen=1.0, lenpen_form="fairseq",
                            stopping=search.split("_")[1])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
