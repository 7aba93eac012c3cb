#!/usr/bin/env python
"""Scale test of the data stage: ``nmt-prepare data=custom`` on synthetic parallel corpora.

Generates a synthetic corpus of ``--pairs`` training pairs (default 2,000,000) and one a
quarter of that size, runs the full data stage (clean -> SentencePiece -> binarize ->
summary) on each in a child process, and prints a Markdown table of wall time, pairs per
second and peak resident memory.

Peak memory is measured two ways: the peak of the summed RSS of the whole process tree
(the prepare process and its encoder workers), sampled from /proc every 0.1 s, and the
kernel's exact per-process maxima (``resource.getrusage``: the prepare process itself
and its largest child). With a bounded SentencePiece sample (``--spm-sample``) and
streaming everywhere else, memory should stay nearly flat as the corpus grows.

Usage::

    .venv/bin/python scripts/micro/bench_prepare_scale.py                # 2M and 500k pairs
    .venv/bin/python scripts/micro/bench_prepare_scale.py --pairs 200000 # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, resource, sys, time
from transformer_nmt.config import compose
from transformer_nmt.data.prepare import prepare
t = time.perf_counter()
summary = prepare(compose(sys.argv[1:]))
wall = time.perf_counter() - t
kib = lambda who: resource.getrusage(who).ru_maxrss  # KiB on Linux
print("BENCH " + json.dumps({"wall_s": wall, "self_kib": kib(resource.RUSAGE_SELF),
      "children_kib": kib(resource.RUSAGE_CHILDREN), "summary": summary}))
"""


def make_corpus(prefix: Path, n: int, seed: int, vocab: int = 30000) -> None:
    """Write ``n`` synthetic pairs to ``<prefix>.en`` / ``<prefix>.de``.

    Words are drawn from a Zipf-like distribution over ``vocab`` pseudo-words (so the BPE
    model has a realistic head and tail); the target sentence is a word-by-word mapping of
    the source into a second pseudo-vocabulary, with one word dropped or added now and then.
    Lengths are 3-40 words.
    """
    rng = np.random.default_rng(seed)
    syll = np.array(["ka", "to", "mi", "ren", "sa", "lo", "ve", "dun", "pi", "cha", "or", "el",
                     "an", "ist", "ung", "ber", "qu", "ix", "ne", "wa"])

    def words(r):
        return ["".join(syll[r.integers(0, len(syll), r.integers(1, 5))]) for _ in range(vocab)]
    src_words, tgt_words = words(np.random.default_rng(1)), words(np.random.default_rng(2))
    tgt_words = [w.capitalize() if i % 7 == 0 else w for i, w in enumerate(tgt_words)]
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    block = 100_000
    with open(f"{prefix}.en", "w", encoding="utf-8") as fs, \
            open(f"{prefix}.de", "w", encoding="utf-8") as ft:
        for start in range(0, n, block):
            m = min(block, n - start)
            lengths = rng.integers(3, 41, m)
            ids = rng.choice(vocab, size=int(lengths.sum()), p=p)
            extra = rng.choice(vocab, size=m, p=p)
            coin = rng.random(m)
            pos = 0
            src_lines, tgt_lines = [], []
            for k, length in enumerate(lengths.tolist()):
                sent = ids[pos:pos + length].tolist()
                pos += length
                src_lines.append(" ".join(src_words[i] for i in sent) + " .")
                tgt = [tgt_words[i] for i in sent]
                if coin[k] < 0.2:
                    tgt.append(tgt_words[extra[k]])
                elif coin[k] < 0.4 and len(tgt) > 3:
                    tgt.pop()
                tgt_lines.append(" ".join(tgt) + " .")
            fs.write("\n".join(src_lines) + "\n")
            ft.write("\n".join(tgt_lines) + "\n")


def tree_rss_kib(pid: int) -> int:
    """Summed VmRSS (KiB) of ``pid`` and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_prepare(workdir: Path, n: int, args: argparse.Namespace) -> dict:
    corpus = workdir / f"corpus_{n}"
    if not Path(f"{corpus}/train.de").exists():
        t = time.perf_counter()
        make_corpus(corpus / "train", n, seed=n)
        make_corpus(corpus / "valid", 3000, seed=1)
        make_corpus(corpus / "test", 3000, seed=2)
        print(f"generated {n} pairs in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    root = workdir / f"data_{n}"
    shutil.rmtree(root, ignore_errors=True)
    overrides = [
        "data=custom", f"data.name=synthetic_{n}", f"data.root={root}",
        f"+data.custom_files.train={corpus / 'train'}",
        f"+data.custom_files.valid={corpus / 'valid'}",
        f"+data.custom_files.test={corpus / 'test'}",
        f"data.vocab_size={args.vocab}", f"data.spm_sample_sentences={args.spm_sample}",
        f"data.num_workers={args.workers}",
    ]
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *overrides], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    peak = 0
    t = time.perf_counter()
    while proc.poll() is None:
        peak = max(peak, tree_rss_kib(proc.pid))
        time.sleep(0.1)
    total_s = time.perf_counter() - t
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed for {n} pairs (exit {proc.returncode})")
    res = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH "))[6:])
    res.update(pairs=n, process_s=total_s, tree_peak_kib=peak)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2_000_000, help="size of the large corpus")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/nmt_bench_prepare"))
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--spm-sample", type=int, default=500_000,
                    help="data.spm_sample_sentences (the bounded SentencePiece sample)")
    ap.add_argument("--workers", type=int, default=2, help="data.num_workers")
    ap.add_argument("--keep", action="store_true", help="keep the prepared data")
    args = ap.parse_args()
    rows = [run_prepare(args.workdir, n, args) for n in (args.pairs // 4, args.pairs)]
    mib = 1 / 1024
    print(f"vocab {args.vocab}, SentencePiece sample {args.spm_sample} sentences, "
          f"{args.workers} encoder workers\n")
    print("| train pairs | wall time (s) | pairs/s | peak RSS, process tree (MiB) "
          "| peak RSS, prepare process (MiB) | peak RSS, largest worker (MiB) "
          "| clean / bpe / binarize (s) | train tokens (en+de) |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        st = r["summary"]["stages"]
        tok = sum(r["summary"]["tokens"]["train"].values())
        print(f"| {r['pairs']:,} | {r['wall_s']:.0f} | {r['pairs'] / r['wall_s']:,.0f} "
              f"| {r['tree_peak_kib'] * mib:.0f} | {r['self_kib'] * mib:.0f} "
              f"| {r['children_kib'] * mib:.0f} "
              f"| {st['clean']['seconds']:.0f} / {st['bpe']['seconds']:.0f} / "
              f"{st['binarize']['seconds']:.0f} | {tok:,} |")


if __name__ == "__main__":
    main()
