"""Adam and the learning-rate schedule of transformer_nmt.train.optim (section 5.3, equation 3)."""

from __future__ import annotations

import copy
from itertools import pairwise

import pytest
import torch

from transformer_nmt.config import ConfigError, compose
from transformer_nmt.train.optim import (
    build_optimizer,
    build_scheduler,
    decay_lr,
    inverse_sqrt_lr,
)


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


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decaying_schedules_share_the_warm_up_and_peak_and_end_at_zero(kind):
    """cosine / linear: the paper's warm-up and peak, then a fall to 0 at max_steps that
    never reaches 0 on an update of the run."""
    d, warm, total = 256, 150, 2550
    values = [decay_lr(s, d, warm, total, kind, 0.2) for s in range(1, total + 2)]
    assert values[:warm] == [inverse_sqrt_lr(s, d, warm, 0.2) for s in range(1, warm + 1)]
    assert max(values) == values[warm - 1] == pytest.approx(0.2 * d**-0.5 * warm**-0.5)
    assert all(a > b for a, b in pairwise(values[warm - 1:total]))
    assert values[total - 1] > 0.0 and values[total] == 0.0  # update max_steps, then past it
    middle = decay_lr(warm + (total + 1 - warm) // 2, d, warm, total, kind, 0.2) / max(values)
    assert middle == pytest.approx(0.5, abs=1e-3)  # both are at half the peak half-way
    quarter = decay_lr(warm + (total + 1 - warm) // 4, d, warm, total, kind, 0.2) / max(values)
    assert quarter == pytest.approx(0.854 if kind == "cosine" else 0.75, abs=1e-3)
    assert decay_lr(2000, d, warm, total, "inverse_sqrt", 0.2) == inverse_sqrt_lr(2000, d, warm,
                                                                                  0.2)
    short = [decay_lr(s, d, warm, 100, kind) for s in range(1, 101)]  # shorter than warm-up
    assert short == [inverse_sqrt_lr(s, d, warm) for s in range(1, 101)]
    assert decay_lr(101, d, warm, 100, kind) == 0.0


def test_the_scheduler_follows_the_chosen_schedule_and_resumes():
    cfg = compose(["model=tiny", "trainer.warmup_steps=4", "trainer.max_steps=20",
                   "trainer.lr_scheduler=cosine"])
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model, cfg.trainer)
    sched = build_scheduler(opt, 256, cfg.trainer)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([decay_lr(s, 256, 4, 20, "cosine") for s in range(1, 21)],
                                 rel=1e-12)
    sched2 = build_scheduler(build_optimizer(model, cfg.trainer), 256, cfg.trainer)
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_a_decaying_schedule_needs_max_steps():
    with pytest.raises(ConfigError, match=r"trainer.lr_scheduler=linear decays to 0 at "
                                          r"trainer.max_steps, which is null; .*inverse_sqrt"):
        compose(["trainer.lr_scheduler=linear", "trainer.max_steps=null"])
