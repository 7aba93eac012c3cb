"""bf16 / fp16 decoding with the linear weights cast once (decode/cast.py): the same hypotheses,
scores included, as autocast casting them; no weight cast left in a decoding step; the
embeddings untouched; decoding_model casts for the lower precisions only. A model not cast (the
training model in validation) is searched outside inference mode, where autocast casts each
weight once per search, not at every step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.decode.test_beam_search import random_sources, tiny_model
from transformer_nmt.config import DecodeConfig
from transformer_nmt.decode.beam_search import beam_search, greedy_search
from transformer_nmt.decode.cast import cast_linears
from transformer_nmt.decode.quantize import decoding_model
from transformer_nmt.runtime import autocast_context


class CastCounter(TorchDispatchMode):
    """Counts the dtype conversions of the given parameters (by storage address)."""

    def __init__(self, params) -> None:
        super().__init__()
        self.addresses = {p.data_ptr() for p in params}
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("to", "_to_copy") and isinstance(args[0], torch.Tensor):
            self.casts += args[0].data_ptr() in self.addresses
        return func(*args, **(kwargs or {}))


def _models(precision: str):
    model = tiny_model(seed=3)
    return model, cast_linears(copy.deepcopy(model), precision)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cast_linears_gives_the_same_hypotheses_as_autocast(precision):
    model, cast = _models(precision)
    src = random_sources([7, 5, 9, 3, 6], seed=4)
    cpu = torch.device("cpu")
    for search, kwargs in ((beam_search, {"beam_size": 4, "nbest": 2}),
                           (greedy_search, {})):
        with autocast_context(precision, cpu):
            want = search(model, src, max_len_b=8, **kwargs)
            got = search(cast, src, max_len_b=8, **kwargs)
        for g, w in zip(got, want):
            assert [(h.tokens, h.score, h.log_prob) for h in g] == \
                [(h.tokens, h.score, h.log_prob) for h in w]


def test_only_the_linear_layers_are_cast_and_the_projection_is_untied():
    model, cast = _models("bf16")
    linears = [m for m in cast.modules() if isinstance(m, nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(m.bias is None or m.bias.dtype == torch.bfloat16 for m in linears)
    assert not any(p.requires_grad for m in linears for p in m.parameters())
    assert model.output_projection.weight is model.tgt_embed_tokens.weight  # tied before
    assert cast.tgt_embed_tokens.weight.dtype == torch.float32  # the lookups keep float32
    assert torch.equal(cast.output_projection.weight,
                       model.tgt_embed_tokens.weight.detach().to(torch.bfloat16))
    norms = [m for m in cast.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(m.weight.dtype == torch.float32 for m in norms)
    with pytest.raises(ValueError, match="precision='fp32'"):
        cast_linears(model, "fp32")


def test_autocast_recasts_weights_inside_inference_mode_only():
    # why the weights are cast once: autocast keeps its casts outside inference mode only
    layer, x = nn.Linear(8, 8), torch.randn(2, 8)
    casts = {}
    for mode in (torch.inference_mode, torch.no_grad):
        counter = CastCounter(layer.parameters())
        with autocast_context("bf16", torch.device("cpu")), mode(), counter:
            for _ in range(3):
                layer(x)
        casts[mode.__name__] = counter.casts
    assert casts == {"inference_mode": 6, "no_grad": 2}  # weight and bias: each call, or once


def test_a_decoding_step_casts_no_weight_once_they_are_cast():
    _, cast = _models("bf16")
    counter = CastCounter(cast.parameters())  # any parameter, cast or not
    with autocast_context("bf16", torch.device("cpu")), counter:
        beam_search(cast, random_sources([6, 6], seed=5), beam_size=2, max_len_b=4)
    assert counter.casts == 0


@pytest.mark.parametrize("precision,cast", [("bf16", True), ("fp16", True), ("fp32", False)])
def test_decoding_model_casts_for_the_lower_precisions(precision, cast):
    model = tiny_model(seed=3)
    cfg = DecodeConfig(precision=precision, weight_prepack=False)
    out = decoding_model(model, cfg, "cpu")
    dtype = out.output_projection.weight.dtype
    assert (dtype != torch.float32) == cast


@pytest.mark.parametrize("search", [beam_search, greedy_search])
def test_a_model_not_cast_has_each_weight_cast_once_per_search_not_per_step(search):
    # validation during training decodes the training model itself (float32 weights) under
    # autocast: the search then runs without inference mode, where autocast keeps its casts
    model, cast = _models("bf16")
    src = random_sources([6, 6, 4], seed=5)
    modes = []
    for m in (model, cast):
        decode = m.decode

        def noting(*a, _decode=decode, **kw):
            modes.append(torch.is_inference_mode_enabled())
            return _decode(*a, **kw)

        m.decode = noting
    counter = CastCounter(model.parameters())
    with autocast_context("bf16", torch.device("cpu")), counter:
        got = search(model, src, max_len_b=6)
    tensors = sum(len(list(m.parameters())) for m in model.modules() if isinstance(m, nn.Linear))
    assert 0 < counter.casts <= tensors  # at most once each, whatever the steps
    with autocast_context("bf16", torch.device("cpu")):
        want = search(cast, src, max_len_b=6)
    assert [[(h.tokens, h.score) for h in g] for g in got] == \
        [[(h.tokens, h.score) for h in w] for w in want]
    steps = len(modes) // 2  # the two searches take the same steps
    assert steps > 1 and len(modes) == 2 * steps
    assert not any(modes[:steps]) and all(modes[steps:])  # no_grad, then inference mode
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()
