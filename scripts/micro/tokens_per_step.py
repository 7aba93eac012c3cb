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

    .venv/bin/python scripts/micro/tokens_per_step.py --max-tokens 3125 3500 4000 4096 4500
"""

from __future__ import annotations

import argparse

import numpy as np

from transformer_nmt.data.batching import LengthBucketSampler


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
    args = ap.parse_args()
    src, tgt = synthetic_lengths(args.pairs, args.mean, args.std, args.ratio_sigma,
                                 args.max_len, args.seed, args.ratio_median)
    print(f"proxy: {args.pairs:,} pairs, source mean {src.mean() + 1:.1f} / target mean "
          f"{tgt.mean() + 1:.1f} tokens with eos, p99 {np.percentile(src, 99):.0f}")
    per_step = args.gpus * args.update_freq
    print(f"| max_tokens | real src / batch | real tgt / batch | real src / step | "
          f"real tgt / step ({args.gpus} GPUs x update_freq {args.update_freq}) | padding eff. |")
    print("|---|---|---|---|---|---|")
    for mt in args.max_tokens:
        sampler = LengthBucketSampler(src, tgt, mt, seed=args.seed, skip_too_long=True)
        s, t = sampler.real_tokens_per_batch
        print(f"| {mt} | {s:,.0f} | {t:,.0f} | {s * per_step:,.0f} | {t * per_step:,.0f} | "
              f"{sampler.padding_efficiency:.3f} |")


if __name__ == "__main__":
    main()
