"""The whole step as one function (``trainer.cuda_graphs``, packed batches): the parameters of
today's packed step, one traced graph with the optimizer and the clip inside, no host read,
a non-finite step skipped on the device, an exact resume with the RNG state dropout draws
from, the refusals (packing off, fp16), and two gloo ranks summing their gradients inside
the step."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import transformer_nmt.train.loop as train_mod
from transformer_nmt.checkpoint import checkpoint_dir, load_checkpoint
from transformer_nmt.config import ModelConfig, TrainerConfig, compose
from transformer_nmt.data.packing import PackedSampler, collate_packed
from transformer_nmt.errors import ConfigError, UserError
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train import loss as loss_module
from transformer_nmt.train.metrics import Window
from transformer_nmt.train.optim import build_optimizer, build_scheduler
from transformer_nmt.train.setup import check_whole_step
from transformer_nmt.train.state import TrainState
from transformer_nmt.train.step import finish_update, forward_backward, queue_update
from transformer_nmt.train.whole_step import WholeStep, adam_update
from unit.train.test_host_bubble import HOST_READS, _same, _snapshot
from unit.train.test_packed_training import TRAINER

pytestmark = pytest.mark.heavy  # make test-heavy, not make test (docs/ARCHITECTURE.md)

CPU = torch.device("cpu")
V = 23


def _model(dropout: float = 0.0) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(name="test", encoder_layers=1, decoder_layers=1, d_model=16,
                                   d_ff=32, heads=2, max_positions=64, dropout=dropout,
                                   attention_dropout=dropout, activation_dropout=dropout),
                       vocab_size=V).train()


@pytest.fixture(scope="module")
def packed_batches():
    """Packed (10, 24) micro-batches of random pairs, and their shape."""
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 20, 300), rng.integers(1, 20, 300)
    sampler = PackedSampler(src, tgt, 256, pack_length=24, seed=1)
    batches = [collate_packed([(i, rng.integers(4, V, src[i]), rng.integers(4, V, tgt[i]))
                               for i in b], *sampler.shape) for b in sampler]
    return batches, sampler.shape


class _Run:
    """What finish_update needs of a run: the optimizer, the schedule, no loss scaler."""

    def __init__(self, model, t_cfg) -> None:
        self.model = model
        self.optimizer = build_optimizer(model, t_cfg)
        self.scheduler = build_scheduler(self.optimizer, 16, t_cfg)
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device, self.grads_in_buckets = CPU, False


T_CFG = TrainerConfig(update_freq=2, clip_norm=1.0, warmup_steps=4, label_smoothing=0.1)


def _whole(run: _Run, shape, **kwargs) -> WholeStep:
    return WholeStep(run.model, run.optimizer, run.scheduler, T_CFG, shape, CPU, **kwargs)


def _eager_steps(batches, shape, steps: int, tmp_path) -> _Run:
    run = _Run(_model(), T_CFG)
    for k in range(steps):
        out = forward_backward(run.model, batches[2 * k:2 * k + 2], epsilon=0.1, device=CPU,
                               world_size=1, packed_shape=shape)
        finish_update(run, TrainState(), Window(), queue_update(run, out, T_CFG), T_CFG,
                      tmp_path)
    return run


def test_the_whole_step_gives_the_parameters_of_the_eager_packed_step(packed_batches,
                                                                      tmp_path):
    """Three steps of two micro-batches (clipping on, the later steps launched before the
    one before is read): parameters, Adam moments and step counts equal today's
    forward_backward, queue_update and fused Adam to 1e-5 (fp32).

    Left out of the parameters' comparison: the entries whose gradient is rounding noise of
    an exact zero (the key biases: adding one vector to every key shifts each query's scores
    by a constant, which the softmax ignores), second moment below 1e-16: Adam divides that
    noise (about 1e-10) by its own square root plus eps 1e-9, so either path moves them by
    up to the learning rate in a direction the noise picks."""
    batches, shape = packed_batches
    eager = _eager_steps(batches, shape, 3, tmp_path)
    run = _Run(_model(), T_CFG)
    whole = _whole(run, shape)
    state, pending = TrainState(), None
    for k in range(3):
        queued = whole.launch(batches[2 * k:2 * k + 2], follows_unread=pending is not None)
        if pending is not None:
            finish_update(run, state, Window(), pending, T_CFG, tmp_path)
        pending = queued
    fig = finish_update(run, state, Window(), pending, T_CFG, tmp_path)
    assert state.step == 3 and run.scheduler.last_epoch == 3
    assert fig.lr == pytest.approx(eager.scheduler.get_last_lr()[0] * 3 / 4)  # lr(3) = 3/4 lr(4)
    noise = []
    for (name, a), b in zip(run.model.named_parameters(), eager.model.parameters(),
                            strict=True):
        sa, sb = run.optimizer.state[a], eager.optimizer.state[b]
        real = sb["exp_avg_sq"] > 1e-16
        torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)
        if not real.all():
            noise.append(name)
        assert sa.keys() == sb.keys() and float(sa["step"]) == float(sb["step"]) == 3
        torch.testing.assert_close(sa["exp_avg"], sb["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-5, atol=1e-9)
    assert noise == ["encoder_layers.0.self_attn.in_proj.bias",
                     "decoder_layers.0.self_attn.in_proj.bias",
                     "decoder_layers.0.cross_attn.kv_proj.bias"]


def test_adam_update_equals_torchs_fused_adam():
    torch.manual_seed(1)
    params = [torch.randn(5, 3), torch.randn(7)]
    fused = [p.clone().requires_grad_() for p in params]
    adam = torch.optim.Adam(fused, lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01,
                            fused=True)
    ours = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    t = [torch.zeros((), dtype=torch.float32) for _ in params]
    for _ in range(4):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(fused, grads):
            p.grad = g.clone()
        adam.step()
        adam_update(ours, grads, m, v, t, lr=torch.tensor(0.01), finite=torch.tensor(True),
                    beta1=0.9, beta2=0.98, eps=1e-9, weight_decay=0.01)
    for p, q in zip(ours, fused):
        torch.testing.assert_close(p, q.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(v[0], adam.state[fused[0]]["exp_avg_sq"], rtol=1e-6, atol=0)


def test_the_step_is_one_graph_with_the_clip_and_the_optimizer_inside(packed_batches):
    """torch._dynamo.explain over the whole step: no graph break, one graph, which holds
    the backward, the gradient norm and clip, Adam's square root and the skip's where; the
    explained call itself updated the parameters."""
    batches, shape = packed_batches
    torch._dynamo.reset()
    run = _Run(_model(), T_CFG)
    whole = _whole(run, shape)
    grid, scalars, *_ = whole.host_inputs(batches[:2], [0, 1], False)
    before = [p.detach().clone() for p in run.model.parameters()]
    with torch.no_grad(), torch._dynamo.config.patch(trace_autograd_ops=True):
        explanation = torch._dynamo.explain(whole.step_function)(
            grid, scalars, whole.finite, *whole.optimizer_state())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    code = explanation.graphs[0].code
    for op in ("autograd.grad", "_foreach_norm", "clamp", "sqrt", "torch.where", "lerp"):
        assert op in code, op
    assert "all_reduce" not in code  # one process: no collective
    assert all(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


class _ScalarReads(TorchDispatchMode):
    """Counts the aten operations that read a tensor's value into the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_step_makes_no_host_read(packed_batches, monkeypatch):
    """Python's reads of a tensor (item, tolist, bool, float, int, index, cpu, numpy) and
    aten's scalar read, counted over two launches (eager: every operation runs in Python's
    sight): none; the loop's one read of the figures comes after."""
    batches, shape = packed_batches
    run = _Run(_model(dropout=0.1), T_CFG)
    whole = _whole(run, shape)
    whole.launch(batches[:2], [0])  # the state created outside the count
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(tensor, *a, _name=name, _original=original, **kw):
            reads.append(_name)
            return _original(tensor, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, counting)
    with _ScalarReads() as mode:
        for k in (1, 2):
            whole.launch(batches[2 * k:2 * k + 2], [0], follows_unread=True)
    assert reads == [] and mode.reads == []


def test_a_non_finite_step_is_skipped_on_the_device(packed_batches, monkeypatch, tmp_path,
                                                    caplog):
    """A NaN loss in step 2 of 4: its launch leaves the parameters, the moments and the step
    counts exactly as they were, every other launch changes them; its figures log the skip
    and the schedule does not count it (step 3 takes step 2's rate)."""
    batches, shape = packed_batches
    run = _Run(_model(), T_CFG)
    whole = _whole(run, shape)
    real_loss, calls = loss_module.label_smoothed_nll_loss, []

    def loss(logits, target, epsilon, ignore_index=0):
        calls.append(1)
        value, nll = real_loss(logits, target, epsilon, ignore_index)
        return (value * float("nan"), nll) if len(calls) in (3, 4) else (value, nll)

    monkeypatch.setattr(loss_module, "label_smoothed_nll_loss", loss)
    state, pending, changed, lrs = TrainState(), None, [], []
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.train"):
        for k in range(4):
            before = _snapshot(run.model, run.optimizer)
            queued = whole.launch(batches[2 * k:2 * k + 2], follows_unread=pending is not None)
            changed.append(not _same(before, _snapshot(run.model, run.optimizer)))
            if pending is not None:
                lrs.append(finish_update(run, state, Window(), pending, T_CFG, tmp_path).lr)
            pending = queued
        lrs.append(finish_update(run, state, Window(), pending, T_CFG, tmp_path).lr)
    assert changed == [True, False, True, True]
    assert (state.step, state.skipped_steps) == (3, 1)
    assert [m for m in caplog.messages if "skipped" in m][0].startswith("step 2 skipped: loss nan")
    lr = [run.scheduler.lr_lambdas[0](n) for n in range(4)]
    assert lrs == [lr[0], lr[1], lr[1], lr[2]]
    assert all(float(s["step"]) == 3 for s in run.optimizer.state.values())


def test_the_step_draws_dropout_from_the_global_generator(packed_batches):
    """Compiled (aot_eager: the graph's random operations draw as eager ones do) with dropout:
    from the same torch RNG state (what a checkpoint saves and a resume restores), two
    launches give the same parameters, and from another state other ones."""
    batches, shape = packed_batches
    torch._dynamo.reset()

    def two_steps(seed: int) -> list[torch.Tensor]:
        run = _Run(_model(dropout=0.3), T_CFG)
        whole = _whole(run, shape, compile=True, backend="aot_eager")
        torch.manual_seed(seed)
        for k in range(2):
            whole.launch(batches[2 * k:2 * k + 2])
        return [p.detach().clone() for p in run.model.parameters()]

    a, b, c = two_steps(5), two_steps(5), two_steps(6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.fixture(scope="module")
def graphed(tiny_model, synthetic_corpus) -> list[str]:
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model, *TRAINER,
            "trainer.cuda_graphs=true", "trainer.update_freq=2"]


def test_a_graphed_run_resumes_bit_for_bit_and_with_the_eager_step(tmp_path, graphed):
    """Dropout on, 6 steps at once and 3 + 3 from the step-3 checkpoint, both with
    trainer.cuda_graphs: parameters, Adam state, schedule, counters and RNG equal; the
    checkpoint resumes with the eager step too, no resume_changed needed (the optimizer state
    has fused Adam's layout)."""
    common = [*graphed, "trainer.validate_every_steps=null", "trainer.save_every_steps=3"]
    train_mod.train(compose([*common, f"run_dir={tmp_path / 'a'}", "trainer.max_steps=6"]))
    train_mod.train(compose([*common, f"run_dir={tmp_path / 'b'}", "trainer.max_steps=3"]))
    resumed = train_mod.train(compose([*common, f"run_dir={tmp_path / 'b'}",
                                       "trainer.max_steps=6"]))
    assert resumed["resumed_from"] and resumed["steps"] == 6
    a = load_checkpoint(checkpoint_dir(tmp_path / "a") / "checkpoint_6.pt")
    b = load_checkpoint(checkpoint_dir(tmp_path / "b") / "checkpoint_6.pt")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for k, state in a["optimizer"]["state"].items():
        assert state.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][k][name]), (k, name)
    assert a["scheduler"] == b["scheduler"]
    assert a["train_state"]["step"] == b["train_state"]["step"] == 6
    assert torch.equal(a["rng"][0]["torch"], b["rng"][0]["torch"])
    eager = train_mod.train(compose([*common, f"run_dir={tmp_path / 'b'}",
                                     "trainer.cuda_graphs=false", "trainer.max_steps=7"]))
    assert eager["steps"] == 7


def test_cuda_graphs_without_packing_is_refused_in_one_line():
    with pytest.raises(UserError) as e:
        compose(["trainer.cuda_graphs=true", "trainer.packing=false"])
    assert str(e.value) == (
        "invalid configuration: trainer.cuda_graphs=true needs trainer.packing=true (the "
        "whole step is captured over the one static shape of packed batches); set "
        "trainer.packing=true, or trainer.cuda_graphs=false")
    compose(["trainer.cuda_graphs=true", "trainer.packing=true"])


def test_cuda_graphs_with_fp16_is_refused_in_one_line():
    t_cfg = TrainerConfig(packing=True, cuda_graphs=True)
    with pytest.raises(ConfigError, match=r"^trainer\.cuda_graphs=true does not take "
                                          r"precision fp16"):
        check_whole_step(t_cfg, "fp16")
    check_whole_step(t_cfg, "bf16")
    check_whole_step(TrainerConfig(packing=True), "fp16")  # off: nothing to refuse


# ------------------------------------------------------------------ several ranks (gloo)


RANK_RUNS = {"eager": ("eager", None, "none"), "aot_eager": ("aot_eager", None, "none"),
             "nan": ("eager", 2, "none"), "bf16": ("eager", None, "bf16")}
"""The two-rank runs of :func:`_ranks_worker`: name -> (backend, step of rank 1's NaN,
gradient compression)."""


def _ranks_worker(rank: int, port: int, out_dir: str, batches, steps: int) -> None:
    """One of two gloo ranks; for each of :data:`RANK_RUNS` from a fresh model: ``steps``
    whole steps of one micro-batch each (this rank's ``batches[2k + rank]``, flags
    ``[rank == 0, rank == 1]``), each launched before the one before is read, rank 1's loss
    NaN in the run's NaN step (1-based). Saves the figures, whether each launch changed the
    parameters, and the parameters and Adam state."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    real_loss, real_all_reduce, collectives = (loss_module.label_smoothed_nll_loss,
                                               funcol.all_reduce, [])

    def all_reduce(*args, **kwargs):
        collectives.append((args[0].numel(), str(args[0].dtype)))
        return real_all_reduce(*args, **kwargs)

    try:
        for name, (backend, nan_step, compression) in RANK_RUNS.items():
            calls = []

            def loss(logits, target, epsilon, ignore_index=0, _nan=nan_step, _calls=calls):
                _calls.append(1)
                value, nll = real_loss(logits, target, epsilon, ignore_index)
                return (value * float("nan"), nll) if len(_calls) == _nan else (value, nll)

            loss_module.label_smoothed_nll_loss = loss if rank == 1 and nan_step else real_loss
            # collectives counted in the eager runs (a counter in the graph would recompile it)
            funcol.all_reduce = all_reduce if backend == "eager" else real_all_reduce
            t_cfg = dataclasses.replace(T_CFG, update_freq=1)
            run = _Run(_model(), t_cfg)
            shape = tuple(batches[0].src_tokens.shape)
            whole = WholeStep(run.model, run.optimizer, run.scheduler, t_cfg, shape, CPU,
                              compile=backend != "eager", backend=backend,
                              grad_compression=compression)
            state, pending, changed, figures = TrainState(), None, [], []
            collectives.clear()
            for k in range(steps):
                before = _snapshot(run.model, run.optimizer)
                queued = whole.launch([batches[2 * k + rank]], [int(rank == 0), int(rank == 1)],
                                      follows_unread=pending is not None)
                changed.append(not _same(before, _snapshot(run.model, run.optimizer)))
                if pending is not None:
                    figures.append(finish_update(run, state, Window(), pending, t_cfg,
                                                 Path(out_dir)))
                pending = queued
            figures.append(finish_update(run, state, Window(), pending, t_cfg, Path(out_dir)))
            torch.save({"changed": changed, "figures": [dataclasses.asdict(f) for f in figures],
                        "params": {n: p.detach().clone() for n, p in run.model.named_parameters()},
                        "state": [{k: v.clone() for k, v in run.optimizer.state[p].items()}
                                  for p in run.params], "step": state.step,
                        "collectives": list(collectives)},
                       os.path.join(out_dir, f"{name}-{rank}.pt"))
    finally:
        loss_module.label_smoothed_nll_loss, funcol.all_reduce = real_loss, real_all_reduce
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(packed_batches, tmp_path_factory) -> dict[str, list[dict]]:
    """What :func:`_ranks_worker` saved on each of two spawned gloo ranks, by run name
    (three steps each)."""
    import socket

    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ranks")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_ranks_worker, args=(port, str(out), packed_batches[0], 3), nprocs=2)
    return {name: [torch.load(out / f"{name}-{rank}.pt") for rank in (0, 1)]
            for name in RANK_RUNS}


def _one_process(batches, steps: int, tmp_path) -> tuple[_Run, list]:
    """The whole step on one process over both ranks' micro-batches (update_freq 2)."""
    run = _Run(_model(), T_CFG)
    whole = _whole(run, batches[0].src_tokens.shape)
    state, pending, figures = TrainState(), None, []
    for k in range(steps):
        queued = whole.launch(batches[2 * k:2 * k + 2], [1, 1], follows_unread=pending is not None)
        if pending is not None:
            figures.append(finish_update(run, state, Window(), pending, T_CFG, tmp_path))
        pending = queued
    figures.append(finish_update(run, state, Window(), pending, T_CFG, tmp_path))
    return run, figures


def _assert_ranks_agree(ranks: list[dict]) -> None:
    """Both ranks hold the same parameters and Adam state, bit for bit, and read the same
    figures."""
    a, b = ranks
    for name, value in a["params"].items():
        assert torch.equal(value, b["params"][name]), name
    for sa, sb in zip(a["state"], b["state"], strict=True):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert repr(a["figures"]) == repr(b["figures"]) and a["changed"] == b["changed"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_two_ranks_take_the_step_of_one_process_with_both_micro_batches(
        packed_batches, two_ranks, tmp_path, backend):
    """Two gloo ranks, one micro-batch each, three whole steps (eager, and compiled with
    aot_eager): the parameters and Adam moments of one process with both micro-batches per
    step (update_freq 2) to 1e-5, the same on both ranks bit for bit; the figures are the
    global ones (tokens, loss and NLL sums, the flags summed over the ranks)."""
    batches, _ = packed_batches
    ranks = two_ranks[backend]
    _assert_ranks_agree(ranks)
    one, figures = _one_process(batches, 3, tmp_path)
    assert ranks[0]["step"] == 3 and ranks[0]["changed"] == [True, True, True]
    if backend == "eager":  # two all-reduces a step: counts and flags; gradients and losses
        n_params = sum(p.numel() for p in one.model.parameters())
        assert ranks[0]["collectives"] == [(5 + 2, "torch.float64"),
                                           (n_params + 2, "torch.float32")] * 3
    for got, want in zip(ranks[0]["figures"], figures, strict=True):
        assert got["ntokens"] == want.ntokens and got["flags"] == want.flags == [1, 1]
        assert got["loss_sum"] == pytest.approx(want.loss_sum, rel=1e-5)
        assert got["nll_sum"] == pytest.approx(want.nll_sum, rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want.grad_norm, rel=1e-5)
        assert got["lr"] == want.lr
    for (name, p), state in zip(one.model.named_parameters(), ranks[0]["state"], strict=True):
        mine = one.optimizer.state[p]
        real = mine["exp_avg_sq"] > 1e-16  # the key biases' noise left out (test above)
        torch.testing.assert_close(ranks[0]["params"][name][real], p.detach()[real],
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state["exp_avg"], mine["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(state["exp_avg_sq"], mine["exp_avg_sq"], rtol=1e-5,
                                   atol=1e-9)


def test_a_non_finite_gradient_on_one_rank_skips_the_step_on_both(two_ranks):
    """Rank 1's loss is NaN in step 2 of 3: both ranks leave their parameters and Adam state
    as they were in that step, count it skipped, and stay identical."""
    ranks = two_ranks["nan"]
    _assert_ranks_agree(ranks)
    for r in ranks:
        assert r["changed"] == [True, False, True] and r["step"] == 2
        assert [f["stepped"] for f in r["figures"]] == [True, False, True]


def test_bf16_compression_sends_the_gradients_in_bf16_and_the_sums_in_float32(two_ranks):
    """grad_compression bf16 on two ranks: per step the counts and flags (float64), the
    gradients (bf16) and the loss and NLL sums (float32) are all-reduced; both ranks stay
    identical; the first step's gradient norm is the uncompressed run's to bf16's rounding,
    and Adam's first moments (sums of the gradients) stay close to its (the parameters do
    not: Adam moves a parameter by about the learning rate whatever its gradient's size, so
    rounding noise of near-zero gradients moves them as much as real ones)."""
    ranks, exact = two_ranks["bf16"], two_ranks["eager"][0]
    _assert_ranks_agree(ranks)
    n_params = sum(p.numel() for p in exact["params"].values())
    assert ranks[0]["collectives"] == [(7, "torch.float64"), (n_params, "torch.bfloat16"),
                                       (2, "torch.float32")] * 3
    assert ranks[0]["step"] == 3
    assert [f["loss_sum"] for f in ranks[0]["figures"]][0] == exact["figures"][0]["loss_sum"]
    got = torch.cat([state["exp_avg"].reshape(-1) for state in ranks[0]["state"]])
    want = torch.cat([state["exp_avg"].reshape(-1) for state in exact["state"]])
    assert not torch.equal(got, want)  # compressed
    torch.testing.assert_close(got, want, rtol=2**-6, atol=float(want.abs().max()) * 2**-5)
    first, first_exact = ranks[0]["figures"][0], exact["figures"][0]  # from equal parameters
    assert first["grad_norm"] != first_exact["grad_norm"]
    assert first["grad_norm"] == pytest.approx(first_exact["grad_norm"], rel=2**-7)
