"""Adam and the learning-rate schedule of transformer_nmt.train.optim (section 5.3, equation 3)."""

from __future__ import annotations

import copy
from itertools import pairwise

import pytest
import torch

from transformer_nmt.config import compose
from transformer_nmt.train.optim import build_optimizer, build_scheduler, inverse_sqrt_lr


def test_paper_learning_rate_values():
    assert inverse_sqrt_lr(4000, 512, 4000) == pytest.approx(6.99e-4, rel=1e-3)
    assert inverse_sqrt_lr(4000, 1024, 4000) == pytest.approx(4.94e-4, rel=1e-3)
    assert inverse_sqrt_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(512**-0.5 / 16000**0.5)
    assert inverse_sqrt_lr(100, 512, 4000, multiplier=2.0) == pytest.approx(
        2 * inverse_sqrt_lr(100, 512, 4000)
    )
    values = [inverse_sqrt_lr(s, 512, 4000) for s in range(1, 20001)]
    peak = max(range(len(values)), key=values.__getitem__) + 1
    assert peak == 4000
    assert all(a < b for a, b in pairwise(values[:4000]))  # warm-up: rising
    assert all(a > b for a, b in pairwise(values[3999:]))  # then decaying
    with pytest.raises(ValueError, match="step=0"):
        inverse_sqrt_lr(0, 512, 4000)


def test_optimizer_and_scheduler_follow_the_schedule():
    cfg = compose(["model=base", "trainer.lr_multiplier=1.5", "trainer.warmup_steps=10"])
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model, cfg.trainer)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    sched = build_scheduler(opt, cfg.model.d_model, cfg.trainer)
    seen = []
    for step in range(1, 31):  # the rate used by update `step` is lrate(step)
        seen.append(opt.param_groups[0]["lr"])
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    expected = [inverse_sqrt_lr(s, 512, 10, 1.5) for s in range(1, 31)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert group["fused"]  # the fused kernel, on CPU as on GPU
    # The scheduler state round-trips (resumption).
    state = sched.state_dict()
    sched2 = build_scheduler(build_optimizer(model, cfg.trainer), 512, cfg.trainer)
    sched2.load_state_dict(state)
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_fused_adam_matches_the_reference_update():
    """build_optimizer's fused Adam takes the same steps as the textbook per-tensor Adam
    (section 5.3: beta1 0.9, beta2 0.98, eps 1e-9) under the warm-up schedule."""
    cfg = compose(["model=tiny", "trainer.warmup_steps=5"])
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    ref_model = copy.deepcopy(fused_model)
    start = fused_model[0].weight.detach().clone()
    fused = build_optimizer(fused_model, cfg.trainer)
    ref = torch.optim.Adam(ref_model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                           foreach=False, fused=False)
    scheds = [build_scheduler(o, 256, cfg.trainer) for o in (fused, ref)]
    for _ in range(12):
        x = torch.randn(4, 8)
        for model, opt in ((fused_model, fused), (ref_model, ref)):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
        for sched in scheds:
            sched.step()
    for a, b in zip(fused_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert (fused_model[0].weight - start).abs().max() > 1e-3  # the steps moved the weights
