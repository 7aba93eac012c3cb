"""The batch target as a GPU run plans it: lengths padded to multiples of 8 (CUDA), the
``trainer.auto_max_tokens`` search under a device budget, its refusals, and a resume on
another GPU count or budget that keeps the target and sees every sentence of the epoch once."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.errors import UserError
from transformer_nmt.train.batch_size import plan_batch, search_max_tokens
from transformer_nmt.train.data import real_tokens_per_step
from transformer_nmt.train.resume import (
    _check_same_target,
    consumed_part,
    restore_data_position,
)
from transformer_nmt.train.state import TrainState

TARGET = 6000.0


def _lengths(n: int = 6000, ratio: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n,) source and target sizes: log-normal, mean about 30 pieces, long tail, capped at 120;
    the target ``ratio`` times the source (with spread)."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(np.log(26), 0.55, n)), 1, 120).astype(np.int64)
    tgt = np.clip(np.rint(src * rng.lognormal(np.log(ratio), 0.2, n)), 1, 120).astype(np.int64)
    return src, tgt


def _maker(src, tgt, pad, rank=0, world=1):
    def make(mt: int) -> LengthBucketSampler:
        return LengthBucketSampler(src, tgt, mt, seed=1, rank=rank, world_size=world,
                                   skip_too_long=True, pad_to_multiple=pad)
    return make


def _drawn_per_step(src, tgt, max_tokens, update_freq, world, pad) -> tuple[float, float]:
    """Real (source, target) tokens per full step, counted from the batches the ranks draw
    (not from the sampler's own mean)."""
    ranks = [_maker(src, tgt, pad, r, world)(max_tokens).epoch_batches(0) for r in range(world)]
    steps = len(ranks[0]) // update_freq
    s = t = 0
    for r in ranks:
        for batch in r[: steps * update_freq]:
            s += int((src[batch] + 1).sum())
            t += int((tgt[batch] + 1).sum())
    return s / steps, t / steps


def _trainer(**kw):
    return SimpleNamespace(**{"max_tokens": 400, "update_freq": 1, "tokens_per_step": TARGET,
                              "tokens_per_step_tolerance": 0.1, **kw})


def test_the_plan_measures_the_batches_as_the_device_pads_them():
    """Planned with the CUDA padding, the step the ranks draw is within the tolerance; the
    real tokens per batch differ from the CPU padding's (so planning with the wrong padding
    gives another step)."""
    src, tgt = _lengths()
    cpu = _maker(src, tgt, 1)(400)
    cuda = _maker(src, tgt, 8)(400)
    assert cuda.real_tokens_per_batch != cpu.real_tokens_per_batch
    model = SimpleNamespace(name="tiny", d_model=32)
    plan = plan_batch(_trainer(), model, _maker(src, tgt, 8), 1)
    drawn = _drawn_per_step(src, tgt, plan.max_tokens, plan.update_freq, 1, 8)
    assert all(abs(x / TARGET - 1) <= 0.1 for x in drawn), drawn
    # every collated batch of the CUDA sampler stays within its budget once padded to 8
    from transformer_nmt.data.batching import collate
    for batch in cuda.epoch_batches(0)[:50]:
        b = collate([(i, np.ones(src[i], np.int64), np.ones(tgt[i], np.int64)) for i in batch],
                    pad_to_multiple=8)
        assert b.src_tokens.numel() <= 400 and b.tgt_out.numel() <= 400


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("cap", [900, 4000, 20000])
def test_auto_search_meets_the_target_for_any_gpu_count_and_memory(world, cap):
    src, tgt = _lengths()
    plan = search_max_tokens(_maker(src, tgt, 8), TARGET, 0.1, world, cap, min_tokens=128)
    assert 128 <= plan.max_tokens <= cap
    drawn = _drawn_per_step(src, tgt, plan.max_tokens, plan.update_freq, world, 8)
    assert all(abs(x / TARGET - 1) <= 0.1 for x in drawn), (plan.max_tokens, plan.update_freq,
                                                           drawn)
    # as few micro-batches as the cap allows: with one fewer no budget under it is within
    if plan.update_freq > 1 and cap <= 4000:
        make = _maker(src, tgt, 8)
        for mt in range(128, cap + 1, 8):
            fewer = real_tokens_per_step(make(mt), plan.update_freq - 1, world)
            assert max(abs(x / TARGET - 1) for x in fewer) > 0.1, mt


def test_auto_search_refuses_too_many_gpus_naming_fewer_gpus():
    src, tgt = _lengths()
    with pytest.raises(UserError) as e:
        search_max_tokens(_maker(src, tgt, 8), TARGET, 0.1, 128, 20000, min_tokens=128)
    msg = str(e.value)
    assert "fewer GPUs" in msg and "change trainer.max_tokens" not in msg
    assert "\n" not in msg


def test_auto_search_refuses_unequal_sides_naming_the_tolerance():
    src, tgt = _lengths(ratio=1.4)
    with pytest.raises(UserError) as e:
        search_max_tokens(_maker(src, tgt, 8), TARGET, 0.1, 2, 20000, min_tokens=128)
    msg = str(e.value)
    assert "tokens_per_step_tolerance" in msg and "change trainer.max_tokens" not in msg
    plan = search_max_tokens(_maker(src, tgt, 8), TARGET, 0.25, 2, 20000, min_tokens=128)
    assert all(abs(x / TARGET - 1) <= 0.25 for x in (plan.src_per_step, plan.tgt_per_step))


def test_plan_batch_searches_under_the_device_cap():
    src, tgt = _lengths()
    model = SimpleNamespace(name="base", d_model=512)
    for world in (1, 4):
        plan = plan_batch(_trainer(), model, _maker(src, tgt, 8), world, device_cap=20000,
                          min_tokens=128)
        assert abs(plan.tgt_per_step / TARGET - 1) <= 0.1 and plan.max_tokens <= 20000


# ------------------------------------------------------------------ resume as sentences


def _segment(src, tgt, world, max_tokens, saved, steps, update_freq=1):
    """Resume ``world`` ranks at ``max_tokens`` from the checkpoint dict ``saved`` (None:
    the start), draw ``steps`` steps as the training loop does, and return the sentences
    drawn and the checkpoint dict written after them (through torch.save / load)."""
    samplers = [_maker(src, tgt, 8, r, world)(max_tokens) for r in range(world)]
    states = [TrainState(world_size=world) for _ in range(world)]
    if saved is not None:
        for s, st in zip(samplers, states, strict=True):
            st.world_size = saved["world_size"]
            restore_data_position(saved, Path("ckpt.pt"), SimpleNamespace(sampler=s), st, world)
            st.world_size = world
    seen: list[int] = []
    iters = [None] * world
    for _ in range(steps):
        for r, (s, st) in enumerate(zip(samplers, states, strict=True)):
            if iters[r] is None:
                s.set_epoch(st.epoch)
                s.load_state_dict(st.sampler_state(1))
                iters[r] = iter(s)
            k = min(update_freq, len(s) - st.position)
            for _ in range(k):
                seen += next(iters[r])
            st.position += k
            if st.position >= len(s):
                st.epoch, st.position, iters[r] = st.epoch + 1, 0, None
    st, s = states[0], samplers[0]
    ckpt = {"sampler": {**st.sampler_state(1), **consumed_part(s, st)}, "world_size": world}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    buf.seek(0)
    return seen, torch.load(buf, weights_only=True), st


def test_two_ranks_to_one_and_back_see_every_sentence_of_the_epoch_once():
    src, tgt = _lengths(3000)
    seen_a, ck_a, _ = _segment(src, tgt, 2, 600, None, steps=7)
    # another GPU count and another budget (another GPU memory) for the middle segment
    seen_b, ck_b, _ = _segment(src, tgt, 1, 1000, ck_a, steps=9)
    assert ck_b["sampler"]["sentences"] == len(seen_a) + len(seen_b)
    # back to 2 ranks at the first budget, to the end of the epoch
    seen_c, _, st = _segment(src, tgt, 2, 600, ck_b, steps=200)
    assert st.epoch >= 1
    # the rest of epoch 0 comes first in what the third segment drew
    epoch0 = seen_a + seen_b
    epoch0 += seen_c[: len(src) - len(epoch0)]
    assert sorted(epoch0) == list(range(len(src)))  # each sentence once, none missing


def test_same_layout_resumes_exactly_in_batches():
    src, tgt = _lengths(3000)
    seen_a, ck_a, _ = _segment(src, tgt, 2, 600, None, steps=5)
    seen_b, _, _ = _segment(src, tgt, 2, 600, ck_a, steps=4)
    seen_all, _, _ = _segment(src, tgt, 2, 600, None, steps=9)
    assert seen_a + seen_b == seen_all


def test_resume_keeps_the_target_and_lets_the_derived_budget_change():
    from transformer_nmt.checkpoint import config_differences

    saved = {"trainer": {"tokens_per_step": 25000, "max_tokens": 3600, "update_freq": 8}}
    other_gpus = {"trainer": {"tokens_per_step": 25000, "max_tokens": 2048, "update_freq": 1}}
    assert config_differences(saved, other_gpus) == []  # resume and averaging accept it
    no_target = {"trainer": {"tokens_per_step": None, "max_tokens": 3600, "update_freq": 8}}
    assert config_differences(no_target, {"trainer": {**no_target["trainer"],
                                                      "max_tokens": 2048}})
    cfg = SimpleNamespace(trainer=SimpleNamespace(tokens_per_step=50000, resume_changed=[]))
    with pytest.raises(UserError, match=r"tokens_per_step=25000, now 50000"):
        _check_same_target(saved, cfg)
    cfg.trainer.resume_changed = ["trainer.tokens_per_step"]
    _check_same_target(saved, cfg)  # deliberately changed
    same = SimpleNamespace(trainer=SimpleNamespace(tokens_per_step=25000, resume_changed=[]))
    _check_same_target(saved, same)


def test_a_checkpoint_with_its_position_in_batches_only_resumes_in_its_own_layout():
    """A checkpoint written before the position was kept as sentences cannot continue in
    another budget: refused, naming the budget to resume with."""
    src, tgt = _lengths(3000)
    saved = {"sampler": {"epoch": 0, "position": 3, "seed": 1},
             "config": {"trainer": {"max_tokens": 1000}}}
    s = SimpleNamespace(sampler=_maker(src, tgt, 8)(600))
    with pytest.raises(UserError, match=r"trainer.max_tokens=1000 trainer.auto_max_tokens=false"):
        restore_data_position(saved, Path("ckpt.pt"), s, TrainState(), 1)
    saved["config"]["trainer"]["max_tokens"] = 600
    state = TrainState()
    assert restore_data_position(saved, Path("ckpt.pt"), s, state, 1) and state.position == 3
