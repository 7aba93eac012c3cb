"""Checkpoint parts: each named part survives a save / load (weights_only) round trip; parameter
averaging (average_run) of step checkpoints."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import make_cfg, new_model, write_checkpoint

from transformer_nmt import checkpoint as ck
from transformer_nmt import runtime
from transformer_nmt.checkpoint import average_run, load_checkpoint, save_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runtime import grad_scaler
from transformer_nmt.train import resume
from transformer_nmt.train.distributed import DistInfo
from transformer_nmt.train.optim import build_optimizer, build_scheduler
from transformer_nmt.train.state import TrainState

VOCAB = 30


def _parts(cfg, seed: int):
    torch.manual_seed(seed)
    model = Transformer(cfg.model, vocab_size=VOCAB)
    optimizer = build_optimizer(model, cfg.trainer)
    scheduler = build_scheduler(optimizer, int(cfg.model.d_model), cfg.trainer)
    return model, optimizer, scheduler, grad_scaler(False)


def _step(model, optimizer, scheduler) -> None:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (2, 5), generator=g)
    tgt = torch.randint(4, VOCAB, (2, 4), generator=g)
    logits = model(src, tgt, torch.ones(2, 4, dtype=torch.bool))  # (8, V)
    logits.logsumexp(-1).mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def cfg(tiny_model):
    return compose([*tiny_model, "model.dropout=0.0", "trainer.warmup_steps=4"])


def test_model_optimizer_scheduler_round_trip(cfg, tmp_path):
    model, optimizer, scheduler, scaler = _parts(cfg, seed=1)
    for _ in range(3):
        _step(model, optimizer, scheduler)
    state = TrainState(step=3, micro_step=3)
    saved = ck.training_checkpoint(
        model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
        sampler=state.sampler_state(7), rng=[runtime.rng_state()], train_state=state.state_dict(),
        config=cfg, vocab_size=VOCAB,
    )
    assert set(saved) == {*ck.TRAINING_PARTS, "config", "vocab_size"}
    path = ck.save_checkpoint(tmp_path / "checkpoint_3.pt", saved)
    loaded = ck.load_checkpoint(path)  # weights_only=True
    ck.check_training_checkpoint(loaded, path)
    other = _parts(cfg, seed=2)
    ck.restore_modules(loaded, model=other[0], optimizer=other[1], scheduler=other[2],
                       scaler=other[3])
    assert other[2].state_dict()["last_epoch"] == scheduler.state_dict()["last_epoch"] == 3
    # The next step from the restored parts equals the next step of the originals.
    _step(model, optimizer, scheduler)
    _step(*other[:3])
    for (name, a), b in zip(model.state_dict().items(), other[0].state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded["config"]["model"]["d_model"] == 32 and loaded["vocab_size"] == VOCAB
    assert ck.checkpoint_step(loaded) == 3


def test_rng_round_trip_through_a_file(tmp_path):
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    path = ck.save_checkpoint(tmp_path / "rng.pt", {"rng": [runtime.rng_state()]})
    first = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    runtime.set_rng_state(ck.load_checkpoint(path)["rng"][0])
    again = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_train_state_round_trip_keeps_the_data_position_out():
    state = TrainState(step=12, micro_step=25, tokens_seen=900, src_tokens_seen=800,
                       src_sq_seen=9, tgt_sq_seen=8, src_tgt_seen=7, epoch=2, position=5,
                       train_seconds=3.5, skipped_steps=1, best_valid_loss=2.5,
                       best_valid_bleu=10.0, validations_without_improvement=2, world_size=2)
    d = state.state_dict()
    assert "epoch" not in d and "position" not in d  # stored once, in the sampler part
    restored = TrainState()
    restored.load_state_dict(d)
    restored.epoch, restored.position = 2, 5
    assert restored == state
    assert state.sampler_state(7) == {"epoch": 2, "position": 5, "seed": 7}
    with pytest.raises(ValueError, match="unknown keys.*'stepp'"):
        TrainState().load_state_dict({"stepp": 1})


def test_sampler_part_resumes_the_same_batches():
    sizes = np.arange(1, 60) % 17 + 1
    sampler = LengthBucketSampler(sizes, sizes, 40, shuffle=True, seed=5)
    sampler.set_epoch(1)
    batches = list(sampler)
    state = TrainState(epoch=1, position=3)
    resumed = LengthBucketSampler(sizes, sizes, 40, shuffle=True, seed=5)
    resumed.load_state_dict(state.sampler_state(5))
    assert list(resumed) == batches[3:]


def test_save_training_prunes_and_resume_training_restores(cfg, tmp_path, tiny_model):
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    model, optimizer, scheduler, scaler = _parts(cfg, seed=1)
    sizes = np.full(20, 3)
    vocab = {"spm_sha256": "ab" * 32, "vocab_size": VOCAB}
    s = SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                        vocab_size=VOCAB, vocab=vocab,
                        sampler=LengthBucketSampler(sizes, sizes, 16, seed=1))
    cfg = compose([*tiny_model, "model.dropout=0.0", "trainer.warmup_steps=4",
                   "trainer.save_every_steps=1"])
    for step in (1, 2, 3):
        _step(model, optimizer, scheduler)
        state = TrainState(step=step, micro_step=step, position=step, tokens_seen=10 * step)
        resume.save_training(tmp_path, s, state, info, config=cfg, seed=1, keep_last=2,
                         best=step == 2, regular=True)
    folder = ck.checkpoint_dir(tmp_path)
    assert [p.name for p in ck.step_checkpoints(tmp_path)] == ["checkpoint_2.pt", "checkpoint_3.pt"]
    assert ck.checkpoint_step(ck.load_checkpoint(folder / ck.BEST_NAME)) == 2
    assert ck.load_checkpoint(folder / "checkpoint_3.pt")["vocab"] == vocab
    fresh = _parts(cfg, seed=9)
    t = SimpleNamespace(model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], scaler=fresh[3],
                        vocab_size=VOCAB, sampler=s.sampler)
    restored = TrainState()
    path = resume.resume_training(tmp_path, t, restored, seed=1, info=info)
    assert path == folder / "checkpoint_3.pt"
    assert (restored.step, restored.position, restored.tokens_seen) == (3, 3, 30)
    for (name, a), b in zip(model.state_dict().items(), fresh[0].state_dict().values()):
        assert torch.equal(a, b), name


def test_old_layout_is_refused_and_model_files_keep_their_step(tmp_path):
    old = {"model": {}, "config": {}, "vocab_size": 5, "step": 4, "optimizer": {}}
    with pytest.raises(ValueError, match=r"old\.pt.*'scheduler'.*'train_state'"):
        ck.check_training_checkpoint(old, tmp_path / "old.pt")
    assert ck.checkpoint_step({"model": {}, "step": 7, "averaged_from": ["a.pt"]}) == 7
    assert ck.checkpoint_step({"model": {}}) is None


def test_average_is_mean_of_params(workspace, tokenizer, tmp_path):
    _, cfg = workspace
    cfg = make_cfg(tmp_path, "average.last=2")
    models = [new_model(cfg, tokenizer.vocab_size, seed=s) for s in (1, 2, 3)]
    folder = Path(cfg.run_dir) / "checkpoints"
    for step, m in zip((10, 20, 30), models):
        write_checkpoint(folder / f"checkpoint_{step}.pt", m, cfg, step)
    out = average_run(cfg)
    avg = load_checkpoint(out)
    assert avg["averaged_from"] == ["checkpoint_20.pt", "checkpoint_30.pt"]
    assert avg["step"] == 30 and avg["vocab_size"] == tokenizer.vocab_size
    assert avg["config"]["model"]["d_model"] == 32
    for name, p in models[1].state_dict().items():
        expected = (p.double() + models[2].state_dict()[name].double()) / 2
        torch.testing.assert_close(avg["model"][name], expected.to(p.dtype))
    # Explicit list overrides average.last.
    cfg.average.checkpoints = [str(folder / "checkpoint_10.pt"), str(folder / "checkpoint_30.pt")]
    avg = load_checkpoint(average_run(cfg))
    assert avg["averaged_from"] == ["checkpoint_10.pt", "checkpoint_30.pt"]
    key = "embed_tokens.weight"
    torch.testing.assert_close(
        avg["model"][key], (models[0].state_dict()[key] + models[2].state_dict()[key]) / 2
    )


def test_average_mismatch_names_keys_and_shapes(workspace, tokenizer, tmp_path):
    cfg = make_cfg(tmp_path)
    folder = Path(cfg.run_dir) / "checkpoints"
    model = new_model(cfg, tokenizer.vocab_size, seed=1)
    write_checkpoint(folder / "a.pt", model, cfg, 1)
    state = model.state_dict()
    dropped = dict(state)
    del dropped["embed_tokens.weight"]
    save_checkpoint(folder / "b.pt", {"model": dropped})
    wider = dict(state)
    wider["embed_tokens.weight"] = torch.zeros(7, 32)
    save_checkpoint(folder / "c.pt", {"model": wider})
    cfg.average.checkpoints = [str(folder / "a.pt"), str(folder / "b.pt")]
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        average_run(cfg)
    cfg.average.checkpoints = [str(folder / "a.pt"), str(folder / "c.pt")]
    with pytest.raises(ValueError, match=r"embed_tokens.weight has shape \(7, 32\)"):
        average_run(cfg)
    cfg.average.checkpoints = []
    with pytest.raises(FileNotFoundError, match="no checkpoint_<step>.pt"):
        average_run(cfg)


@pytest.mark.parametrize(("preset", "every", "last", "max_steps"),
                         [("wmt14_en_de_base", 1400, 5, 100_000),
                          ("wmt14_en_de_big", 600, 20, 300_000)])
def test_the_average_is_exactly_the_last_n_periodic_checkpoints(tmp_path, preset, every, last,
                                                                max_steps):
    """The WMT14 schedule's saves without training: a checkpoint every ``save_every_steps``, each
    followed by the loop's prune, then the one written when training stops (base: at 100,000,
    off the 1,400-step interval). The stop checkpoint takes no keep_last slot, and the average
    is exactly the last ``average.last`` periodic checkpoints."""
    cfg = compose([f"experiment={preset}", f"run_dir={tmp_path}"])
    assert (cfg.trainer.save_every_steps, cfg.trainer.keep_last, cfg.average.last) == (
        every, last, last)
    assert cfg.trainer.save_every_minutes is None and cfg.trainer.max_steps == max_steps
    folder = ck.checkpoint_dir(tmp_path)
    plain = {"trainer": {"save_every_steps": every}, "name": preset}
    saves = [*range(every, max_steps + 1, every)]
    if saves[-1] != max_steps:
        saves.append(max_steps)  # the stop checkpoint
    for step in saves:
        save_checkpoint(folder / f"checkpoint_{step}.pt",
                        {"model": {"w": torch.tensor([float(step)])}, "step": step,
                         "config": plain, "vocab_size": 8})
        ck.prune_checkpoints(tmp_path, cfg.trainer.keep_last, cfg.trainer.save_every_steps)
    periodic = [s for s in saves if s % every == 0][-last:]
    kept = [ck.checkpoint_step(load_checkpoint(p)) for p in ck.step_checkpoints(tmp_path)]
    assert kept == sorted(set(periodic) | {max_steps})
    avg = load_checkpoint(average_run(cfg))
    assert avg["averaged_steps"] == periodic and len(periodic) == last
    assert avg["model"]["w"].item() == pytest.approx(sum(periodic) / last)


def test_24_03_average_refuses_nan_parameters_and_the_stop_names_the_last_finite_checkpoint(
        tmp_path):
    from transformer_nmt.train.step import _bad_steps_error

    cfg = make_cfg(tmp_path, "average.last=2")
    folder = Path(cfg.run_dir) / "checkpoints"
    model = new_model(cfg, VOCAB, seed=1)
    write_checkpoint(folder / "checkpoint_10.pt", model, cfg, 10)
    with torch.no_grad():
        model.output_projection.weight[0, 0] = float("nan")
    write_checkpoint(folder / "checkpoint_20.pt", model, cfg, 20)
    with pytest.raises(ValueError, match=r"checkpoint_20.pt: 3 parameter tensors hold NaN or inf "
                       r"values \(embed_tokens.weight, tgt_embed_tokens.weight, output_projection"):
        average_run(cfg)
    assert not (folder / "averaged.pt").exists()
    state = TrainState(step=20, bad_steps_in_row=3)
    message = str(_bad_steps_error(state, cfg.trainer, float("nan"), float("nan"), 1e-3,
                                   Path(cfg.run_dir)))
    assert message.endswith("the last checkpoint whose parameters are all finite is "
                            f"{folder / 'checkpoint_10.pt'}")
    (folder / "checkpoint_10.pt").unlink()
    assert str(_bad_steps_error(state, cfg.trainer, 0.0, 0.0, 1e-3, Path(cfg.run_dir))).endswith(
        "no checkpoint of the run has all-finite parameters")


def test_the_dry_runs_sizes_do_not_stop_a_resume_but_a_recipe_change_does():
    """A run started before ``trainer.dry_run_steps`` changed its default (3 -> 10) resumes;
    the learning rate, which changes what is computed, is still named."""
    from transformer_nmt.config import compose, to_plain

    saved = to_plain(compose(["trainer.dry_run_steps=3", "trainer.dry_run_warmup_steps=0"]))
    new = to_plain(compose([]))
    assert ck.config_differences(saved, new) == []
    changed = to_plain(compose(["trainer.lr_multiplier=2.0"]))
    assert ck.config_differences(saved, changed) == ["trainer.lr_multiplier: 1.0 != 2.0"]


def test_max_steps_is_part_of_a_decaying_schedule_on_resume():
    """Under inverse_sqrt a resumed run may go on for more steps; under cosine or linear
    max_steps is where the rate reaches 0, so changing it is refused unless allowed."""
    from transformer_nmt.config import compose, to_plain

    def plain(*overrides):
        return to_plain(compose(["trainer.max_steps=1000", "trainer.warmup_steps=100",
                                 *overrides]))

    longer = ["trainer.max_steps=2000"]
    assert ck.config_differences(plain(), plain(*longer)) == []
    cosine = ["trainer.lr_scheduler=cosine"]
    assert ck.config_differences(plain(*cosine), plain(*cosine, *longer)) == [
        "trainer.max_steps: 1000 != 2000"]
    assert ck.config_differences(plain(*cosine), plain(*cosine, *longer),
                                 allowed=["trainer.max_steps"]) == []
    assert ck.config_differences(plain(), plain(*cosine)) == [
        "trainer.lr_scheduler: 'inverse_sqrt' != 'cosine'"]
