"""The device-resident beam and greedy search against the previous search (the oracle in
reference_beam_search.py): the same hypotheses token for token, whatever ``sync_every``; and
the host reads of one decoding call."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.decode import reference_beam_search as reference
from tests.unit.decode.test_beam_search import NoEarlyEos, random_sources, tiny_model
from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.decode.beam_search import (
    NonFiniteScoresError,
    beam_search,
    greedy_search,
    resolve_sync_every,
)
from transformer_nmt.model.transformer import Transformer


def assert_same(got, want, where="", exact=True):
    """Token-for-token equal hypotheses; scores and log-probabilities equal (``exact``: the
    same batch rows at every step, so the same float operations) or within 1e-6 (absolute or
    relative: finished sentences kept in the batch until the next read change the blocking
    of the decoder's matrix products, hence the last bits of the others' sums)."""
    assert len(got) == len(want), where
    tol = {"abs": 0, "rel": 0} if exact else {"abs": 1e-6, "rel": 1e-6}
    for i, (g, w) in enumerate(zip(got, want)):
        assert [h.tokens for h in g] == [h.tokens for h in w], f"{where} sentence {i}"
        for a, b in zip(g, w):
            assert a.score == pytest.approx(b.score, **tol), f"{where} sentence {i}"
            assert a.log_prob == pytest.approx(b.log_prob, **tol), f"{where} sentence {i}"


SETTINGS = [
    {"beam_size": k, "nbest": n, "stopping": stop, "lenpen": lp, "lenpen_form": form}
    for k in (4, 5) for n in (1, 2) for stop in ("bound", "beam")
    for lp, form in ((0.6, "gnmt"), (1.0, "fairseq"))
]


def compare(model, src, max_len_b, sync_values=(1, 8), settings=SETTINGS):
    for kwargs in settings:
        want = reference.beam_search(model, src, max_len_b=max_len_b, **kwargs)
        for every in sync_values:
            got = beam_search(model, src, max_len_b=max_len_b, sync_every=every, **kwargs)
            assert_same(got, want, f"{kwargs} sync_every={every}", exact=every == 1)
    want = reference.greedy_search(model, src, 1.0, max_len_b)
    for every in sync_values:
        assert_same(greedy_search(model, src, 1.0, max_len_b, sync_every=every), want,
                    f"greedy sync_every={every}", exact=every == 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_device_search_equals_reference_on_random_models(seed):
    """Random tiny models, padded batches of mixed lengths: every beam, n-best, stopping rule,
    length-penalty form and read interval gives the reference's hypotheses."""
    model = tiny_model(seed=seed + 20, vocab=30)
    rng = random.Random(seed)
    src = random_sources([rng.randint(2, 14) for _ in range(9)], seed=seed + 5)
    compare(model, src, max_len_b=6)


def test_device_search_equals_reference_with_a_vocabulary_taken_in_blocks(monkeypatch):
    """A vocabulary of 2,048: the CPU's per-row top-k goes through blocks (beam 4: 32 columns,
    beam 5: 16) and the search still gives the reference's hypotheses; the NaN check read from
    that top-k still stops it at the first non-finite step."""
    from transformer_nmt.decode import candidates as cand

    assert cand.block_width(2048, 8) == 32 and cand.block_width(2048, 10) == 16
    blocked = []
    real = cand.row_topk
    monkeypatch.setattr(cand, "row_topk", lambda x, k: blocked.append(
        cand.block_width(x.size(1), k) is not None) or real(x, k))
    model = tiny_model(seed=31, vocab=2048)
    src = random_sources([4, 9, 2, 12, 6], seed=11)
    compare(model, src, max_len_b=5, sync_values=(1,), settings=SETTINGS[::3])
    assert blocked and all(blocked)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    for every in (1, 8):
        with pytest.raises(NonFiniteScoresError, match="at output position 1 "):
            beam_search(model, src, beam_size=4, max_len_b=4, sync_every=every)


class Rounded(NoEarlyEos):
    """Logits rounded to whole numbers: many candidates and finished hypotheses tie exactly."""

    def __init__(self, model):
        super().__init__(model, shift=0.0)

    def decode(self, tgt_tokens, memory, src_mask, cache=None):
        return (self.model.decode(tgt_tokens, memory, src_mask, cache) * 0.5).round()


def test_device_search_equals_reference_with_ties():
    model = Rounded(tiny_model(seed=4, vocab=12))
    src = random_sources([5, 2, 8, 3, 6, 4], seed=3)
    compare(model, src, max_len_b=4)
    # ties did occur: equal scores among a sentence's n-best
    hyps = beam_search(model, src, beam_size=5, nbest=5, lenpen=0.0, max_len_b=4)
    assert any(len({h.score for h in sent}) < len(sent) for sent in hyps)


def test_device_search_equals_reference_at_the_length_limit():
    """eos pushed down: every hypothesis runs to the forced eos at its own limit."""
    model = NoEarlyEos(tiny_model(seed=2, vocab=20))
    src = random_sources([3, 8, 5, 11, 2], seed=9)
    compare(model, src, max_len_b=3, settings=SETTINGS[:4])


def reversal_pairs(n: int, seed: int, words: int = 40) -> list[tuple[list[int], list[int]]]:
    """Word-level reversal pairs over ``words`` content ids (4 ..), Zipf-distributed."""
    rng = random.Random(seed)
    ids = list(range(4, 4 + words))
    weights = [1.0 / r for r in range(1, words + 1)]
    pairs = []
    for _ in range(n):
        s = rng.choices(ids, weights=weights, k=rng.randint(3, 10))
        pairs.append((s, s[::-1]))
    return pairs


def batch(pairs, with_target=True):
    """(src, tgt_in, tgt_out) right-padded long tensors (source + eos; bos + target)."""
    width = max(len(s) for s, _ in pairs) + 1
    src = torch.full((len(pairs), width), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((len(pairs), width), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((len(pairs), width), PAD_ID, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS_ID])
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
        tgt_out[i, : len(t) + 1] = torch.tensor(t + [EOS_ID])
    return src, tgt_in, tgt_out


@pytest.fixture(scope="module")
def trained_model():
    """A 1+1-layer model trained 100 steps on the reversal task (a few seconds, one thread):
    peaked, structured distributions, with eos where the reversed sentence ends."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(name="test", encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64,
                      heads=2, dropout=0.0, max_positions=64)
    model = Transformer(cfg, vocab_size=44)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    data = reversal_pairs(2000, seed=1)
    for _ in range(100):
        src, tgt_in, tgt_out = batch(rng.sample(data, 32))
        logits = model(src, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                                                 ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    return model.eval()


def test_device_search_equals_reference_on_a_trained_model(trained_model):
    src, _, _ = batch(reversal_pairs(24, seed=7))
    compare(trained_model, src, max_len_b=5)
    # the model learnt something: most sentences end before their length limit
    hyps = beam_search(trained_model, src, beam_size=4, max_len_b=5)
    limits = src.ne(PAD_ID).sum(1) + 5
    assert sum(len(h[0].tokens) < int(n) for h, n in zip(hyps, limits)) > len(hyps) // 2


def stops_at_non_finite(**kwargs):
    """NaN weights: beam and greedy search (with ``kwargs``) raise NonFiniteScoresError naming
    output position 1, the flags read every step or every 8."""
    model = tiny_model(3)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    src = random_sources([5, 3, 7])
    for every in (1, 8):
        with pytest.raises(NonFiniteScoresError, match="at output position 1 "):
            beam_search(model, src, beam_size=3, max_len_b=4, sync_every=every, **kwargs)
        with pytest.raises(NonFiniteScoresError, match="at output position 1 "):
            greedy_search(model, src, 1.0, 4, sync_every=every, **kwargs)


def test_device_search_non_finite_error_with_deferred_reads():
    stops_at_non_finite()


def test_sync_every_values():
    assert resolve_sync_every(None, "cpu") == 1
    assert resolve_sync_every("auto", "cpu") == 1
    assert resolve_sync_every("auto", "cuda") == 8
    assert resolve_sync_every(3, "cuda") == 3
    assert resolve_sync_every("16", "cpu") == 16
    for bad in (0, -2, "often", 1.5, True):
        with pytest.raises(ValueError, match="sync_every"):
            resolve_sync_every(bad, "cpu")


READ_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}


class CountReads(TorchDispatchMode):
    """Counts host reads of tensor values: ``item``/``bool``/``int`` (aten._local_scalar_dense),
    ops whose output size depends on the values (nonzero, masked_select, unique: a device
    synchronisation on CUDA), and ``tolist``/``numpy``/``cpu`` (patched: no aten op)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.reads = 0
        for name in ("tolist", "numpy", "cpu"):
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.reads += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in READ_OPS:
            self.reads += 1
        return func(*args, **(kwargs or {}))


class CountSteps(NoEarlyEos):
    def __init__(self, model):
        super().__init__(model, shift=0.0)
        self.steps = 0

    def decode(self, tgt_tokens, memory, src_mask, cache=None):
        self.steps += 1
        return self.model.decode(tgt_tokens, memory, src_mask, cache)


READS_OUTSIDE_STEPS = 5
"""Host reads of one decoding call besides the finished flags: the source padding check of
the encoder and of the first decoder call, the length limits, and the results (two)."""


@pytest.mark.parametrize("search", ["beam", "greedy"])
@pytest.mark.parametrize("every", [1, 4, 8])
def test_device_search_host_reads_per_step(monkeypatch, search, every):
    """At most one read of the finished flags every ``sync_every`` steps (plus the read at the
    last step a sentence may take), and a fixed number outside the steps."""
    model = CountSteps(tiny_model(seed=5, vocab=30))
    src = random_sources([9, 2, 6, 13, 4, 7, 3, 11], seed=2)
    counter = CountReads(monkeypatch)
    with counter:
        if search == "beam":
            beam_search(model, src, beam_size=4, max_len_b=6, nbest=2, sync_every=every)
        else:
            greedy_search(model, src, 1.0, 6, sync_every=every)
    assert model.steps > 8
    assert counter.reads <= math.ceil(model.steps / every) + 1 + READS_OUTSIDE_STEPS, (
        counter.reads, model.steps)
