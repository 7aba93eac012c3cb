"""torch.compile of the training forward: no graph breaks; DDP wraps before compiling."""

from __future__ import annotations

import socket

import pytest
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train import distributed
from transformer_nmt.train.setup import wrap_model

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

V = 23
TINY = ModelConfig(
    name="test", encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
    dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, max_positions=64,
)


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source (3, 6) and target input (3, 5) with padding on both sides, and the flat
    indices of the real target positions (what the training step passes)."""
    g = torch.Generator().manual_seed(0)
    src = torch.full((3, 6), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((3, 5), PAD_ID, dtype=torch.long)
    for i, (s, t) in enumerate([(5, 4), (3, 2), (2, 3)]):
        src[i, :s] = torch.randint(4, V, (s,), generator=g)
        src[i, s] = EOS_ID
        tgt_out[i, :t] = torch.randint(4, V, (t,), generator=g)
        tgt_out[i, t] = EOS_ID
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt_out[:, :-1]], 1)
    tgt_in = tgt_in.masked_fill(tgt_out.eq(PAD_ID), PAD_ID)
    keep = tgt_out.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)
    return src, tgt_in, keep


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_training_forward_has_no_graph_breaks(norm, dynamic):
    """Static shapes, and the dynamic batch, length and target-count dimensions the training
    step marks (a symbolic length once broke the graph at SDPA's ``is_causal``)."""
    from transformer_nmt.train.step import mark_dynamic_batch

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**TINY.__dict__, "norm": norm}), vocab_size=V).train()
    src, tgt_in, keep = _padded_batch()
    if dynamic:
        mark_dynamic_batch(src, tgt_in, keep)
    explanation = torch._dynamo.explain(model)(src, tgt_in, keep)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_index_selection_equals_the_bool_mask_selection():
    torch.manual_seed(0)
    model = Transformer(TINY, vocab_size=V).eval()
    src, tgt_in, keep = _padded_batch()
    mask = torch.zeros(tgt_in.numel(), dtype=torch.bool)
    mask[keep] = True
    by_mask = model(src, tgt_in, mask.view_as(tgt_in))  # (N, V)
    by_index = model(src, tgt_in, keep)  # (N, V)
    assert by_index.shape == (int(mask.sum()), V)
    torch.testing.assert_close(by_index, by_mask)
    # training keeps the key mask even when nothing is padded (no host read): same logits
    # as decoding, which drops the all-True mask
    no_dropout = Transformer(
        ModelConfig(**{**TINY.__dict__, "dropout": 0.0, "attention_dropout": 0.0,
                       "activation_dropout": 0.0}), vocab_size=V)
    full = src[:1, :6]
    assert bool(full.ne(PAD_ID).all())
    torch.testing.assert_close(no_dropout.train()(full, tgt_in[:1]),
                               no_dropout.eval()(full, tgt_in[:1]))


def test_ddp_wraps_before_compiling_and_does_not_broadcast_buffers(monkeypatch):
    """One gloo process: the compiled module is the DDP module (so DDP's buckets overlap the
    backward), and DDP does not broadcast the sinusoidal tables."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = Transformer(TINY, vocab_size=V)
        info = distributed.DistInfo(rank=0, world_size=1, local_rank=0,
                                    device=torch.device("cpu"))
        info_multi = type("Info", (), {"distributed": True, "local_rank": 0})()
        plain = wrap_model(model, info, compile=False)
        assert plain is model or not isinstance(plain, torch.nn.parallel.DistributedDataParallel)
        wrapped = wrap_model(model, info_multi, compile=True)
        assert isinstance(wrapped._orig_mod, torch.nn.parallel.DistributedDataParallel)
        ddp = wrapped._orig_mod
        sync = getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None))
        assert sync is False
        assert hasattr(wrapped, "no_sync")  # forward_backward's gradient accumulation
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------- few shapes over real batches

COMPILED_BATCHES = 200
"""Real micro-batches of the synthetic corpus the compiled step takes (max_tokens 256: batch
sizes and lengths of every kind the corpus has), with a zero-weight dummy every 25th."""
MAX_RECOMPILES = 1
"""Graphs traced beyond the first over those batches (measured: none; one is allowed for a
batch of one sentence, a size torch.compile specialises). Before the dimensions were marked
dynamic and SDPA's ``is_causal`` made a constant, the same batches compiled 7 frames: a graph
break in every decoder layer and a recompilation when the sizes first changed."""


def _real_batches(synthetic_corpus, tiny_model, pad_to_multiple: int):
    from transformer_nmt.config import compose
    from transformer_nmt.data.batching import LengthBucketSampler, collate
    from transformer_nmt.train.data import load_split

    cfg = compose(["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
                   "model.dropout=0.0"])
    data = load_split(cfg, cfg.data.train_split)
    sampler = LengthBucketSampler(data.src_sizes, data.tgt_sizes, 256, shuffle=True, seed=1)
    batches = []
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batches.append(collate([data[j] for j in indices], pad_to_multiple=pad_to_multiple))
            if len(batches) % 25 == 24:
                batches.append(None)  # a rank without data: the zero-weight dummy batch
            if len(batches) >= COMPILED_BATCHES:
                return cfg, batches
    return cfg, batches


def _train_losses(cfg, batches, model_fn) -> list[float]:
    from transformer_nmt.train.step import forward_backward

    torch.manual_seed(0)
    model = Transformer(cfg.model, vocab_size=cfg.data.vocab_size).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_model = model_fn(model)
    losses = []
    for batch in batches:
        out = forward_backward(train_model, [batch], epsilon=0.1, device=torch.device("cpu"),
                               world_size=1, pad_to_multiple=8)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if batch is not None:
            losses.append(out["loss_sum"].item() / float(out["counts"][0]))
    return losses


def test_compiled_step_recompiles_at_most_once_over_real_batches_and_equals_eager(
        synthetic_corpus, tiny_model):
    """200 real micro-batches (lengths rounded to multiples of 8, 8 dummy batches among
    them): at most ``MAX_RECOMPILES`` graphs beyond the first, and the compiled step's loss
    curve (AOT autograd, the graph Inductor would be given) equals eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend

    cfg, batches = _real_batches(synthetic_corpus, tiny_model, pad_to_multiple=8)
    _, unrounded = _real_batches(synthetic_corpus, tiny_model, pad_to_multiple=1)
    shapes = {(b.src_tokens.shape, b.tgt_in.shape) for b in unrounded if b is not None}
    assert len(batches) == COMPILED_BATCHES and len(shapes) > 30  # many shapes to serve
    assert all(b.src_tokens.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0
               for b in batches if b is not None)
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = _train_losses(cfg, batches,
                             lambda m: wrap_model(m, info, compile=True, backend=counter))
    eager = _train_losses(cfg, batches, lambda m: m)
    torch._dynamo.reset()
    # two frames: the model's and the loss's (train.step.loss_function)
    assert 2 <= counter.frame_count <= 2 + MAX_RECOMPILES, counter.frame_count
    assert len(compiled) == len(eager) == COMPILED_BATCHES - 8
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    assert eager[-1] < eager[0]


def test_dummy_batch_has_a_dynamic_shape_with_real_targets():
    from transformer_nmt.train.step import _dummy_batch

    batch = _dummy_batch(8)
    assert batch.src_tokens.shape == batch.tgt_out.shape == (2, 8)
    assert bool(batch.tgt_out.ne(PAD_ID).all())


def test_compile_is_on_by_default_on_cuda_only():
    from transformer_nmt.config import TrainerConfig
    from transformer_nmt.train.setup import compile_enabled

    assert TrainerConfig().compile is None
    assert compile_enabled(None, torch.device("cuda", 0)) is True
    assert compile_enabled(None, torch.device("cpu")) is False
    assert compile_enabled(False, torch.device("cuda", 0)) is False
    assert compile_enabled(True, torch.device("cpu")) is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_step_on_cuda_with_inductor_recompiles_at_most_once(synthetic_corpus, tiny_model):
    """The GPU path as trained: Inductor, bf16 autocast, lengths rounded to 8; 200 real
    batches with dummies compile at most ``2 + MAX_RECOMPILES`` graphs (the model's, the loss's)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from transformer_nmt.runtime import autocast_context
    from transformer_nmt.train.step import forward_backward

    cfg, batches = _real_batches(synthetic_corpus, tiny_model, pad_to_multiple=8)
    cuda = torch.device("cuda", 0)
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=cuda)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    torch.manual_seed(0)
    model = Transformer(cfg.model, vocab_size=cfg.data.vocab_size).to(cuda).train()
    compiled = wrap_model(model, info, compile=True, backend=counter)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for batch in batches:
        forward_backward(compiled, [batch], epsilon=0.1, device=cuda, world_size=1,
                         autocast=lambda: autocast_context("bf16", cuda), pad_to_multiple=8)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    assert 2 <= counter.frame_count <= 2 + MAX_RECOMPILES, counter.frame_count  # model, loss
