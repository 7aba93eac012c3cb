"""Time our training step in-process on real batches, Adam variants interleaved.

One model per variant (identical initial weights), stepped in turn on the same real
Multi30k batches with the training loop's own pieces (``train_step.forward_backward``: forward,
label-smoothed loss, backward; clipping; the optimizer step), so that the variants share
every moment's machine state; on a shared VM this is the fair way to compare two versions
of a step. Variants: ``default`` (``torch.optim.Adam`` as PyTorch picks it on CPU, the
per-tensor loop) and ``fused`` (``optim.build_optimizer``, what training uses).

Example::

    python scripts/micro/bench_step.py --max-tokens 1024 --steps 80 --threads 2

Prints the median step time and the median optimizer time of each variant (the first
``--skip`` steps left out). Needs the prepared Multi30k data (``make data``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler, collate
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.train.data import load_split
from transformer_nmt.train.optim import build_optimizer
from transformer_nmt.train.step import forward_backward


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experiment", default="multi30k_en_de")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--steps", type=int, default=80, help="steps per variant")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    cfg = compose([f"experiment={args.experiment}"])
    data = load_split(cfg, cfg.data.train_split)
    sampler = LengthBucketSampler(data.src_sizes, data.tgt_sizes, args.max_tokens,
                                  shuffle=True, seed=1)
    batches = [collate([data[j] for j in b]) for b, _ in zip(sampler, range(args.steps))]
    torch.manual_seed(0)
    base = Transformer(cfg.model, vocab_size=cfg.data.vocab_size).train()
    default_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    betas = tuple(float(b) for b in cfg.trainer.adam_betas)
    variants = {
        "default": (default_model, torch.optim.Adam(
            default_model.parameters(), lr=1.0, betas=betas, eps=float(cfg.trainer.adam_eps))),
        "fused": (fused_model, build_optimizer(fused_model, cfg.trainer)),
    }
    for _, opt in variants.values():
        for group in opt.param_groups:
            group["lr"] = 5e-4  # a constant rate: the schedule is not what is timed
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    epsilon = float(cfg.trainer.label_smoothing)
    cpu = torch.device("cpu")
    for i, batch in enumerate(batches):
        order = list(variants.items())
        for name, (model, opt) in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            forward_backward(model, [batch], epsilon=epsilon, device=cpu, world_size=1)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt_start = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end = time.perf_counter()
            times[name].append((end - start, end - opt_start))
    tokens = statistics.median(int(b.ntokens) for b in batches)
    print(f"{args.experiment}, max_tokens {args.max_tokens}, {len(batches)} batches "
          f"(median {tokens} target tokens), {torch.get_num_threads()} threads")
    for name, ts in times.items():
        ts = ts[args.skip:]
        step = statistics.median(t for t, _ in ts)
        optim = statistics.median(o for _, o in ts)
        print(f"Adam {name}: median step {step * 1e3:.0f} ms, optimizer {optim * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
