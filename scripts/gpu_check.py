"""The acceptance check for a CUDA machine: one command, one report (``make gpu-check``).

On a machine with a CUDA build of torch (README: install it into .venv, then ``make install``)
it runs, each as the pipeline's own commands:

1. the GPU tests (``pytest -m gpu``);
2. ``base`` on Multi30k EN-DE for a few hundred steps in bf16 and in fp16 (the loss must fall;
   fp16 may skip steps only while the loss scale calibrates);
3. a 2-process DDP run (NCCL) when two or more GPUs are visible;
4. ``big`` at the WMT14 presets' ``max_tokens`` (peak memory of a real training step);
5. beam-4 decoding of test_2016_flickr on the GPU (sentences/s) with the bf16 model;
6. the training benchmark against fairseq and Marian (``scripts/bench_train.py``) with MFU,
   when those peers are importable.

It writes ``<out>.md`` and ``<out>.json`` (default ``docs/gpu_check``): the device, the
versions and every figure. Without a CUDA device every GPU part is reported as skipped and the
script exits 0. ``--smoke`` runs the same steps on the CPU with a tiny model and a few steps, to
check that every command of the list still runs (the test suite does this).

    python scripts/gpu_check.py                 # on the GPU machine
    python scripts/gpu_check.py --smoke --out /tmp/gpu_check   # CPU: every command, tiny
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
WMT14_BIG_MAX_TOKENS = 3125
"""``max_tokens`` of the wmt14_*_big presets (configs/experiment/)."""


class Check:
    """One step of the report: a name, a status (passed / failed / skipped), figures, a note."""

    def __init__(self, name: str):
        self.name, self.status, self.figures, self.note = name, "skipped", {}, ""

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "figures": self.figures,
                "note": self.note}


def _run(cmd: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run one command from the repository root; its output goes to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)


def _train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["split"] == "train"]


class GpuCheck:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.smoke = args.smoke
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.cuda = torch.cuda.is_available()
        self.gpus = torch.cuda.device_count() if self.cuda else 0
        self.checks: list[Check] = []

    # -- the pipeline's commands -------------------------------------------------------------
    def _model_args(self, preset: str) -> list[str]:
        if not self.smoke:
            return [f"model={preset}"]
        return ["model=tiny", "model.encoder_layers=1", "model.decoder_layers=1",
                "model.d_model=32", "model.d_ff=64", "model.heads=2"]

    def _train_cmd(self, name: str, precision: str, preset: str = "base",
                   max_tokens: int | None = None, nproc: int = 1) -> tuple[list[str], Path]:
        run_dir = self.work / "runs" / name
        steps = self.args.steps
        args = [
            "experiment=multi30k_en_de", *self._model_args(preset), f"name={name}",
            f"run_dir={run_dir}", f"trainer.precision={precision}",
            f"trainer.max_steps={steps}", "trainer.max_time_minutes=null",
            f"trainer.save_every_steps={steps}", "trainer.save_every_minutes=null",
            f"trainer.validate_every_steps={steps}", f"trainer.log_every_steps={max(steps // 10, 1)}",
            f"trainer.max_tokens={max_tokens or (512 if self.smoke else 4096)}",
            f"trainer.warmup_steps={4 if self.smoke else 100}", "trainer.lr_multiplier=1.0",
        ]
        if self.smoke:
            args += ["data.max_train_pairs=400", "data.vocab_size=200",
                     f"data.root={self.work / 'data'}", "decode.max_len_a=0.5",
                     "decode.max_len_b=5"]
        if nproc > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={nproc}", "-m", "transformer_nmt.cli.train"]
        else:
            launcher = [sys.executable, "-m", "transformer_nmt.cli.train"]
        return [*launcher, *args], run_dir

    def _prepare(self) -> None:
        cmd, _ = self._train_cmd("prepare", "fp32")
        cmd = [sys.executable, "-m", "transformer_nmt.cli.prepare", *cmd[3:]]
        proc = _run(cmd, self.work / "prepare.log", timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"nmt-prepare failed: see {self.work / 'prepare.log'}")

    # -- the checks ----------------------------------------------------------------------------
    def gpu_tests(self, c: Check) -> None:
        if self.smoke:
            c.note = "not run in --smoke (the CPU suite runs them as skips)"
            return
        proc = _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"],
                    self.work / "gpu_tests.log", timeout=1800)
        tail = (self.work / "gpu_tests.log").read_text().strip().splitlines()[-1:]
        c.figures["pytest"] = tail[0] if tail else ""
        c.status = "passed" if proc.returncode == 0 else "failed"

    def train(self, c: Check, precision: str) -> None:
        cmd, run_dir = self._train_cmd(f"gpu_check_{precision}",
                                       "fp32" if self.smoke else precision)
        proc = _run(cmd, self.work / f"train_{precision}.log", timeout=3600)
        records = _train_records(run_dir)
        if proc.returncode != 0 or len(records) < 2:
            c.status, c.note = "failed", f"see {self.work / f'train_{precision}.log'}"
            return
        summary = json.loads((run_dir / "train_summary.json").read_text())
        first, last = records[0], records[-1]
        c.figures.update({
            "steps": summary["steps"], "first_loss": round(first["loss"], 3),
            "last_loss": round(last["loss"], 3), "skipped_steps": summary["skipped_steps"],
            "target_tokens_per_s": round(summary["tokens_seen"] / summary["train_seconds"]),
            "peak_gpu_mem_gib": round(max(r.get("gpu_mem_gib", 0.0) for r in records), 2),
        })
        # fp16: overflow steps are expected only while the loss scale calibrates.
        late_skips = last["skipped_steps"] - records[len(records) // 2]["skipped_steps"]
        ok = last["loss"] < first["loss"] and late_skips == 0
        c.status = "passed" if ok else "failed"
        if not ok:
            c.note = f"loss {first['loss']:.3f} -> {last['loss']:.3f}, late skipped steps {late_skips}"

    def ddp(self, c: Check) -> None:
        if not self.smoke and self.gpus < 2:
            c.note = f"{self.gpus} GPU visible: NCCL needs one GPU per process"
            return
        cmd, run_dir = self._train_cmd("gpu_check_ddp", "fp32" if self.smoke else "bf16",
                                       nproc=2)
        proc = _run(cmd, self.work / "train_ddp.log", timeout=3600)
        c.status = "passed" if proc.returncode == 0 else "failed"
        if proc.returncode == 0:
            summary = json.loads((run_dir / "train_summary.json").read_text())
            c.figures.update({"world_size": summary["world_size"], "steps": summary["steps"],
                              "target_tokens_per_s": round(summary["tokens_seen"]
                                                           / summary["train_seconds"])})

    def big_memory(self, c: Check) -> None:
        saved, self.args.steps = self.args.steps, min(self.args.steps, 30)
        try:
            cmd, run_dir = self._train_cmd("gpu_check_big", "fp32" if self.smoke else "bf16",
                                           preset="big", max_tokens=WMT14_BIG_MAX_TOKENS)
        finally:
            self.args.steps = saved
        proc = _run(cmd, self.work / "train_big.log", timeout=3600)
        records = _train_records(run_dir)
        c.status = "passed" if proc.returncode == 0 and records else "failed"
        if records:
            c.figures["max_tokens"] = WMT14_BIG_MAX_TOKENS
            c.figures["peak_gpu_mem_gib"] = round(max(r.get("gpu_mem_gib", 0.0) for r in records), 2)

    def decode(self, c: Check) -> None:
        run_dir = self.work / "runs" / "gpu_check_bf16"
        if not (run_dir / "checkpoints").is_dir():
            c.note = "no bf16 model (its training failed)"
            return
        cmd, _ = self._train_cmd("gpu_check_bf16", "fp32")
        args = [a for a in cmd[3:] if not a.startswith("trainer.")]
        args += ["average.last=1", "data.test_splits=[test_2016_flickr]",
                 f"decode.device={'cpu' if self.smoke else 'cuda'}",
                 f"decode.precision={'fp32' if self.smoke else 'bf16'}"]
        _run([sys.executable, "-m", "transformer_nmt.cli.average", *args],
             self.work / "average.log", timeout=600)
        start = time.perf_counter()
        proc = _run([sys.executable, "-m", "transformer_nmt.cli.evaluate", *args],
                    self.work / "evaluate.log", timeout=1800)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            c.status, c.note = "failed", f"see {self.work / 'evaluate.log'}"
            return
        results = json.loads((run_dir / "results.json").read_text())
        scores = results["test_sets"]["test_2016_flickr"]
        c.status = "passed"
        c.figures.update({"sentences": scores["sentences"],
                          "sentences_per_s_incl_startup": round(scores["sentences"] / seconds, 1),
                          "sacrebleu": scores["bleu"]["sacrebleu"]["score"]})

    def peers(self, c: Check) -> None:
        missing = [m for m in ("fairseq", "transformers") if not _importable(m)]
        if missing or self.smoke:
            c.note = ("--smoke" if self.smoke else
                      f"not importable: {', '.join(missing)} (make bench-install)")
            return
        out = self.work / "bench_train.json"
        proc = _run([sys.executable, "scripts/bench_train.py", "--device", "cuda", "--size",
                     "base", "--precision", "bf16", "--steps", "200", "--out", str(out)],
                    self.work / "bench_train.log", timeout=3600)
        c.status = "passed" if proc.returncode == 0 else "failed"
        if out.is_file():
            c.figures["bench_train"] = json.loads(out.read_text())

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> dict:
        plan: list[tuple[str, Callable[[Check], None]]] = [
            ("GPU tests (pytest -m gpu)", self.gpu_tests),
            ("base, bf16 training", lambda c: self.train(c, "bf16")),
            ("base, fp16 training", lambda c: self.train(c, "fp16")),
            ("2-process DDP (NCCL)", self.ddp),
            ("big at WMT14 max_tokens: peak memory", self.big_memory),
            ("beam 4 decoding of test_2016_flickr", self.decode),
            ("training benchmark vs fairseq and Marian", self.peers),
        ]
        active = self.cuda or self.smoke
        if active:
            self._prepare()
        for name, fn in plan:
            c = Check(name)
            if active:
                try:
                    fn(c)
                except Exception as e:  # noqa: BLE001 -- one failed step must not hide the others
                    c.status, c.note = "failed", f"{type(e).__name__}: {e}"
            else:
                c.note = "no CUDA device"
            self.checks.append(c)
            print(f"{c.status:>7}  {c.name}  {c.figures or ''} {c.note}", flush=True)
        return {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "device": torch.cuda.get_device_name(0) if self.cuda else f"CPU ({platform.processor() or platform.machine()})",
            "gpus": self.gpus, "smoke": self.smoke,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "cuda": torch.version.cuda, "nccl": _nccl_version()},
            "checks": [c.as_dict() for c in self.checks],
        }


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except (RuntimeError, AttributeError):
        return None


def write_report(report: dict, out: Path) -> None:
    """``<out>.json`` and ``<out>.md``, each written through a temporary file."""
    from transformer_nmt.fileio import atomic_write

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out.with_suffix(".json")) as f:
        json.dump(report, f, indent=2)
    lines = [
        f"# GPU check, {report['date']}", "",
        f"Device: {report['device']} ({report['gpus']} GPU). Versions: "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + "."
        + (" Smoke run on the CPU (tiny model, few steps): commands only, no figures to quote."
           if report["smoke"] else ""),
        "", "Command: `make gpu-check` (`python scripts/gpu_check.py`).", "",
        "| check | status | figures | note |", "|---|---|---|---|",
    ]
    for c in report["checks"]:
        figures = ", ".join(f"{k} {v}" for k, v in c["figures"].items() if k != "bench_train")
        lines.append(f"| {c['name']} | {c['status']} | {figures} | {c['note']} |")
    with atomic_write(out.with_suffix(".md")) as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "docs" / "gpu_check"),
                   help="report path without suffix (.md and .json are written)")
    p.add_argument("--work", default=str(REPO / "runs" / "gpu_check"),
                   help="folder for the check's runs and logs")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each training run")
    p.add_argument("--smoke", action="store_true",
                   help="run every step on the CPU with a tiny model (checks the commands)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps = min(args.steps, 10)
    report = GpuCheck(args).run()
    write_report(report, Path(args.out))
    print(f"report: {Path(args.out).with_suffix('.md')}")
    return 1 if any(c["status"] == "failed" for c in report["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
