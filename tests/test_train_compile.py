"""torch.compile of the training forward: no graph breaks; DDP wraps before compiling."""

from __future__ import annotations

import socket

import pytest
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train import distributed
from transformer_nmt.train.setup import wrap_model

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


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_training_forward_has_no_graph_breaks(norm):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**TINY.__dict__, "norm": norm}), vocab_size=V).train()
    src, tgt_in, keep = _padded_batch()
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
        assert getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None)) is False
        assert hasattr(wrapped, "no_sync")  # forward_backward's gradient accumulation
    finally:
        dist.destroy_process_group()

