"""Peak memory of ``nmt-average`` on synthetic Transformer-big checkpoints.

Writes ``--n`` checkpoints with the parameter shapes of the ``big`` preset and a 37,000-piece
vocabulary (about 214M fp32 parameters, model only, as ``averaged.pt`` holds them), then
averages them in a child process with :func:`transformer_nmt.checkpoint.average_run` and reports
the child's peak resident set size (``os.wait4``) next to the size of one model.

    .venv/bin/python scripts/micro/bench_average.py --n 20 --dir data/bench/average

Needs ``n`` x ~860 MB of disk under ``--dir`` (removed at the end unless ``--keep``).
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

import torch

REPO = Path(__file__).resolve().parents[2]
VOCAB = 37_000


def _config() -> dict:
    from transformer_nmt.config import compose, to_plain

    cfg = compose(["model=big", "data.vocab_size=37000", "trainer.save_every_steps=1000"])
    return to_plain(cfg)


def make(folder: Path, n: int) -> int:
    """Write ``checkpoint_<1000 i>.pt`` for i = 1..n; returns the bytes of one model."""
    from omegaconf import OmegaConf

    from transformer_nmt.checkpoint import checkpoint_dir, save_checkpoint
    from transformer_nmt.model.transformer import Transformer

    config = _config()
    torch.manual_seed(0)
    model = Transformer(OmegaConf.create(config["model"]), vocab_size=VOCAB)
    state = model.state_dict()
    out = checkpoint_dir(folder)
    vocab = {"spm_sha256": "0" * 64, "vocab_size": VOCAB}
    for i in range(1, n + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.999).add_(1e-4)
        save_checkpoint(out / f"checkpoint_{1000 * i}.pt",
                        {"model": state, "config": config, "vocab_size": VOCAB, "vocab": vocab,
                         "step": 1000 * i})
    return sum(p.numel() * p.element_size() for p in model.parameters())


def child(folder: Path, n: int) -> None:
    """Average the last ``n`` checkpoints of ``folder`` (run in its own process)."""
    from transformer_nmt.checkpoint import average_run
    from transformer_nmt.config import compose

    cfg = compose(["model=big", "data.vocab_size=37000", f"run_dir={folder}",
                   f"average.last={n}"])
    t = time.perf_counter()
    out = average_run(cfg)
    print(json.dumps({"seconds": round(time.perf_counter() - t, 1), "output": str(out)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--dir", type=Path, default=REPO / "data" / "bench" / "average")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoints")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.dir, args.n)
        return
    t = time.perf_counter()
    model_bytes = make(args.dir, args.n)
    made = time.perf_counter() - t
    ckpt_bytes = (args.dir / "checkpoints" / f"checkpoint_{1000 * args.n}.pt").stat().st_size
    # drop the written files from this process's view; the child maps them itself
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--n", str(args.n),
                             "--dir", str(args.dir)], stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    result = json.loads(proc.stdout.read())
    peak = usage.ru_maxrss * 1024
    report = {
        "checkpoints": args.n, "params_bytes": model_bytes, "checkpoint_file_bytes": ckpt_bytes,
        "write_seconds": round(made, 1), "average_seconds": result["seconds"],
        "peak_rss_bytes": peak, "peak_rss_models": round(peak / model_bytes, 2),
        "exit_status": os.waitstatus_to_exitcode(status), "torch": torch.__version__,
    }
    print(json.dumps(report, indent=2))
    if not args.keep:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
