"""The FLOPs formula (transformer_nmt.model.flops) against a hand computation on a tiny config."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from transformer_nmt.model.flops import TokenCounts, matmul_params_per_token, training_flops

# d_model 4, 2 heads of d_k 3 / d_v 2, d_ff 8, one layer each side, vocabulary 10.
TINY = SimpleNamespace(d_model=4, heads=2, d_k=3, d_v=2, d_ff=8, encoder_layers=1,
                       decoder_layers=1)


def test_matmul_params_by_hand():
    # W^Q = W^K = 4*2*3 = 24, W^V = W^O = 4*2*2 = 16, feed-forward 2*4*8 = 64.
    # P_src = (24+24+16+16 + 64) + cross W^K, W^V (24 + 16)              = 184
    # P_tgt = (24+24+16+16) + cross W^Q, W^O (24 + 16) + 64 + 4*10 = 80+40+64+40 = 224
    assert matmul_params_per_token(TINY, 10) == (184, 224)


def test_training_flops_by_hand():
    counts = TokenCounts.of([2, 3], [1, 4])
    assert counts == TokenCounts(src=5, tgt=5, src_sq=13, tgt_sq=17, src_tgt=14)
    # matmuls: 6 * (184*5 + 224*5) = 12240; attention pairs 13 + 17 + 14 = 44,
    # 6 * heads * (d_k + d_v) = 6*2*5 = 60 FLOPs each: 2640.
    assert training_flops(TINY, 10, counts) == 12240 + 2640


def test_default_head_sizes_and_the_12_d_model_attention_term():
    cfg = SimpleNamespace(d_model=512, heads=8, d_k=None, d_v=None, d_ff=2048,
                          encoder_layers=6, decoder_layers=6)
    s, t = np.array([30]), np.array([31])
    with_pairs = training_flops(cfg, 37000, TokenCounts.of(s, t))
    p_src, p_tgt = matmul_params_per_token(cfg, 37000)
    assert p_src == 6 * (4 * 512**2 + 2 * 512 * 2048) + 6 * 2 * 512**2
    pairs = 6 * 30 * 30 + 6 * 31 * 31 + 6 * 30 * 31
    assert with_pairs == pytest.approx(6 * (p_src * 30 + p_tgt * 31) + 12 * 512 * pairs)
