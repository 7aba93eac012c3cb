"""Real (non-pad) tokens per optimizer step for a ``max_tokens`` budget on a synthetic length
distribution standing in for WMT14 (whose text is not needed to choose the presets' budget).

The proxy: source lengths in BPE pieces drawn from a log-normal with mean ``--mean`` and
standard deviation ``--std`` (WMT14 EN-DE: about 23-27 words per sentence, about 30 pieces
with a 37k joint BPE, and a long tail), capped at ``--max-len``; target length = source
length x a log-normal ratio (median ``--ratio-median``, 1 for EN-DE; spread
``--ratio-sigma``). The real sampler
(:class:`transformer_nmt.data.batching.LengthBucketSampler`) batches it and the script prints
the mean real source and target tokens per batch and per step (``--gpus`` x
``--update-freq`` batches) for each budget.

Lengths are padded as on the device that runs: ``--pad-to-multiple 8`` (the default) is the
CUDA padding (``trainer.pad_to_multiple``), 1 the CPU's. ``--target`` adds the
``update_freq`` a run derives for ``--gpus`` and whether the step is within
``--tolerance``; ``--auto-cap`` runs the ``trainer.auto_max_tokens`` search instead, under
that many padded tokens per micro-batch.

    .venv/bin/python scripts/micro/tokens_per_step.py --max-tokens 3125 3500 4000 4096 4500
    .venv/bin/python scripts/micro/tokens_per_step.py --gpus 16 --target 25000 --auto-cap 15872
"""

from __future__ import annotations

import argparse

import numpy as np

from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.errors import UserError
from transformer_nmt.train.batch_size import (
    check_tokens_per_step,
    derive_update_freq,
    search_max_tokens,
)


def synthetic_lengths(n: int, mean: float, std: float, ratio_sigma: float, max_len: int,
                      seed: int, ratio_median: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(n,) source and target piece counts (no eos) of the proxy distribution."""
    rng = np.random.default_rng(seed)
    sigma2 = np.log1p((std / mean) ** 2)
    mu = np.log(mean) - sigma2 / 2
    src = np.clip(np.rint(rng.lognormal(mu, np.sqrt(sigma2), n)), 1, max_len).astype(np.int64)
    ratio = rng.lognormal(np.log(ratio_median), ratio_sigma, n)
    tgt = np.clip(np.rint(src * ratio), 1, max_len).astype(np.int64)
    return src, tgt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[3125, 3500, 4000, 4096, 4500])
    ap.add_argument("--pairs", type=int, default=400_000)
    ap.add_argument("--mean", type=float, default=30.0)
    ap.add_argument("--std", type=float, default=18.0)
    ap.add_argument("--ratio-sigma", type=float, default=0.2)
    ap.add_argument("--ratio-median", type=float, default=1.0,
                    help="median target / source length (1.0: the EN-DE proxy; an EN-FR proxy "
                         "needs its own, e.g. 1.15 for French longer than English: an "
                         "assumption until measured on the prepared corpus)")
    ap.add_argument("--max-len", type=int, default=250)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--update-freq", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pad-to-multiple", type=int, default=8,
                    help="lengths padded to a multiple of this (8: CUDA, 1: CPU)")
    ap.add_argument("--target", type=float, default=None,
                    help="trainer.tokens_per_step: derive update_freq for --gpus")
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--auto-cap", type=int, default=None,
                    help="run the trainer.auto_max_tokens search under this budget")
    args = ap.parse_args()
    src, tgt = synthetic_lengths(args.pairs, args.mean, args.std, args.ratio_sigma,
                                 args.max_len, args.seed, args.ratio_median)
    print(f"proxy: {args.pairs:,} pairs, source mean {src.mean() + 1:.1f} / target mean "
          f"{tgt.mean() + 1:.1f} tokens with eos, p99 {np.percentile(src, 99):.0f}; lengths "
          f"padded to a multiple of {args.pad_to_multiple}")

    def make(mt: int) -> LengthBucketSampler:
        return LengthBucketSampler(src, tgt, mt, seed=args.seed, skip_too_long=True,
                                   pad_to_multiple=args.pad_to_multiple)

    if args.auto_cap is not None:
        if args.target is None:
            ap.error("--auto-cap needs --target")
        longest = int(max(src.max(), tgt.max())) + 1
        try:
            plan = search_max_tokens(make, args.target, args.tolerance, args.gpus,
                                     args.auto_cap, longest)
        except UserError as e:
            print(f"refused: {e}")
            return
        print(f"auto_max_tokens under {args.auto_cap}: {args.gpus} GPUs x update_freq "
              f"{plan.update_freq} x max_tokens {plan.max_tokens}: {plan.src_per_step:,.0f} "
              f"real source / {plan.tgt_per_step:,.0f} real target tokens per step")
        return
    print(f"| max_tokens | real src / batch | real tgt / batch | update_freq | real src / step | "
          f"real tgt / step ({args.gpus} GPUs) | padding eff. |")
    print("|---|---|---|---|---|---|---|")
    for mt in args.max_tokens:
        sampler = make(mt)
        s, t = sampler.real_tokens_per_batch
        uf = args.update_freq
        verdict = ""
        if args.target is not None:
            uf = derive_update_freq((s, t), args.target, args.gpus)
            try:
                check_tokens_per_step((s * uf * args.gpus, t * uf * args.gpus), args.target,
                                      args.tolerance, max_tokens=mt, update_freq=uf,
                                      world_size=args.gpus)
            except UserError:
                verdict = " (refused)"
        per_step = args.gpus * uf
        print(f"| {mt} | {s:,.0f} | {t:,.0f} | {uf}{verdict} | {s * per_step:,.0f} | "
              f"{t * per_step:,.0f} | {sampler.padding_efficiency:.3f} |")


if __name__ == "__main__":
    main()
