"""Two step-level checks of ``make gpu-check`` (scripts/cluster/gpu_check.py), written as plain
functions of a run's overrides and a device so that a CPU test runs the same logic
(tests/scenario/test_gpu_check_steps.py):

- :func:`compiled_matches_eager`: the training model eager and compiled (``torch.compile``
  with the given backend, as the run wraps it) take the same optimizer steps on the same
  batches, from the same initial weights with dropout off, through the training step's own
  functions; their losses must agree within :data:`COMPILE_RTOL` of the precision;
- :func:`resume_continues_curve`: a run trained N + M steps without a stop, and a second run
  resumed from the first one's checkpoint at step N and trained to N + M: the M losses after
  the resume must agree within :data:`RESUME_RTOL` (fp32: exactly, with the deterministic
  algorithms on; bf16: nondeterministic attention backward kernels may move the later steps by
  a rounding), and the first step after the resume exactly in every precision (its forward
  depends only on the restored weights, data position and RNG states).

- :func:`graphed_matches_eager`: the eager packed step and the whole step of
  ``trainer.cuda_graphs`` (a CUDA graph on CUDA) from the same state give the same
  parameters within :data:`GRAPHED_RTOL`.

Each returns a dict of figures with ``passed`` (bool) and ``why`` (empty when passed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

COMPILE_RTOL = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""Relative tolerance between the eager and the compiled loss of each step. fp32: the compiler
fuses and reorders reductions (layer norm, softmax, the loss's sums), last-bit differences
that three Adam updates cannot grow past 1e-4. bf16 / fp16: eager rounds every op's result to
16 bits (relative 2^-8 for bf16), the compiled kernels keep fp32 inside a fused kernel; 2 %
still catches a changed formula or a wrong graph."""

RESUME_RTOL = {"fp32": 0.0, "bf16": 5e-3, "fp16": 5e-3}
"""Relative tolerance between the resumed and the uninterrupted run's loss at each step after
the resume. fp32 runs with ``torch.use_deterministic_algorithms`` and must repeat exactly;
bf16 / fp16 attention backward kernels accumulate in a nondeterministic order, so steps after
the first resumed one may differ by about one 16-bit rounding (2^-8 = 3.9e-3)."""

NO_DROPOUT = ("model.dropout=0.0", "model.attention_dropout=0.0",
              "model.activation_dropout=0.0")
"""Dropout draws from different generators eager and compiled: off for that comparison."""


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compiled_matches_eager(overrides: list[str], device: str, *, precision: str = "fp32",
                           backend: str = "inductor", steps: int = 3) -> dict[str, Any]:
    """Eager and compiled training steps on the same batches.

    Builds the run of ``overrides`` twice on ``device`` (:func:`transformer_nmt.train.setup.
    setup`, one process; the same seed gives the same weights and batches), once eager and once
    compiled with ``backend``, with dropout off and ``trainer.precision=precision``, and takes
    ``steps`` optimizer steps with the training step's functions (forward_backward,
    queue_update, finish_update).

    Returns:
        ``{"precision", "backend", "eager_losses", "compiled_losses", "max_rel_diff",
        "rtol", "grad_norm_rel_diff", "passed", "why"}``; losses are nats per target token.
    """
    from transformer_nmt.config import compose
    from transformer_nmt.train import distributed
    from transformer_nmt.train.metrics import Window
    from transformer_nmt.train.setup import setup, wrap_model
    from transformer_nmt.train.state import TrainState
    from transformer_nmt.train.step import finish_update, forward_backward, queue_update

    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0,
                                device=torch.device(device))
    figures: dict[str, list[tuple[float, float]]] = {}
    for mode in ("eager", "compiled"):
        cfg = compose([*overrides, *NO_DROPOUT, f"trainer.precision={precision}",
                       "trainer.compile=false", "trainer.num_workers=0"])
        torch._dynamo.reset()
        run = setup(cfg, info)
        if mode == "compiled":
            run.train_model = wrap_model(run.model, info, compile=True, backend=backend)
        batches = iter(run.train_loader)
        state, out_figs = TrainState(), []
        for _ in range(steps):
            out = forward_backward(run.train_model, [next(batches)],
                                   epsilon=float(cfg.trainer.label_smoothing),
                                   device=run.device, world_size=1, autocast=run.autocast,
                                   scaler=run.scaler, pad_to_multiple=run.pad_to_multiple)
            fig = finish_update(run, state, Window(), queue_update(run, out, cfg.trainer),
                                cfg.trainer, Path(cfg.run_dir))
            out_figs.append((fig.loss_sum / max(fig.ntokens, 1), fig.grad_norm))
        figures[mode] = out_figs
        del run, batches
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    torch._dynamo.reset()
    eager = [loss for loss, _ in figures["eager"]]
    compiled = [loss for loss, _ in figures["compiled"]]
    diff = max(_rel(c, e) for c, e in zip(compiled, eager))
    gdiff = max(_rel(c, e) for (_, c), (_, e) in zip(figures["compiled"], figures["eager"]))
    rtol = COMPILE_RTOL[precision]
    finite = all(map(_finite, eager + compiled))
    passed = finite and diff <= rtol
    why = "" if passed else (f"eager {eager} vs compiled {compiled}: relative difference "
                             f"{diff:.2e} > {rtol:g}" if finite else "a non-finite loss")
    return {"precision": precision, "backend": backend, "eager_losses": eager,
            "compiled_losses": compiled, "max_rel_diff": diff, "rtol": rtol,
            "grad_norm_rel_diff": gdiff, "passed": passed, "why": why}


GRAPHED_RTOL = {"fp32": 1e-4, "bf16": 2e-2}
"""Relative tolerance between the eager step's and the whole step's (``trainer.cuda_graphs``)
parameters after the steps, measured as the relative L2 distance over the entries with a real
gradient (the eager Adam second moment above 1e-16: the key biases' gradient is rounding
noise of an exact zero, which Adam magnifies to about the learning rate in either path, so
they are left out). fp32: the compiled step fuses and reorders reductions; bf16: the
compiled kernels keep fp32 inside fused kernels where eager rounds each result to 16 bits
(2^-8 relative per rounding), 2 % as for the compiled losses."""


def graphed_matches_eager(overrides: list[str], device: str, *, precision: str = "fp32",
                          compile: bool = True, steps: int = 3) -> dict[str, Any]:
    """The eager packed step and the whole step (``trainer.cuda_graphs``: on CUDA with
    ``compile`` a CUDA graph, elsewhere compiled or eager) from the same weights, dropout off,
    on the same packed batches: their parameters after ``steps`` steps must agree within
    :data:`GRAPHED_RTOL` (relative L2 distance over the entries with a real gradient) and
    their losses too.

    Returns:
        ``{"precision", "compile", "eager_losses", "graphed_losses", "param_rel_diff",
        "rtol", "passed", "why"}``.
    """
    from transformer_nmt.config import compose
    from transformer_nmt.train import distributed
    from transformer_nmt.train.metrics import Window
    from transformer_nmt.train.setup import setup
    from transformer_nmt.train.state import TrainState
    from transformer_nmt.train.step import finish_update, forward_backward, queue_update
    from transformer_nmt.train.whole_step import build_whole_step

    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0,
                                device=torch.device(device))
    losses: dict[str, list[float]] = {}
    params: dict[str, list[torch.Tensor]] = {}
    real: list[torch.Tensor] = []
    for mode in ("eager", "graphed"):
        cfg = compose([*overrides, *NO_DROPOUT, f"trainer.precision={precision}",
                       "trainer.packing=true", f"trainer.compile={str(compile).lower()}",
                       f"trainer.cuda_graphs={str(mode == 'graphed').lower()}",
                       "trainer.num_workers=0", "trainer.update_freq=1"])
        torch._dynamo.reset()
        run = setup(cfg, info)
        whole = build_whole_step(run, cfg.trainer) if mode == "graphed" else None
        batches, state, figs = iter(run.train_loader), TrainState(), []
        for _ in range(steps):
            micro = [next(batches)]
            if whole is not None:
                pending = whole.launch(micro)
            else:
                out = forward_backward(run.train_model, micro,
                                       epsilon=float(cfg.trainer.label_smoothing),
                                       device=run.device, world_size=1, autocast=run.autocast,
                                       scaler=run.scaler, packed_shape=run.packed_shape)
                pending = queue_update(run, out, cfg.trainer)
            fig = finish_update(run, state, Window(), pending, cfg.trainer, Path(cfg.run_dir))
            figs.append(fig.loss_sum / max(fig.ntokens, 1))
        losses[mode] = figs
        params[mode] = [p.detach().float().cpu() for p in run.model.parameters()]
        if mode == "eager":  # entries with a real gradient: second moment above 1e-16
            real = [run.optimizer.state[p]["exp_avg_sq"].cpu().gt(1e-16).flatten()
                    for p in run.model.parameters()]
        del run, batches, whole
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    torch._dynamo.reset()
    keep = torch.cat(real)
    a = torch.cat([p.flatten() for p in params["graphed"]])[keep]
    b = torch.cat([p.flatten() for p in params["eager"]])[keep]
    diff = float((a - b).norm() / b.norm().clamp(min=1e-12))
    ldiff = max(_rel(g, e) for g, e in zip(losses["graphed"], losses["eager"]))
    rtol = GRAPHED_RTOL[precision]
    finite = all(map(_finite, losses["eager"] + losses["graphed"] + [diff]))
    passed = finite and diff <= rtol and ldiff <= rtol
    why = "" if passed else (
        f"parameters {diff:.2e}, losses {ldiff:.2e} relative difference (> {rtol:g}): eager "
        f"{losses['eager']} vs graphed {losses['graphed']}" if finite else "a non-finite value")
    return {"precision": precision, "compile": compile, "eager_losses": losses["eager"],
            "graphed_losses": losses["graphed"], "param_rel_diff": diff, "rtol": rtol,
            "passed": passed, "why": why}


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


@contextlib.contextmanager
def _deterministic(on: bool):
    """``torch.use_deterministic_algorithms`` (warn-only: a kernel without a deterministic
    version warns in the log instead of failing) while the block runs."""
    before = torch.are_deterministic_algorithms_enabled()
    before_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=before_warn)


def resume_continues_curve(overrides: list[str], work: Path, device: str, *,
                           precision: str = "fp32", n: int = 20, m: int = 10) -> dict[str, Any]:
    """An uninterrupted run of ``n + m`` steps against a run resumed from its checkpoint at
    step ``n`` (copied into a run directory of its own) and trained to ``n + m``.

    Both train with :func:`transformer_nmt.train.loop.train` in this process, on the device it
    picks (CUDA when present), which must be ``device``; ``trainer.precision=precision``, a
    train line every step, no validation in between. fp32 runs with the deterministic
    algorithms on (:data:`RESUME_RTOL`).

    Returns:
        ``{"precision", "n", "m", "uninterrupted", "resumed" (the m losses after step n),
        "first_step_exact", "max_rel_diff", "rtol", "passed", "why"}``.

    Raises:
        ValueError: the training runs on another device than ``device``.
    """
    from transformer_nmt.checkpoint import checkpoint_dir
    from transformer_nmt.config import compose
    from transformer_nmt.train.loop import train

    work = Path(work)
    common = [*overrides, f"trainer.precision={precision}", f"trainer.max_steps={n + m}",
              f"trainer.save_every_steps={n}", "trainer.keep_last=10",
              "trainer.save_every_minutes=null", "trainer.max_time_minutes=null",
              "trainer.log_every_steps=1", "trainer.validate_every_steps=null",
              "trainer.valid_bleu=false"]
    full, resumed = work / "uninterrupted", work / "resumed"
    for d in (full, resumed):
        shutil.rmtree(d, ignore_errors=True)
    picked = "cuda" if torch.cuda.is_available() else "cpu"  # what nmt-train picks
    if torch.device(device).type != picked:
        raise ValueError(f"the runs would train on {picked}, not on {device}")
    with _deterministic(precision == "fp32" and picked == "cuda"):
        train(compose([*common, f"run_dir={full}"]))
        checkpoint_dir(resumed).mkdir(parents=True)
        shutil.copy2(checkpoint_dir(full) / f"checkpoint_{n}.pt",
                     checkpoint_dir(resumed) / f"checkpoint_{n}.pt")
        again = train(compose([*common, f"run_dir={resumed}"]))
    a, b = _losses(full), _losses(resumed)
    after = list(range(n + 1, n + m + 1))
    got, want = [b.get(s, float("nan")) for s in after], [a.get(s, float("nan")) for s in after]
    first_exact = got[0] == want[0]
    diff = max(_rel(x, y) if _finite(x) and _finite(y) else float("inf")
               for x, y in zip(got, want))
    rtol = RESUME_RTOL[precision]
    why = []
    if not again.get("resumed_from") or again.get("steps") != n + m:
        why.append(f"the second run did not resume to step {n + m} ({again.get('steps')})")
    if not first_exact:
        why.append(f"step {n + 1}: resumed loss {got[0]!r} != uninterrupted {want[0]!r}")
    if not diff <= rtol:
        worst = max(range(m), key=lambda i: _rel(got[i], want[i]))
        why.append(f"step {after[worst]}: resumed {got[worst]!r}, uninterrupted "
                   f"{want[worst]!r} (relative {diff:.2e} > {rtol:g})")
    return {"precision": precision, "n": n, "m": m, "uninterrupted": want, "resumed": got,
            "first_step_exact": first_exact, "max_rel_diff": diff, "rtol": rtol,
            "passed": not why, "why": "; ".join(why)}
