"""Data parallelism on CPU (gloo): collectives, bf16 gradient compression and the DDP settings (two
ranks against one process: tests/scenario/test_data_parallel.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from transformer_nmt.checkpoint import latest_checkpoint, load_checkpoint
from transformer_nmt.train import distributed

TRAINER = [
    "model.dropout=0.0",
    "trainer.warmup_steps=8", "trainer.lr_multiplier=1.0", "trainer.save_every_minutes=null",
    "trainer.validate_every_steps=null", "trainer.log_every_steps=5", "trainer.num_workers=0",
]


@pytest.fixture(scope="module")
def data_overrides(synthetic_corpus) -> list[str]:
    """The default experiment on the prepared synthetic reversal corpus."""
    return ["experiment=multi30k_en_de", *synthetic_corpus.overrides]


def _run(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(args, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{args[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_single_process_helpers_are_no_ops(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    info = distributed.init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.is_main, info.distributed) == (0, 1, True, False)
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.all_gather_object(3) == [3]
    distributed.barrier()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2"):
        distributed.init_distributed(device="cpu")


def _without_key_bias(key: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` with the key projection's bias zeroed (``in_proj.bias[d:2d]``,
    ``kv_proj.bias[:d]``). Softmax is invariant to it, so its exact gradient is zero: what
    it gets is round-off, which Adam scales up to learning-rate-sized steps of any sign, and
    a run summing its gradients in another order drifts there (by about 0.05 after 11 steps
    of the 4-rank test) while every other parameter agrees to 1e-5."""
    if key.endswith(("in_proj.bias", "kv_proj.bias")):
        d = value.shape[0] // (3 if key.endswith("in_proj.bias") else 2)
        start = d if key.endswith("in_proj.bias") else 0
        value = value.clone()
        value[start:start + d] = 0
    return value


def assert_same_training(ddp_dir: Path, one_dir: Path, max_steps: int, world_size: int) -> None:
    """The run in ``ddp_dir`` (``world_size`` ranks) trained the same model as the one process
    in ``one_dir``: the same steps, tokens and epochs, parameters and Adam moments equal to
    float32 round-off, every rank's RNG state kept."""
    ddp = json.loads((ddp_dir / "train_summary.json").read_text())
    one = json.loads((one_dir / "train_summary.json").read_text())
    assert ddp["world_size"] == world_size and one["world_size"] == 1
    assert ddp["steps"] == one["steps"] == max_steps
    assert ddp["tokens_seen"] == one["tokens_seen"] > 0
    assert ddp["epochs"] == pytest.approx(one["epochs"]) and ddp["epochs"] > 1

    a = load_checkpoint(latest_checkpoint(ddp_dir))
    b = load_checkpoint(latest_checkpoint(one_dir))
    assert a["train_state"]["step"] == b["train_state"]["step"] == max_steps
    assert len(a["rng"]) == world_size and len(b["rng"]) == 1  # every rank's RNG state is kept
    for key, value in a["model"].items():
        value, other = _without_key_bias(key, value), _without_key_bias(key, b["model"][key])
        assert torch.allclose(value, other, rtol=1e-4, atol=1e-5), (
            f"{key}: max difference {(value - other).abs().max().item():.3g}"
        )
    exp_a = a["optimizer"]["state"]
    exp_b = b["optimizer"]["state"]
    for k in exp_a:
        assert torch.allclose(exp_a[k]["exp_avg"], exp_b[k]["exp_avg"], rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------- gradient all-reduce, update


def _bf16_hook_worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: the tiny model's gradient of one batch, all-reduced by DDP's bf16 hook (as
    DDP calls it on a bucket) and by the float32 all-reduce."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from transformer_nmt.config import ModelConfig
    from transformer_nmt.model.transformer import Transformer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = Transformer(ModelConfig(name="t", encoder_layers=1, decoder_layers=1,
                                        d_model=16, d_ff=32, heads=2), vocab_size=40)
        torch.manual_seed(1 + rank)  # each rank its own batch
        src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 6))
        model(src, tgt).logsumexp(-1).sum().backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # the bucket

        class Bucket:  # what DDP hands a communication hook
            def buffer(self):
                return grad.clone()

        compressed = default_hooks.bf16_compress_hook(None, Bucket()).wait()
        exact = grad.clone()
        dist.all_reduce(exact)
        exact /= 2
        torch.save({"bf16": compressed, "fp32": exact}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_gets_the_bucket_size_and_the_bf16_hook(monkeypatch):
    """What wrap_model asks of DDP (a stand-in: the real one refuses the bf16 hook off NCCL),
    and when the hook is on: auto means across nodes on CUDA."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from transformer_nmt.config import ModelConfig
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.train.setup import resolve_grad_compression, wrap_model

    made = []

    class StandInDDP(torch.nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            self.module, self.kwargs, self.hooks = module, kwargs, []
            made.append(self)

        def register_comm_hook(self, state, hook):
            self.hooks.append(hook)

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", StandInDDP)
    info = type("Info", (), {"distributed": True, "local_rank": 0})()
    model = Transformer(ModelConfig(name="t", encoder_layers=1, decoder_layers=1, d_model=16,
                                    d_ff=32, heads=2), vocab_size=40)
    wrap_model(model, info, compile=False, grad_compression="bf16", bucket_cap_mb=50.0)
    wrap_model(model, info, compile=False)
    assert made[0].kwargs["bucket_cap_mb"] == 50.0 and made[0].kwargs["gradient_as_bucket_view"]
    assert made[0].hooks == [default_hooks.bf16_compress_hook] and made[1].hooks == []

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    two_nodes = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    assert resolve_grad_compression("auto", cuda, two_nodes) == "bf16"
    assert resolve_grad_compression("auto", cuda, {"WORLD_SIZE": "8",
                                                   "LOCAL_WORLD_SIZE": "8"}) == "none"
    assert resolve_grad_compression("auto", cpu, two_nodes) == "none"
    assert resolve_grad_compression("none", cuda, two_nodes) == "none"
    with pytest.raises(ValueError, match="grad_compression=bf16 needs CUDA"):
        resolve_grad_compression("bf16", cpu, {})


@pytest.mark.parametrize("grads_in_buckets", [False, True])
def test_update_leaves_gradients_alone_without_clipping_and_zeroes_bucket_views(grads_in_buckets):
    """clip_norm 0: the norm is read, the gradients are not multiplied (by 1, as
    clip_grad_norm_ does); after the update DDP's bucket views are zeroed in place, not
    dropped (set_to_none would detach them from the buckets)."""
    from types import SimpleNamespace

    from transformer_nmt.config import TrainerConfig
    from transformer_nmt.runtime import grad_scaler
    from transformer_nmt.train.metrics import Window
    from transformer_nmt.train.state import TrainState
    from transformer_nmt.train.step import apply_update, grad_norm_

    model = torch.nn.Linear(3, 2)
    model(torch.ones(4, 3)).sum().backward()
    params = list(model.parameters())
    versions = [p.grad._version for p in params]
    norm = grad_norm_(params, 0.0)
    assert [p.grad._version for p in params] == versions  # not written
    whole = torch.cat([p.grad.reshape(-1) for p in params])
    assert norm.item() == pytest.approx(whole.norm().item())
    grad_norm_(params, 1e-3)
    assert [p.grad._version for p in params] != versions  # clipping does write

    optimizer = torch.optim.SGD(params, lr=0.1)
    grads = [p.grad for p in params]
    s = SimpleNamespace(scaler=grad_scaler(False), optimizer=optimizer, params=params,
                        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0),
                        device=torch.device("cpu"), grads_in_buckets=grads_in_buckets)
    out = {"counts": torch.tensor([4.0, 4, 4, 4, 4], dtype=torch.float64),
           "loss_sum": torch.tensor(1.0), "nll_sum": torch.tensor(1.0)}
    _, _, stepped = apply_update(s, TrainState(world_size=1), Window(), out, TrainerConfig(),
                                 Path("."), flags=[0, 1])
    assert stepped and out["flags"] == [0, 1]
    if grads_in_buckets:
        assert all(p.grad is g and not g.any() for p, g in zip(params, grads))
    else:
        assert all(p.grad is None for p in params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ddp_on_nccl_takes_the_bf16_hook_and_one_step_matches_uncompressed(monkeypatch):
    """One NCCL process: DDP accepts the bf16 hook, and a step with it gives the gradient of
    the uncompressed step to bf16 precision."""
    import socket

    import torch.distributed as dist

    from transformer_nmt.config import ModelConfig
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.train.setup import wrap_model

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        info = type("Info", (), {"distributed": True, "local_rank": 0})()
        grads = {}
        for compression in ("none", "bf16"):
            torch.manual_seed(0)
            model = Transformer(ModelConfig(name="t", encoder_layers=1, decoder_layers=1,
                                            d_model=64, d_ff=128, heads=4), vocab_size=300).cuda()
            ddp = wrap_model(model, info, compile=False, grad_compression=compression)
            torch.manual_seed(1)
            src = torch.randint(4, 300, (8, 12), device="cuda")
            tgt = torch.randint(4, 300, (8, 10), device="cuda")
            ddp(src, tgt).logsumexp(-1).sum().backward()
            grads[compression] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        scale = float(grads["none"].abs().max())
        torch.testing.assert_close(grads["bf16"], grads["none"], rtol=2**-7, atol=scale * 2**-8)
    finally:
        dist.destroy_process_group()
