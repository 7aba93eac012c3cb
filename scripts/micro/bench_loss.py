"""Bytes and time of one label-smoothed loss call (forward + backward) over (N, V) logits.

Compares ``current`` (``transformer_nmt.train.loss.label_smoothed_nll_loss``, what training
uses) with ``previous`` (:class:`PreviousLoss`, the version before it: a float32 (N, V)
log-softmax kept for the backward). Each variant runs in its own fresh process:

- **peak bytes**: on CPU the growth of the process's peak resident memory
  (``ru_maxrss``) during the first call, after the logits were made (what the call itself
  allocates at its peak: float32 copies, saved tensors, the gradient); on CUDA
  ``torch.cuda.max_memory_allocated`` above the memory allocated before the call;
- **time**: the median of ``--repeats`` further calls (CUDA: synchronised).

Example::

    python scripts/micro/bench_loss.py --n 3100 --vocab 37000 --dtype bf16 --repeats 5 --threads 2

Prints one JSON line per variant and round (and writes them to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from transformer_nmt.train.loss import label_smoothed_nll_loss


class PreviousLoss(torch.autograd.Function):
    """The label-smoothed loss as it was before the chunked and fused versions (kept for this
    comparison and for tests/unit/train/test_loss.py): float32 log-softmax of all (N, V) logits,
    saved for an analytic backward that turns it into the gradient in place."""

    @staticmethod
    def forward(ctx, logits, target, epsilon):  # type: ignore[override]
        vocab = logits.size(-1)
        lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V) float32
        nll_sum = -lprobs.gather(dim=-1, index=target.unsqueeze(-1)).squeeze(-1).sum()
        loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * (-lprobs.sum(dim=-1)).sum()
        ctx.save_for_backward(lprobs, target)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):  # type: ignore[override]
        lprobs, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.size(-1)
        grad = lprobs.exp_().mul_(g_loss + g_nll)
        grad.sub_(g_loss * (eps / vocab))
        at_target = -(g_loss * (1.0 - eps) + g_nll)
        grad.scatter_add_(-1, target.unsqueeze(-1),
                          at_target.expand(target.size(0), 1).contiguous())
        return grad.to(ctx.logits_dtype), None, None


def previous_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float):
    """``(loss_sum, nll_sum)`` of :class:`PreviousLoss` (every target a real token)."""
    return PreviousLoss.apply(logits, target, float(epsilon))


VARIANTS = {"current": lambda x, t: label_smoothed_nll_loss(x, t, 0.1, ignore_index=None),
            "previous": lambda x, t: previous_loss(x, t, 0.1)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _call(fn, logits: torch.Tensor, target: torch.Tensor) -> None:
    x = logits.detach().requires_grad_()
    loss, _ = fn(x, target)
    loss.backward()  # as training calls it: the NLL is a figure, not a gradient
    assert x.grad is not None


def measure(variant: str, n: int, vocab: int, dtype: str, device: str, repeats: int,
            fn=None) -> dict:
    """Peak bytes and median seconds of one forward + backward of ``variant`` (this process);
    ``fn(logits, target)``: the loss to measure under that name instead of ``VARIANTS``'."""
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    # made in slices, so that making them does not raise the peak the call is measured by
    logits = torch.empty(n, vocab, dtype=DTYPES[dtype], device=dev)
    for a in range(0, n, 64):
        rows = logits[a:a + 64]
        rows.copy_(torch.randn(rows.shape, generator=g) * 3)
    target = torch.randint(4, vocab, (n,), generator=g).to(dev)
    fn = fn or VARIANTS[variant]
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _call(fn, logits, target)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        _call(fn, logits, target)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        _call(fn, logits, target)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"variant": variant, "n": n, "vocab": vocab, "dtype": dtype, "device": device,
            "threads": torch.get_num_threads(), "peak_bytes": int(peak),
            "peak_bytes_per_element": round(peak / (n * vocab), 2),
            "seconds_median": round(statistics.median(times), 7), "repeats": repeats}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=3100, help="real target tokens (rows)")
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1,
                   help="fresh processes per variant, alternating which runs first")
    p.add_argument("--variant", choices=sorted(VARIANTS), help="measure one variant here")
    p.add_argument("--out", help="also write the JSON lines to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.variant:
        print(json.dumps(measure(args.variant, args.n, args.vocab, args.dtype, args.device,
                                 args.repeats)))
        return
    lines = []
    order = ("previous", "current")
    # each call in a fresh process (its own peak memory); rounds alternate which goes first
    for variant in (v for r in range(args.rounds) for v in (order if r % 2 == 0 else order[::-1])):
        cmd = [sys.executable, __file__, "--variant", variant, "--n", str(args.n),
               "--vocab", str(args.vocab), "--dtype", args.dtype, "--device", args.device,
               "--repeats", str(args.repeats), "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        lines.append(out.strip().splitlines()[-1])
        print(lines[-1], flush=True)
    if args.out:
        from transformer_nmt.fileio import atomic_write

        with atomic_write(args.out) as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
