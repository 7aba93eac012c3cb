"""Counts of one label-smoothed loss call (``transformer_nmt.train.loss``) that a CPU can take:

- aten operations of forward and backward at (N, V) bf16 logits on the meta device (no memory
  used, any size), counted by a ``TorchDispatchMode``, as the training step calls the loss
  (``ignore_index=None``) and with an ``ignore_index``;
- ``torch._dynamo.explain`` of the loss with the token count marked dynamic (as the training
  step marks it): graphs, graph breaks, and whether N stays symbolic in the graph, without
  and with an ``ignore_index``;
- with ``--inductor``: the kernels Inductor generates for forward and backward (CPU backend,
  the same fusion decisions as on a GPU) and whether any buffer of the logits' size is float32.

Example::

    PYTHONPATH=src .venv/bin/python scripts/micro/count_loss_graph.py \\
        --n 25000 --vocab 37000 --inductor

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_nmt.train.loss import label_smoothed_nll_loss


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(n: int, vocab: int, ignore_index: int | None = None) -> dict[str, int]:
    """aten operations of the forward and of the backward (autograd's own included)."""
    logits = torch.empty(n, vocab, dtype=torch.bfloat16, device="meta", requires_grad=True)
    target = torch.empty(n, dtype=torch.long, device="meta")
    with _CountOps() as fwd:
        loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index)
    with _CountOps() as bwd:
        loss.backward()
    return {"forward": fwd.count, "backward": bwd.count, "total": fwd.count + bwd.count}


def explain(ignore_index: int | None, n: int, vocab: int) -> dict:
    """Graphs and breaks of the loss traced with a dynamic token count ((n, vocab) logits)."""
    logits = torch.randn(n, vocab).bfloat16().requires_grad_()
    target = torch.randint(4, vocab, (n,))
    if ignore_index is not None:
        target[::3] = ignore_index
    torch._dynamo.reset()
    torch._dynamo.maybe_mark_dynamic(logits, 0)
    torch._dynamo.maybe_mark_dynamic(target, 0)
    e = torch._dynamo.explain(label_smoothed_nll_loss)(logits, target, 0.1, ignore_index)
    first = [n.meta["example_value"] for n in e.graphs[0].graph.nodes if n.op == "placeholder"]
    rows = [x.shape[0] for x in first if isinstance(x, torch.Tensor)]
    return {"graphs": e.graph_count, "graph_breaks": e.graph_break_count,
            "n_symbolic": bool(rows) and all(isinstance(r, torch.SymInt) for r in rows),
            "break_reasons": sorted({r.reason.splitlines()[0][:120] for r in e.break_reasons})}


def inductor_kernels(n: int, vocab: int) -> dict:
    """Inductor's generated kernels per pass and the float32 buffers of the logits' size
    ((n, vocab) logits)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(label_smoothed_nll_loss, dynamic=True)
    logits = torch.randn(n, vocab).bfloat16().requires_grad_()
    target = torch.randint(4, vocab, (n,))

    def call():
        loss, _ = compiled(logits, target, 0.1, None)
        loss.backward()

    _, codes = run_and_get_code(call)
    out = []
    for code in codes:
        buffers = re.findall(
            r"empty_strided_cpu\(\((\w+), (\w+)\), \([^)]*\), torch\.(\w+)\)", code)
        out.append({"kernels": len(set(re.findall(r"\b(cpp_fused_\w+) = ", code))),
                    "float32_logit_sized_buffers": sum(1 for _, c, d in buffers
                                                       if c != "1" and d == "float32")})
    return {"passes": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=25_000, help="target tokens (rows of the logits)")
    p.add_argument("--vocab", type=int, default=37_000)
    p.add_argument("--traced-n", type=int, default=300,
                   help="rows of the (traced-n, vocab) logits traced by explain and Inductor")
    p.add_argument("--inductor", action="store_true", help="also compile with Inductor (CPU)")
    args = p.parse_args()
    report = {"n": args.n, "vocab": args.vocab, "aten_ops": aten_ops(args.n, args.vocab),
              "aten_ops_ignore_index": aten_ops(args.n, args.vocab, 0),
              "traced_n": args.traced_n,
              "explain": explain(None, args.traced_n, args.vocab),
              "explain_ignore_index": explain(0, args.traced_n, args.vocab),
              "torch": torch.__version__}
    if args.inductor:
        report["inductor"] = inductor_kernels(args.traced_n, args.vocab)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
