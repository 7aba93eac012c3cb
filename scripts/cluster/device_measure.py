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
3. trains a base-size model for :data:`DECODE_STEPS` steps and times beam-4 decoding of
   test_2016_flickr with ours and with Hugging Face transformers' ``MarianMTModel.generate`` on
   the same weights (``scripts/bench/bench_decode.py --toolkits ours,marian``, bf16, the
   peers' length penalty and stopping rule): tokens/s, BLEU and the share of identical
   outputs; :data:`DECODE_RESERVE_S` seconds of the budget are kept for it;
4. writes ``<out>/device_measure.json`` (every configuration's speed: target tokens/s, MFU,
   peak memory; and its profile: the GPU-busy share of a step, host time per step and its top
   host ops) and ``<out>/device_measure.md``, after every configuration, so that a call
   stopped at its time limit still returns what finished. Configurations that would start
   after ``--budget-s`` seconds are listed as not run.

``--smoke`` is the CPU path (the test suite runs it): a tiny model, ``aot_eager``, a few
hundred training pairs, the base size on padded batches (every part of gpu_profile.py), on
packed ones and on packed ones as one compiled step.

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
SMOKE_PLAN = [("base", 256, "padded"), ("base", 256, "packed"), ("base", 256, "graphed")]
SMOKE_DATA = ("data.max_train_pairs=400", "data.vocab_size=200")
PARTS = ("step", "decode")
DECODE_STEPS = 300
"""Training steps of the model the decoding part decodes (a few hundred: its outputs are
sentences of realistic length, not yet good translations)."""
DECODE_RESERVE_S = 150.0
"""Seconds of ``--budget-s`` that the step configurations leave for the decoding part."""


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


def decode_commands(tmp: Path, data_root: Path, out: Path, smoke: bool
                    ) -> tuple[list[str], list[str]]:
    """``(train, bench)``: ``nmt-train`` of the model to decode (the base size, bf16, in
    ``tmp/run``; with ``smoke`` the tiny one on the CPU) and ``bench_decode.py`` over
    test_2016_flickr with ours and Marian's ``generate``; the bench command's checkpoint is
    the placeholder ``{checkpoint}``."""
    train = [sys.executable, "-m", "transformer_nmt.cli.train", "experiment=multi30k_en_de",
             f"data.root={data_root}", f"run_dir={tmp / 'run'}", "trainer.keep_last=1",
             f"trainer.validate_every_steps={10 ** 6}"]
    raw = data_root / "raw" / "multi30k_en_de"
    bench = [sys.executable, str(REPO / "scripts" / "bench" / "bench_decode.py"),
             "--checkpoint", "{checkpoint}", "--spm",
             str(data_root / "spm" / "multi30k_en_de" / "spm.model"),
             "--input", str(raw / "test_2016_flickr.en"),
             "--reference", str(raw / "test_2016_flickr.de"),
             "--toolkits", "ours,marian", "--out", str(out / "decode")]
    if smoke:
        train += [*SMOKE_DATA, "trainer.max_steps=10"]
        bench += ["--size", "tiny", "--sentences", "8", "--warmup-sentences", "2",
                  "--repeats", "1", "--threads", "1", "--max-len-a", "0", "--max-len-b", "6"]
    else:
        train += ["model=base", f"trainer.max_steps={DECODE_STEPS}", "trainer.precision=bf16",
                  "trainer.max_tokens=8192"]
        bench += ["--size", "base", "--device", "cuda", "--precision", "bf16",
                  "--sentences", "1000", "--repeats", "3", "--threads", "8"]
    return train, bench


def run_decode(tmp: Path, data_root: Path, out: Path, env: dict[str, str], smoke: bool,
               timeout: float) -> dict:
    """Train the model and decode with both toolkits: per toolkit its sentences/s, target
    tokens/s, BLEU and share of outputs identical to ours, or why it did not run."""
    train, bench = decode_commands(tmp, data_root, out, smoke)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(train, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            return {"status": f"training exit {proc.returncode}",
                    "stderr_tail": proc.stderr[-1500:]}
        found = sorted((f for f in (tmp / "run" / "checkpoints").glob("checkpoint_*.pt")
                        if f.stem.rsplit("_", 1)[-1].isdigit()),
                       key=lambda f: int(f.stem.rsplit("_", 1)[-1]))
        if not found:
            return {"status": "training wrote no checkpoint"}
        bench = [str(found[-1]) if a == "{checkpoint}" else a for a in bench]
        left = timeout - (time.monotonic() - t0)
        proc = subprocess.run(bench, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=max(left, 1.0))
    except subprocess.TimeoutExpired:
        return {"status": f"stopped after {timeout:.0f} s (budget)"}
    results = out / "decode" / "results.json"
    if proc.returncode != 0 or not results.is_file():
        return {"status": f"bench exit {proc.returncode}", "stderr_tail": proc.stderr[-1500:]}
    toolkits = json.loads(results.read_text())["toolkits"]
    keys = ("sentences_per_s", "target_tokens_per_s", "bleu", "same_as_ours", "peak_gpu_mib")
    return {"status": "ran", "seconds": round(time.monotonic() - t0, 1),
            "checkpoint_steps": int(found[-1].stem.rsplit("_", 1)[-1]),
            "toolkits": {name: {k: r.get(k) for k in keys} for name, r in toolkits.items()}}


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
    decode = report.get("decode")
    if decode:
        rows += ["", f"decoding test_2016_flickr, beam 4: {decode['status']}", ""]
        if decode.get("toolkits"):
            rows += ["| toolkit | sentences/s | target tok/s | BLEU | same as ours |",
                     "|---|---:|---:|---:|---:|"]
            rows += [f"| {name} | {r['sentences_per_s']:.1f} | {r['target_tokens_per_s']:,.0f} "
                     f"| {r['bleu']:.2f} | {r['same_as_ours']:.3f} |"
                     for name, r in decode["toolkits"].items()]
    for name, text in (("device_measure.json", json.dumps(report, indent=1)),
                       ("device_measure.md", "\n".join(rows) + "\n")):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def run(args: argparse.Namespace) -> int:
    """Install, prepare, run the plan and the decoding part; 0 when everything ran, else 1."""
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
    plan = (SMOKE_PLAN if args.smoke else PLAN) if "step" in args.parts else []
    reserve = DECODE_RESERVE_S if "decode" in args.parts and not args.smoke else 0.0
    if args.only:
        plan = [c for c in plan if f"{c[0]}-{c[1]}-{c[2]}" in args.only]
    report: dict = {"command": " ".join(sys.argv), "configurations": {
        f"{s}-{t}-{b}": {"status": "not run"} for s, t, b in plan}}
    with tempfile.TemporaryDirectory(prefix="device_measure_") as tmp:
        site, data_root = Path(tmp) / "site", Path(tmp) / "data"
        report["installed"] = install_wheels(bundle / "wheels", site)
        env = child_env(site)
        if args.smoke:  # the CPU path: one thread per child, as the test suite runs
            env["OMP_NUM_THREADS"] = "1"
        prepare(data_root, mirror, env, args.smoke)
        report["prepare_s"] = round(time.monotonic() - start, 1)
        write_report(out, report)
        for size, tokens, batch in plan:
            name = f"{size}-{tokens}-{batch}"
            entry = report["configurations"][name]
            left = args.budget_s - reserve - (time.monotonic() - start)
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
        if "decode" in args.parts:
            left = args.budget_s - (time.monotonic() - start)
            report["decode"] = (run_decode(Path(tmp), data_root, out, env, args.smoke, left)
                                if left >= args.min_config_s else
                                {"status": f"not run: {args.budget_s} s budget spent"})
            print(f"decode: {report['decode']['status']}", flush=True)
            write_report(out, report)
    report["seconds"] = round(time.monotonic() - start, 1)
    write_report(out, report)
    print((out / "device_measure.md").read_text())
    statuses = [e["status"] for e in report["configurations"].values()]
    if "decode" in report:
        statuses.append(report["decode"]["status"])
    return 0 if all(x == "ran" for x in statuses) else 1


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
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                   help="step: the step configurations; decode: ours against Marian generate")
    p.add_argument("--only", nargs="+", default=None,
                   help="configurations to run, named <size>-<tokens>-<padded|packed|graphed>")
    p.add_argument("--smoke", action="store_true",
                   help="the CPU path: tiny model, small data, two configurations")
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
