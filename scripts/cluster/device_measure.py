"""The whole GPU measurement of the training step in one call, on a machine that has torch
with CUDA and nothing of this project installed.

What it needs beside this checkout is one folder, the bundle (``make device-bundle`` builds
it): ``wheels/`` (hydra-core, omegaconf and antlr4-python3-runtime, the packages of ours that
such a machine lacks; installed with ``pip --no-deps`` into a temporary folder, never into the
machine's Python) and ``multi30k/`` (the Multi30k files as the official mirror names them,
``train.en.gz``, ...). The script then

1. prepares Multi30k EN-DE into a temporary data folder (``nmt-prepare``, the default job's
   8,000-piece vocabulary);
2. runs ``scripts/cluster/gpu_profile.py`` once per configuration, each in its own process:
   the base and big models (the WMT14 presets' settings, bf16, compiled) at 3,100 tokens per
   GPU (the paper's 25,000-token batch over eight GPUs) and at 30,712 (the one-GPU preset's
   micro-batch), each with padded batches, packed batches (``trainer.packing``) and packed
   batches with the step as one CUDA graph (``trainer.cuda_graphs``), in :data:`PLAN` order;
3. writes ``<out>/device_measure.json`` (every configuration's speed: target tokens/s, MFU,
   peak memory; and its profile: the GPU-busy share of a step, host time per step and its top
   host ops) and ``<out>/device_measure.md``, after every configuration, so that a call
   stopped at its time limit still returns what finished. Configurations that would start
   after ``--budget-s`` seconds are listed as not run.

``--smoke`` is the CPU path (the test suite runs it): a tiny model, ``aot_eager``, a few
hundred training pairs, the base size on padded batches (every part of gpu_profile.py) and on
packed ones.

    make device-bundle                                   # here: device_bundle/
    python scripts/cluster/device_measure.py --bundle device_bundle --out $OUT   # on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "scripts" / "cluster" / "gpu_profile.py"
SIZES = ("base", "big")
TOKENS = (3100, 30712)
"""Tokens per GPU: the paper's 25,000-token batch on eight GPUs, and the one-GPU preset's
micro-batch (configs/experiment/wmt14_en_de_base.yaml's ``trainer.max_tokens``)."""
BATCHES = ("padded", "packed", "graphed")
"""Padded batches; packed batches (``--packing``); packed batches with the step as one CUDA
graph (``--packing --cuda-graphs``)."""
PLAN = [(size, tokens, batch) for tokens in TOKENS for size in SIZES for batch in BATCHES]
"""Every configuration, in the order run: the eight-GPU batch first (where the host bounds
the step), base before big, padded before packed before graphed."""
SMOKE_PLAN = [("base", 256, "padded"), ("base", 256, "packed")]
SMOKE_DATA = ("data.max_train_pairs=400", "data.vocab_size=200")


def install_wheels(wheels: Path, target: Path) -> list[str]:
    """``pip install --no-deps --target target`` every ``*.whl`` in ``wheels`` (none: nothing
    to do); the names installed."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if found:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-index", "--target", str(target), *map(str, found)], check=True)
    return [w.name for w in found]


def child_env(site: Path) -> dict[str, str]:
    """The environment of the script's children: the temporary site folder and this
    checkout's ``src`` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    parts = [str(site), str(REPO / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def prepare(data_root: Path, mirror: Path, env: dict[str, str], smoke: bool) -> None:
    """``nmt-prepare experiment=multi30k_en_de`` from ``mirror`` into ``data_root``."""
    env = {**env, "NMT_MULTI30K_MIRROR": str(mirror)}
    overrides = ["experiment=multi30k_en_de", f"data.root={data_root}",
                 *(SMOKE_DATA if smoke else ())]
    subprocess.run([sys.executable, "-m", "transformer_nmt.cli.prepare", *overrides],
                   env=env, check=True, cwd=REPO)


def profile_command(size: str, tokens: int, batch: str, out: Path, data_root: Path,
                    smoke: bool) -> list[str]:
    """The ``gpu_profile.py`` command of one configuration: its speed and profile parts (with
    ``smoke``, padded batches run every part: the suite's check of the whole script)."""
    parts = ["speed", "profile", "loss", "memory"] if smoke and batch == "padded" else [
        "speed", "profile"]
    cmd = [sys.executable, str(PROFILE), "--sizes", size, "--max-tokens", str(tokens),
           "--out", str(out), "--parts", *parts, "--data-root", str(data_root)]
    if batch in ("packed", "graphed"):
        cmd.append("--packing")
    if batch == "graphed":
        cmd.append("--cuda-graphs")
    if smoke:
        cmd.append("--smoke")  # gpu_profile.py's own smoke data: SMOKE_DATA
    else:
        cmd += ["--warmup", "5", "--steps", "20", "--profile-steps", "6"]
    return cmd


def summary_row(name: str, entry: dict) -> str:
    """One configuration as a row of the markdown table."""
    r = entry.get("result") or {}
    s, p = r.get("speed") or {}, r.get("profile") or {}
    if not s:
        return f"| {name} | {entry['status']} | | | | | | |"
    mfu = f"{s['mfu']:.1%}" if s.get("mfu") else "-"
    busy = f"{p['gpu_busy_share']:.1%}" if "gpu_busy_share" in p else "-"
    top = ", ".join(f"`{op[:40]}` {ms}" for op, ms in (p.get("top_host_ops") or [])[:3])
    return (f"| {name} | {entry['status']} | {s['target_tokens_per_s']:,} | {mfu} | {busy} | "
            f"{p.get('host_ms_per_step', '-')} | {s.get('peak_allocated_gib', '-')} | {top} |")


def write_report(out: Path, report: dict) -> None:
    """``device_measure.json`` and ``.md`` in ``out`` (each written whole, then renamed)."""
    rows = ["| configuration | status | target tok/s | MFU | GPU busy | host ms/step | "
            "peak GiB | top host ops (ms/step) |", "|---|---|---:|---:|---:|---:|---:|---|"]
    rows += [summary_row(name, entry) for name, entry in report["configurations"].items()]
    for name, text in (("device_measure.json", json.dumps(report, indent=1)),
                       ("device_measure.md", "\n".join(rows) + "\n")):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def run(args: argparse.Namespace) -> int:
    """Install, prepare, run the plan; 0 when every configuration ran, 1 otherwise."""
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device (--smoke runs the CPU path)", file=sys.stderr)
            return 2
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bundle = Path(args.bundle)
    mirror = Path(args.multi30k) if args.multi30k else bundle / "multi30k"
    if not (mirror / "train.en.gz").is_file():
        print(f"error: no Multi30k files in {mirror} (make device-bundle)", file=sys.stderr)
        return 2
    plan = SMOKE_PLAN if args.smoke else PLAN
    if args.only:
        plan = [c for c in plan if f"{c[0]}-{c[1]}-{c[2]}" in args.only]
    report: dict = {"command": " ".join(sys.argv), "configurations": {
        f"{s}-{t}-{b}": {"status": "not run"} for s, t, b in plan}}
    with tempfile.TemporaryDirectory(prefix="device_measure_") as tmp:
        site, data_root = Path(tmp) / "site", Path(tmp) / "data"
        report["installed"] = install_wheels(bundle / "wheels", site)
        env = child_env(site)
        prepare(data_root, mirror, env, args.smoke)
        report["prepare_s"] = round(time.monotonic() - start, 1)
        write_report(out, report)
        for size, tokens, batch in plan:
            name = f"{size}-{tokens}-{batch}"
            entry = report["configurations"][name]
            left = args.budget_s - (time.monotonic() - start)
            if left < args.min_config_s:
                entry["status"] = f"not run: {args.budget_s} s budget spent"
                continue
            folder = out / name
            cmd = profile_command(size, tokens, batch, folder, data_root, args.smoke)
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=left)
                entry["status"] = "ran" if proc.returncode == 0 else f"exit {proc.returncode}"
                if proc.returncode != 0:
                    entry["stderr_tail"] = proc.stderr[-1500:]
            except subprocess.TimeoutExpired:
                entry["status"] = f"stopped after {left:.0f} s (budget)"
            entry["seconds"] = round(time.monotonic() - t0, 1)
            result = folder / "gpu_profile.json"
            if result.is_file():
                profiled = json.loads(result.read_text())
                report.setdefault("environment", profiled.get("environment"))
                entry["result"] = (profiled.get("sizes") or [None])[0]
                if profiled.get("failed"):
                    entry["status"] = f"failed: {next(iter(profiled['failed'].values()))}"
            print(f"{name}: {entry['status']} ({entry['seconds']} s)", flush=True)
            write_report(out, report)
    report["seconds"] = round(time.monotonic() - start, 1)
    write_report(out, report)
    print((out / "device_measure.md").read_text())
    return 0 if all(e["status"] == "ran" for e in report["configurations"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default="device_bundle",
                   help="folder with wheels/ and multi30k/ (make device-bundle)")
    p.add_argument("--multi30k", default=None, help="Multi30k files (default: <bundle>/multi30k)")
    p.add_argument("--out", default="runs/device_measure")
    p.add_argument("--budget-s", type=float, default=500.0,
                   help="no configuration starts after this many seconds")
    p.add_argument("--min-config-s", type=float, default=30.0,
                   help="a configuration needs at least this many seconds left to start")
    p.add_argument("--only", nargs="+", default=None,
                   help="configurations to run, named <size>-<tokens>-<padded|packed|graphed>")
    p.add_argument("--smoke", action="store_true",
                   help="the CPU path: tiny model, small data, two configurations")
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
