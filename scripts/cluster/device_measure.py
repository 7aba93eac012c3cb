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
   outputs, then one profiled pass over :data:`DECODE_PROFILE_SENTENCES` sentences per toolkit
   (kernel and host time per decoding step, the GPU's busy share); :data:`DECODE_RESERVE_S`
   seconds of the budget are kept for it. With
   ``--decode-toolkits ours,marian,ours_compiled`` ours runs also with ``decode.compile`` (a
   CUDA graph per shape bucket), whose step the prewarm phase compiles once, untimed;
4. writes ``<out>/device_measure.json`` (every configuration's speed: target tokens/s, MFU,
   peak memory; and its profile: the GPU-busy share of a step, host time per step and its top
   host ops) and ``<out>/device_measure.md``, after every configuration, so that a call
   stopped at its time limit still returns what finished. Configurations that would start
   after ``--budget-s`` seconds are listed as not run.

Compiling, not stepping, takes most of a configuration's time (3 graphs of 20-40 s each on an
H200). So before the timed part (``--prewarm N``) every configuration runs once, untimed, N at
a time within the GPU's memory, filling Inductor's on-disk cache (``<work>/inductor``) that the
timed runs then read; the decoding part's model trains (eager) and the ``--checks`` of
``gpu_check.py`` run beside them. Nothing is timed while anything else runs: the prewarm phase
ends, its stragglers stopped, at ``--prewarm-s`` seconds. ``--work`` keeps the data, the cache
and every configuration's own files (``gpu_profile.json``, logs) in one folder, so that a second
call on the same machine (``--only`` the rest) starts warm; ``<out>`` holds the report alone.

``--smoke`` is the CPU path (the test suite runs it): a tiny model, ``aot_eager``, a few
hundred training pairs, the base size on padded batches (every part of gpu_profile.py), on
packed ones and on packed ones as one compiled step.

    make device-bundle                                   # here: device_bundle/
    python scripts/cluster/device_measure.py --bundle device_bundle --work /tmp/dm --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
DECODE_TOOLKITS = "ours,marian"
"""The decoding part's toolkits by default: ours (eager) and Marian's ``generate``."""
DECODE_PROFILE_SENTENCES = 200
"""Sentences of the one pass per toolkit that runs under ``torch.profiler`` after the timed
ones (``bench_decode.py --profile-sentences``): kernel and host time per decoding step."""
DECODE_RESERVE_S = 90.0
"""Seconds of ``--budget-s`` that the step configurations leave for the decoding part (its
model trained beside the prewarm; without it, the training's time comes out of this too)."""
CHECKS = ("graphs_eager", "compile_eager", "fp16", "resume_curve")
"""``gpu_check.py`` checks run during the prewarm phase, in this order: correctness, not speed
(their figures of time are not quoted); the DDP checks need two GPUs."""
GRAPH_MEMORY_FACTOR = 1.5
"""Memory of a graphed configuration against the padded one at the same tokens (the CUDA
graph's own pool); other configurations are counted at 1.2: an estimate for scheduling the
prewarm, not a measurement."""


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


def decode_commands(tmp: Path, data_root: Path, out: Path, smoke: bool,
                    toolkits: str = DECODE_TOOLKITS) -> tuple[list[str], list[str]]:
    """``(train, bench)``: ``nmt-train`` of the model to decode (the base size, bf16, in
    ``tmp/run``; with ``smoke`` the tiny one on the CPU) and ``bench_decode.py`` over
    test_2016_flickr with ``toolkits`` (bench_decode.py's names); the bench command's
    checkpoint is the placeholder ``{checkpoint}``."""
    train = [sys.executable, "-m", "transformer_nmt.cli.train", "experiment=multi30k_en_de",
             f"data.root={data_root}", f"run_dir={tmp / 'run'}", "trainer.keep_last=1",
             f"trainer.validate_every_steps={10 ** 6}"]
    raw = data_root / "raw" / "multi30k_en_de"
    bench = [sys.executable, str(REPO / "scripts" / "bench" / "bench_decode.py"),
             "--checkpoint", "{checkpoint}", "--spm",
             str(data_root / "spm" / "multi30k_en_de" / "spm.model"),
             "--input", str(raw / "test_2016_flickr.en"),
             "--reference", str(raw / "test_2016_flickr.de"),
             "--toolkits", toolkits, "--out", str(out / "decode")]
    if smoke:
        train += [*SMOKE_DATA, "trainer.max_steps=10"]
        bench += ["--size", "tiny", "--sentences", "8", "--warmup-sentences", "2",
                  "--repeats", "1", "--threads", "1", "--max-len-a", "0", "--max-len-b", "6",
                  "--profile-sentences", "4"]
    else:
        train += ["model=base", f"trainer.max_steps={DECODE_STEPS}", "trainer.precision=bf16",
                  "trainer.max_tokens=8192", "trainer.compile=false"]  # no graphs to build
        bench += ["--size", "base", "--device", "cuda", "--precision", "bf16",
                  "--sentences", "1000", "--repeats", "2", "--threads", "8",
                  "--profile-sentences", str(DECODE_PROFILE_SENTENCES)]
    return train, bench


def last_checkpoint(run: Path) -> Path | None:
    """The numbered checkpoint of ``run`` with the most steps, or None."""
    found = [f for f in (run / "checkpoints").glob("checkpoint_*.pt")
             if f.stem.rsplit("_", 1)[-1].isdigit()]
    return max(found, key=lambda f: int(f.stem.rsplit("_", 1)[-1]), default=None)


def run_decode(tmp: Path, data_root: Path, out: Path, env: dict[str, str], smoke: bool,
               timeout: float, toolkits: str = DECODE_TOOLKITS, **bench_args: str) -> dict:
    """Train the model (unless a checkpoint is in ``tmp/run`` already: the prewarm phase
    trained it) and decode with each of ``toolkits``: per toolkit its sentences/s, target
    tokens/s, BLEU, share of outputs identical to ours and every pass's seconds, or why it
    did not run (the toolkits that finished before a failure or the budget's end are kept).
    The bench's own files go to ``out``; ``bench_args`` set its ``--name value`` pairs
    (``repeats="1"``), replacing or adding them."""
    train, bench = decode_commands(tmp, data_root, out, smoke, toolkits)
    for name, value in bench_args.items():
        flag = "--" + name.replace("_", "-")
        if flag in bench:
            bench[bench.index(flag) + 1] = value
        else:
            bench += [flag, value]
    t0 = time.monotonic()
    status, tail, checkpoint = "ran", "", None
    try:
        if last_checkpoint(tmp / "run") is None:
            proc = subprocess.run(train, env=env, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout)
            if proc.returncode != 0:
                return {"status": f"training exit {proc.returncode}",
                        "stderr_tail": proc.stderr[-1500:]}
        checkpoint = last_checkpoint(tmp / "run")
        if checkpoint is None:
            return {"status": "training wrote no checkpoint"}
        bench = [str(checkpoint) if a == "{checkpoint}" else a for a in bench]
        left = timeout - (time.monotonic() - t0)
        (out / "decode" / "results.json").unlink(missing_ok=True)  # an earlier call's
        proc = subprocess.run(bench, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=max(left, 1.0))
        if proc.returncode != 0:
            status, tail = f"bench exit {proc.returncode}", proc.stderr[-1500:]
    except subprocess.TimeoutExpired:
        status = f"stopped after {timeout:.0f} s (budget)"
    results = out / "decode" / "results.json"
    if not results.is_file():
        return {"status": status, **({"stderr_tail": tail} if tail else {})}
    done = json.loads(results.read_text())["toolkits"]
    keys = ("sentences_per_s", "target_tokens_per_s", "bleu", "same_as_ours", "peak_gpu_mib",
            "all_seconds", "decoder_calls", "profile", "compiler")
    entry = {"status": status, "seconds": round(time.monotonic() - t0, 1),
             "checkpoint_steps": int(checkpoint.stem.rsplit("_", 1)[-1]) if checkpoint else None,
             "toolkits": {name: {k: r.get(k) for k in keys} for name, r in done.items()}}
    return {**entry, **({"stderr_tail": tail} if tail else {})}


class Job:
    """One command of the prewarm phase, run in its own process group (so that stopping it
    stops its compile workers too), its output to ``log``; ``gib``: the GPU memory it is
    expected to hold."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str],
                 gib: float = 0.0):
        self.name, self.cmd, self.log, self.env, self.gib = name, cmd, log, env, gib
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.t0 = time.monotonic()

    def stop(self) -> None:
        """Kill the job's whole process group and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def seconds(self) -> float:
        return round(time.monotonic() - self.t0, 1)


def run_concurrently(jobs: list[Job], chain: list[Job], slots: int, memory_gib: float,
                     deadline: float, poll_s: float = 0.2) -> dict[str, dict]:
    """Run ``jobs`` at most ``slots`` at a time and ``chain`` one after another beside them,
    never starting one whose ``gib`` would take the running jobs' sum over ``memory_gib``
    (unless nothing else runs); at ``deadline`` (``time.monotonic()``) stop what still runs.
    Returns each job's ``{"status", "seconds"}``: ran, exit N, stopped at the deadline, or not
    started."""
    pending, queue, running = list(jobs), list(chain), []
    result: dict[str, dict] = {}

    def used() -> float:
        return sum(j.gib for j in running)

    try:
        while pending or queue or running:
            if time.monotonic() >= deadline:
                break
            for job in list(pending):
                if sum(j not in chain for j in running) >= slots:
                    break
                if running and used() + job.gib > memory_gib:
                    continue
                pending.remove(job)
                job.start()
                running.append(job)
            if queue and not any(j in chain for j in running) and (
                    not running or used() + queue[0].gib <= memory_gib):
                running.append(queue.pop(0))
                running[-1].start()
            time.sleep(poll_s)
            for job in [j for j in running if j.proc.poll() is not None]:
                running.remove(job)
                rc = job.proc.returncode
                result[job.name] = {"status": "ran" if rc == 0 else f"exit {rc}",
                                    "seconds": job.seconds()}
    finally:
        for job in running:
            job.stop()
            result[job.name] = {"status": "stopped at the deadline", "seconds": job.seconds()}
    for job in pending + queue:
        result[job.name] = {"status": "not started (deadline)", "seconds": 0.0}
    return result


def memory_gib(size: str, tokens: int, batch: str) -> float:
    """GPU memory a configuration is expected to hold, GiB: ``train.batch_size``'s measured
    fit times :data:`GRAPH_MEMORY_FACTOR` (graphed) or 1.2 (an estimate with headroom)."""
    from transformer_nmt.train.batch_size import FIXED_GIB, GIB_PER_1K_TOKENS

    fit = FIXED_GIB[size] + GIB_PER_1K_TOKENS[size] * tokens / 1000
    return fit * (GRAPH_MEMORY_FACTOR if batch == "graphed" else 1.2)


def check_command(key: str, work: Path, smoke: bool) -> list[str]:
    """``gpu_check.py --only key`` with its runs in ``work/gpu_check`` and its report
    ``work/gpu_check/<key>.json``."""
    cmd = [sys.executable, str(REPO / "scripts" / "cluster" / "gpu_check.py"), "--only", key,
           "--work", str(work / "gpu_check"), "--out", str(work / "gpu_check" / key)]
    return cmd + (["--smoke"] if smoke else [])


def check_outcome(key: str, work: Path, job_status: str) -> dict:
    """The check's status, note and figures from its report, or the job's status."""
    report = work / "gpu_check" / f"{key}.json"
    if not report.is_file():
        return {"status": job_status}
    ran = [c for c in json.loads(report.read_text())["checks"]
           if c["note"] != "not run (--only)"]
    entry = ran[0] if ran else {"status": job_status}
    return {k: entry.get(k) for k in ("name", "status", "note", "figures")}


def summary_row(name: str, entry: dict) -> str:
    """One configuration as a row of the markdown table."""
    r = entry.get("result") or {}
    s, p = r.get("speed") or {}, r.get("profile") or {}
    if not s:
        return f"| {name} | {entry['status']} | | | | | | |"
    mfu = f"{s['mfu']:.1%}" if s.get("mfu") else "-"
    busy = (f"{p['kernel_share_of_timed_step']:.1%}" if "kernel_share_of_timed_step" in p
            else "-")
    top = ", ".join(f"`{op[:40]}` {ms}" for op, ms in (p.get("top_host_ops") or [])[:3])
    return (f"| {name} | {entry['status']} | {s['target_tokens_per_s']:,} | {mfu} | {busy} | "
            f"{p.get('host_ms_per_step', '-')} | {s.get('peak_allocated_gib', '-')} | {top} |")


def decode_row(name: str, r: dict) -> str:
    """One toolkit of the decoding part as a row of the markdown table."""
    same = "-" if r.get("same_as_ours") is None else f"{r['same_as_ours']:.3f}"
    passes = ", ".join(f"{x:.2f}" for x in r.get("all_seconds") or [])
    p = r.get("profile") or {}
    busy = f"{p['gpu_busy_share']:.0%}" if p.get("gpu_busy_share") is not None else "-"
    profiled = " | ".join(str(p.get(k) or "-") for k in (
        "wall_ms_per_step", "kernel_ms_per_step", "kernels_per_step", "host_ms_per_step"))
    return (f"| {name} | {r['sentences_per_s']:.1f} | {r['target_tokens_per_s']:,.0f} | "
            f"{r['bleu']:.2f} | {same} | {passes} | {r.get('decoder_calls') or '-'} | "
            f"{profiled} | {busy} |")


def write_report(out: Path, report: dict) -> None:
    """``device_measure.json`` and ``.md`` in ``out`` (each written whole, then renamed)."""
    rows = ["| configuration | status | target tok/s | MFU | kernel time / step | "
            "host ms/step (profiled) | peak GiB | top host ops (ms/step) |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    rows += [summary_row(name, entry) for name, entry in report["configurations"].items()]
    decode = report.get("decode")
    if decode:
        rows += ["", f"decoding test_2016_flickr, beam 4: {decode['status']}", ""]
        if decode.get("toolkits"):
            rows += ["| toolkit | sentences/s | target tok/s | BLEU | same as ours | "
                     "seconds of each pass | decoding steps | profiled: wall ms / step | "
                     "kernel ms / step | kernels / step | host ms / step | GPU busy |",
                     "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
            rows += [decode_row(name, r) for name, r in decode["toolkits"].items()]
            rows += [f"\n{name}: {c['graphs']} graphs compiled, {c['cudagraph_skips']} "
                     "skipped by CUDA graphs" for name, r in decode["toolkits"].items()
                     if (c := r.get("compiler"))]
    if report.get("checks"):
        rows += ["", "gpu_check.py, run during the prewarm phase:", "",
                 "| check | status | note |", "|---|---|---|"]
        rows += [f"| {key} | {c['status']} | {c.get('note') or ''} |"
                 for key, c in report["checks"].items()]
    if report.get("prewarm"):
        rows += ["", "prewarm phase (untimed): " + ", ".join(
            f"{name} {e['status']} ({e['seconds']} s)" for name, e in report["prewarm"].items())]
    for name, text in (("device_measure.json", json.dumps(report, indent=1)),
                       ("device_measure.md", "\n".join(rows) + "\n")):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def run(args: argparse.Namespace) -> int:
    """Install, prepare, prewarm, run the plan and the decoding part; 0 when everything ran,
    else 1."""
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
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        site, data_root = work / "site", work / "data"
        report["installed"] = install_wheels(bundle / "wheels", site)
        sys.path[:0] = [str(site), str(REPO / "src")]  # memory_gib's import
        env = child_env(site)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")  # the prewarm's, read later
        env["NMT_MULTI30K_MIRROR"] = str(mirror)
        if args.smoke:  # the CPU path: one thread per child, as the test suite runs
            env["OMP_NUM_THREADS"] = "1"
        prepare(data_root, mirror, env, args.smoke)
        report["prepare_s"] = round(time.monotonic() - start, 1)
        write_report(out, report)
        if args.prewarm > 0 and (plan or args.checks or "decode" in args.parts):
            report["prewarm"] = prewarm(plan, args, work, data_root, env, out, start)
            print(f"prewarm: {json.dumps(report['prewarm'])}", flush=True)
            report["checks"] = {key: check_outcome(key, work, report["prewarm"].get(
                f"check {key}", {}).get("status", "not run")) for key in args.checks}
            write_report(out, report)
        for size, tokens, batch in plan:
            name = f"{size}-{tokens}-{batch}"
            entry = report["configurations"][name]
            left = args.budget_s - reserve - (time.monotonic() - start)
            if left < args.min_config_s:
                entry["status"] = f"not run: {args.budget_s} s budget spent"
                continue
            folder = work / "profiles" / name
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
            report["decode"] = (run_decode(work, data_root, work, env, args.smoke, left,
                                           args.decode_toolkits)
                                if left >= args.min_config_s else
                                {"status": f"not run: {args.budget_s} s budget spent"})
            print(f"decode: {report['decode']['status']}", flush=True)
            write_report(out, report)
    report["seconds"] = round(time.monotonic() - start, 1)
    write_report(out, report)
    print((out / "device_measure.md").read_text())
    statuses = [e["status"] for e in report["configurations"].values()]
    statuses += [c["status"] for c in report.get("checks", {}).values()]
    if "decode" in report:
        statuses.append(report["decode"]["status"])
    return 0 if all(x in ("ran", "passed") for x in statuses) else 1


def prewarm(plan: list[tuple[str, int, str]], args: argparse.Namespace, work: Path,
            data_root: Path, env: dict[str, str], out: Path, start: float) -> dict:
    """The untimed phase: every configuration of ``plan`` once (``args.prewarm`` at a time,
    within the GPU's memory) to fill Inductor's cache, beside them the decoding part's model
    trained and ``args.checks`` one after another; everything still running at
    ``args.prewarm_s`` seconds after ``start`` is stopped. Each job's status and seconds."""
    jobs = []
    if "decode" in args.parts:
        name, cmd = "decode training", decode_commands(work, data_root, work, args.smoke)[0]
        if "ours_compiled" in args.decode_toolkits.split(","):
            name = "decode training and compiling"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--decode-prewarm", "--work",
                   str(work), *(["--smoke"] if args.smoke else [])]
        jobs.append(Job(name, cmd, work / "logs" / "decode_train.log", env,
                        gib=0.0 if args.smoke else 8.0))
    for size, tokens, batch in plan:
        name = f"{size}-{tokens}-{batch}"
        cmd = profile_command(size, tokens, batch, work / "prewarm" / name, data_root,
                              args.smoke)
        jobs.append(Job(name, cmd, work / "logs" / f"prewarm_{name}.log", env,
                        gib=0.0 if args.smoke else memory_gib(size, tokens, batch)))
    chain = [Job(f"check {key}", check_command(key, work, args.smoke),
                 work / "logs" / f"check_{key}.log", env, gib=0.0 if args.smoke else 10.0)
             for key in args.checks]
    memory = float("inf")
    if not args.smoke:
        import torch

        memory = torch.cuda.get_device_properties(0).total_memory / 2**30 * 0.85
    return run_concurrently(jobs, chain, args.prewarm, memory, start + args.prewarm_s)


def decode_prewarm(work: Path, smoke: bool) -> int:
    """The prewarm phase's decoding job with ``ours_compiled``: train the model (unless its
    checkpoint is there) and decode once, untimed, with the compiled step, so that its graphs
    are in Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) when the decoding part times it. 0
    when both ran."""
    entry = run_decode(work, work / "data", work / "decode_prewarm", dict(os.environ), smoke,
                       24 * 3600.0, "ours_compiled", repeats="1", warmup_sentences="0")
    print(json.dumps(entry), flush=True)
    return 0 if entry["status"] == "ran" else 1


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
    p.add_argument("--work", default=None,
                   help="folder for the data, Inductor's cache, each configuration's files and "
                        "logs (default: a temporary folder, removed at the end)")
    p.add_argument("--prewarm", type=int, default=4,
                   help="configurations compiled at a time before the timed part (0: none)")
    p.add_argument("--prewarm-s", type=float, default=240.0,
                   help="the prewarm phase stops what still runs this many seconds after the "
                        "start")
    p.add_argument("--checks", type=lambda v: [k for k in v.split(",") if k],
                   default=list(CHECKS),
                   help="comma-separated gpu_check.py keys run during the prewarm phase")
    p.add_argument("--decode-toolkits", default=DECODE_TOOLKITS,
                   help="the decoding part's bench_decode.py toolkits (ours_compiled: ours with "
                        "decode.compile, its step compiled in the prewarm phase)")
    p.add_argument("--smoke", action="store_true",
                   help="the CPU path: tiny model, small data, two configurations")
    p.add_argument("--decode-prewarm", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.decode_prewarm:  # the prewarm phase's job, in its own process
        return decode_prewarm(Path(args.work), args.smoke)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
