"""The acceptance check for a CUDA machine: one command, one report (``make gpu-check``).

On a machine with a CUDA build of torch (README: install it into .venv, then ``make install``)
it runs, each as the pipeline's own commands:

1. the GPU tests (``pytest -m gpu``: every test that needs CUDA carries the mark);
2. ``base`` on Multi30k EN-DE for a few hundred steps in bf16 and in fp16, at the paper's peak
   learning rate (:func:`paper_lr_multiplier`; the loss must fall
   by :data:`MIN_LOSS_DROP` nats and the greedy validation BLEU reach :data:`MIN_VALID_BLEU`, which
   a collapsed model, one output for every input, does not; fp16 may skip steps only while the
   loss scale calibrates);
3. ``base`` compiled (``trainer.compile=true``) with ``update_freq 2``;
4. the bf16 run resumed from its GPU checkpoint for more steps;
4a. eager and compiled training steps on the same batches give the same losses, in fp32 and
   bf16 (:func:`gpu_step_checks.compiled_matches_eager`, within
   :data:`gpu_step_checks.COMPILE_RTOL`);
4b. a run resumed from its checkpoint at step N continues the uninterrupted run's loss curve:
   exactly in fp32, within :data:`gpu_step_checks.RESUME_RTOL` in bf16
   (:func:`gpu_step_checks.resume_continues_curve`);
4c. the whole step as one CUDA graph (``trainer.cuda_graphs``) and the eager packed step from
   the same weights give the same parameters and losses, in fp32 and bf16
   (:func:`gpu_step_checks.graphed_matches_eager`, within :data:`gpu_step_checks.GRAPHED_RTOL`);
5. SIGTERM during a run: a stop checkpoint, exit 0, then a resume from it;
6. 2-process DDP (NCCL) in bf16 and in fp16 when two or more GPUs are visible (reported as
   ``not run`` on one GPU);
7. ``big`` with the WMT14 big preset's settings (:func:`preset_overrides`: dropout, clipping,
   ``tokens_per_step`` and ``auto_max_tokens``, so ``max_tokens`` is the size the run derives on
   this GPU) and vocabulary size: peak memory of a real training step with the real output
   layer;
8. beam-4 decoding of test_2016_flickr on the GPU (sentences/s) with the bf16 model;
9. the training benchmark against fairseq and Marian (``scripts/bench/bench_train.py``) with MFU,
   run
   with the interpreter of ``.venv-bench`` (``make bench-install``) where the peers live.

Every training check reports target tokens/s, MFU (against the GPU's peak at the run's
precision, :data:`transformer_nmt.model.flops.PEAK_FLOPS`), peak memory and the attention
kernels it logged; every command runs with ``TORCH_LOGS=recompiles``, and a compiled run stops
at torch.compile's recompile limit instead of falling back to eager. Each check
starts from an empty run directory: a second ``make gpu-check`` measures again instead of
finding the first one's finished runs.

It writes ``<out>.md`` and ``<out>.json`` (default ``runs/gpu_check/report``, beside the check's
runs; ``make gpu-check GPU_CHECK_OUT=<path>`` for another place): the device, the
versions and every figure. Without a CUDA device every GPU part is reported as skipped and the
script exits 0. ``--smoke`` runs the same steps on the CPU with a tiny model and a few steps, to
check that every command of the list still runs (the test suite does this); it trains in
fp32, so the two fp16 checks, which would repeat the bf16 commands, are skipped there, and so
is the resume check, whose command the SIGTERM check's resume runs too; the two step-level
checks (4a, 4b, 4c) run in fp32 there, 4a with the ``aot_eager`` backend (no C++ build), 4c
with the whole step uncompiled.

    python scripts/cluster/gpu_check.py                 # on the GPU machine
    python scripts/cluster/gpu_check.py --smoke --out /tmp/gpu_check   # CPU: every command, tiny
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
BIG_PRESET = "wmt14_en_de_big"
"""The experiment whose ``trainer.max_tokens`` and ``data.vocab_size`` the big check uses."""
BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"
"""The interpreter with fairseq and transformers (``make bench-install``)."""
PAPER_WARMUP_STEPS = 4000
"""The paper's warm-up (section 5.3): with it the schedule peaks at d_model^-0.5 x 4000^-0.5."""
MIN_LOSS_DROP = 1.0
"""Nats the training loss must fall between the first and the last logged window."""
MIN_VALID_BLEU = 5.0
"""Greedy validation BLEU a real run reaches (a GPU run of a few hundred steps; a model that
collapsed to one output for every input scores about 0)."""


def preset_figures(experiment: str = BIG_PRESET) -> tuple[int, int]:
    """``(trainer.max_tokens, data.vocab_size)`` of ``experiment`` as its preset composes."""
    from transformer_nmt.config import compose

    cfg = compose([f"experiment={experiment}"])
    return int(cfg.trainer.max_tokens), int(cfg.data.vocab_size)


def paper_lr_multiplier(warmup_steps: int) -> float:
    """``trainer.lr_multiplier`` that makes a schedule warmed up over ``warmup_steps`` peak at
    the paper's learning rate (d^-0.5 x min(step^-0.5, step x w^-1.5) peaks at d^-0.5 x w^-0.5,
    so the factor is sqrt(w / 4000))."""
    return (int(warmup_steps) / PAPER_WARMUP_STEPS) ** 0.5


PRESET_TRAINER_KEYS = ("tokens_per_step", "tokens_per_step_tolerance", "auto_max_tokens",
                       "max_tokens", "clip_norm", "label_smoothing")
"""The trainer settings of a preset the big check takes over (the schedule's length is the
check's own)."""


def preset_overrides(experiment: str = BIG_PRESET) -> list[str]:
    """Overrides that give a Multi30k run ``experiment``'s model (dropout included) and the
    trainer settings that size and regularise its step (:data:`PRESET_TRAINER_KEYS`)."""
    import dataclasses

    from transformer_nmt.config import compose

    cfg = compose([f"experiment={experiment}"])

    def value(v):  # YAML spelling: null, the Enum's value
        return "null" if v is None else getattr(v, "value", v)

    model = [f"model.{f.name}={value(getattr(cfg.model, f.name))}"
             for f in dataclasses.fields(cfg.model)
             if not isinstance(getattr(cfg.model, f.name), (dict, list))]
    return model + [f"trainer.{k}={value(getattr(cfg.trainer, k))}" for k in PRESET_TRAINER_KEYS]


def _logged(log: Path, marker: str) -> str | None:
    """The first line of ``log`` holding ``marker``, from the marker on."""
    if not log.is_file():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if marker in line:
            return line[line.index(marker):].strip()
    return None


def training_passed(records: list[dict], valid: dict, smoke: bool) -> tuple[bool, str]:
    """Whether a training check passed, and why not: the loss fell by :data:`MIN_LOSS_DROP`
    (the smoke run: fell at all), fp16 skipped no step in the second half, and the validation
    BLEU is at least :data:`MIN_VALID_BLEU` (not checked in the smoke run)."""
    first, last = records[0], records[-1]
    late_skips = last["skipped_steps"] - records[len(records) // 2]["skipped_steps"]
    drop = first["loss"] - last["loss"]
    why = []
    if drop <= 0 or (not smoke and drop < MIN_LOSS_DROP):
        why.append(f"loss {first['loss']:.3f} -> {last['loss']:.3f}")
    if late_skips:
        why.append(f"late skipped steps {late_skips}")
    bleu = valid.get("bleu")
    if not smoke and (bleu is None or bleu < MIN_VALID_BLEU):
        why.append(f"validation BLEU {bleu} < {MIN_VALID_BLEU} (a collapsed model?)")
    return not why, "; ".join(why)


def speed_figures(run_dir: Path, records: list[dict]) -> dict:
    """tokens/s (median of the logged windows after the first), MFU and peak memory of a run."""
    from transformer_nmt.model.flops import peak_flops

    summary = json.loads((run_dir / "train_summary.json").read_text())
    windows = records[1:] or records
    tok_s = sorted(r["tokens_per_s"] for r in windows)[len(windows) // 2] if windows else 0.0
    flops_per_token = summary["flops"] / max(summary["tokens_seen"], 1)
    peak = peak_flops(summary["device"], summary["precision"])
    out = {"steps": summary["steps"], "target_tokens_per_s": round(tok_s),
           "mfu": round(tok_s * flops_per_token / (peak * summary["world_size"]), 3)
           if peak else None,
           "peak_gpu_mem_gib": round(max((r.get("gpu_mem_gib", 0.0) for r in records),
                                         default=0.0), 2)}
    return out


CHECK_KEYS = ("tests", "bf16", "fp16", "compiled", "resume", "compile_eager", "resume_curve",
              "graphs_eager", "sigterm", "ddp_bf16", "ddp_fp16", "big", "decode", "peers")
"""The checks' keys for ``--only``, in the order they run."""


class Check:
    """One step of the report: a name, a status (passed / failed / skipped), figures, a note."""

    def __init__(self, name: str):
        self.name, self.status, self.figures, self.note = name, "skipped", {}, ""

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "figures": self.figures,
                "note": self.note}


def _run(cmd: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run one command from the repository root; its output goes to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_LOGS": "recompiles"}
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
                   max_tokens: int | None = None, nproc: int = 1, fresh: bool = True,
                   extra: tuple[str, ...] = ()) -> tuple[list[str], Path]:
        """The nmt-train command of one check; ``fresh``: empty its run directory first."""
        run_dir = self.work / "runs" / name
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        steps = self.args.steps
        args = [
            "experiment=multi30k_en_de", *self._model_args(preset), f"name={name}",
            f"run_dir={run_dir}", f"trainer.precision={precision}",
            f"trainer.max_steps={steps}", "trainer.max_time_minutes=null",
            f"trainer.save_every_steps={steps}", "trainer.save_every_minutes=null",
            f"trainer.validate_every_steps={steps}",
            f"trainer.log_every_steps={max(steps // 10, 1)}",
            f"trainer.max_tokens={max_tokens or (512 if self.smoke else 4096)}",
            f"trainer.warmup_steps={4 if self.smoke else 100}",
            f"trainer.lr_multiplier={1.0 if self.smoke else paper_lr_multiplier(100):.6g}",
            "trainer.lr_scheduler=inverse_sqrt",  # the paper's; the resume checks go on longer
            "trainer.valid_bleu=true",
            f"trainer.valid_bleu_sentences={20 if self.smoke else 200}", *extra,
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
        cmd, _ = self._train_cmd("prepare", "fp32", fresh=False)
        cmd = [sys.executable, "-m", "transformer_nmt.cli.prepare", *cmd[3:]]
        proc = _run(cmd, self.work / "prepare.log", timeout=1800)
        if proc.returncode != 0:
            log = self.work / "prepare.log"
            errors = [line for line in log.read_text(errors="replace").splitlines()
                      if line.startswith("error:")]
            why = f" ({errors[-1]})" if errors else ""
            raise RuntimeError(f"nmt-prepare failed{why}: see {log}")

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

    def train(self, c: Check, precision: str, name: str | None = None,
              extra: tuple[str, ...] = ()) -> None:
        if self.smoke and precision == "fp16":
            c.note = "--smoke trains in fp32 on the CPU: the bf16 run's command again"
            return
        name = name or f"gpu_check_{precision}"
        cmd, run_dir = self._train_cmd(name, "fp32" if self.smoke else precision, extra=extra)
        proc = _run(cmd, self.work / f"{name}.log", timeout=3600)
        self._judge(c, proc.returncode, run_dir, self.work / f"{name}.log")

    def _judge(self, c: Check, returncode: int, run_dir: Path, log: Path) -> None:
        records = _train_records(run_dir)
        if returncode != 0 or len(records) < 2:
            c.status, c.note = "failed", f"see {log}"
            return
        summary = json.loads((run_dir / "train_summary.json").read_text())
        c.figures.update(speed_figures(run_dir, records))
        c.figures.update({"first_loss": round(records[0]["loss"], 3),
                          "last_loss": round(records[-1]["loss"], 3),
                          "skipped_steps": summary["skipped_steps"],
                          "valid_bleu": summary["valid"].get("bleu")})
        kernels = _logged(log, "attention kernels")
        if kernels:
            c.figures["attention"] = kernels
        ok, why = training_passed(records, summary["valid"], self.smoke)
        c.status, c.note = ("passed" if ok else "failed"), why

    def compiled(self, c: Check) -> None:
        self.train(c, "bf16", name="gpu_check_compiled",
                   extra=("trainer.compile=true" if not self.smoke else "trainer.compile=false",
                          "trainer.update_freq=2"))
        c.figures["update_freq"] = 2
        if self.smoke:
            c.note = (c.note + "; " if c.note else "") + "compile off in --smoke (CPU)"

    def resume(self, c: Check) -> None:
        """The bf16 run's last checkpoint (written on the GPU) resumed for more steps."""
        if self.smoke:
            c.note = "--smoke: the SIGTERM check resumes a CPU run the same way"
            return
        steps = self.args.steps
        cmd, run_dir = self._train_cmd("gpu_check_bf16", "fp32" if self.smoke else "bf16",
                                       fresh=False)
        if not (run_dir / "train_summary.json").is_file():
            c.note = "no bf16 run to resume"
            return
        more = steps + max(steps // 5, 2)
        cmd = ([a for a in cmd if not a.startswith("trainer.max_steps=")]
               + [f"trainer.max_steps={more}"])
        proc = _run(cmd, self.work / "resume.log", timeout=3600)
        summary = json.loads((run_dir / "train_summary.json").read_text())
        ok = proc.returncode == 0 and summary["steps"] == more and summary["resumed_from"]
        c.status = "passed" if ok else "failed"
        c.figures.update(speed_figures(run_dir, _train_records(run_dir)[-max(more - steps, 2):]))
        c.figures["resumed_from"] = Path(summary["resumed_from"] or "").name
        if not ok:
            c.note = f"see {self.work / 'resume.log'}"

    def _step_check(self, c: Check, name: str, precisions: tuple[str, ...],
                    **kwargs) -> None:
        """Run :mod:`gpu_step_checks`' ``name`` for each precision in a worker process (its
        own CUDA memory and compiler state) and record its figures."""
        why = []
        for precision in precisions:
            cmd, _ = self._train_cmd(f"gpu_check_{name}", precision, fresh=False)
            result = self.work / f"{name}_{precision}.json"
            result.unlink(missing_ok=True)
            spec = {"precision": precision, **kwargs}
            if name == "resume_continues_curve":
                spec["work"] = str(self.work / "runs" / f"gpu_check_resume_curve_{precision}")
            worker = [sys.executable, str(Path(__file__).resolve()), "--step-check", name,
                      "--step-check-args", json.dumps(spec), "--step-check-result", str(result),
                      "--", *cmd[3:]]
            log = self.work / f"{name}_{precision}.log"
            proc = _run(worker, log, timeout=3600)
            if proc.returncode != 0 or not result.is_file():
                why.append(f"{precision}: exit {proc.returncode}, see {log}")
                continue
            got = json.loads(result.read_text())
            c.figures[precision] = {k: (round(v, 8) if isinstance(v, float) else v)
                                    for k, v in got.items()
                                    if k in ("max_rel_diff", "rtol", "first_step_exact",
                                             "grad_norm_rel_diff", "backend", "n", "m",
                                             "param_rel_diff", "compile")}
            if not got["passed"]:
                why.append(f"{precision}: {got['why']}")
        c.status = "failed" if why else "passed"
        c.note = "; ".join(why)

    def compile_equals_eager(self, c: Check) -> None:
        """4a: eager and compiled steps, same batches, same losses (fp32 and bf16)."""
        if self.smoke:
            self._step_check(c, "compiled_matches_eager", ("fp32",), backend="aot_eager")
            c.note = (c.note + "; " if c.note else "") + "--smoke: aot_eager backend, fp32"
            return
        self._step_check(c, "compiled_matches_eager", ("fp32", "bf16"), backend="inductor")

    def graphs_equal_eager(self, c: Check) -> None:
        """4c: the whole step (``trainer.cuda_graphs``, a CUDA graph) and the eager packed
        step from the same weights on the same batches (fp32 and bf16)."""
        if self.smoke:
            self._step_check(c, "graphed_matches_eager", ("fp32",), compile=False)
            c.note = (c.note + "; " if c.note else "") + "--smoke: the whole step uncompiled"
            return
        self._step_check(c, "graphed_matches_eager", ("fp32", "bf16"))

    def resume_curve(self, c: Check) -> None:
        """4b: a run resumed at step N against an uninterrupted N + M run (fp32, bf16)."""
        if self.smoke:
            self._step_check(c, "resume_continues_curve", ("fp32",), n=4, m=3)
            return
        self._step_check(c, "resume_continues_curve", ("fp32", "bf16"), n=20, m=10)

    def sigterm(self, c: Check) -> None:
        """SIGTERM once the first checkpoint exists: exit 0 with a stop checkpoint, then resume."""
        import signal

        steps = self.args.steps
        cmd, run_dir = self._train_cmd("gpu_check_sigterm", "fp32" if self.smoke else "bf16",
                                       extra=("trainer.save_every_steps=2",))
        cmd = [a for a in cmd if not a.startswith("trainer.max_steps=")] + [
            f"trainer.max_steps={steps * 100}"]
        log = self.work / "sigterm.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 1800
            while not list((run_dir / "checkpoints").glob("checkpoint_*.pt")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    c.status, c.note = "failed", f"no checkpoint before the signal: see {log}"
                    return
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            returncode = proc.wait(timeout=600)
        summary = json.loads((run_dir / "train_summary.json").read_text())
        stopped = summary["stopped_by"]
        again = cmd[:-1] + [f"trainer.max_steps={summary['steps'] + 2}"]
        proc2 = _run(again, self.work / "sigterm_resume.log", timeout=1800)
        resumed = json.loads((run_dir / "train_summary.json").read_text())
        ok = (returncode == 0 and stopped == "signal SIGTERM" and proc2.returncode == 0
              and resumed["steps"] == summary["steps"] + 2 and resumed["resumed_from"])
        c.status = "passed" if ok else "failed"
        c.figures.update(speed_figures(run_dir, _train_records(run_dir)))
        c.figures.update({"stopped_by": stopped, "stopped_at_step": summary["steps"]})
        if not ok:
            c.note = f"exit {returncode}, stopped by {stopped}: see {log}"

    def ddp(self, c: Check, precision: str = "bf16") -> None:
        if not self.smoke and self.gpus < 2:
            c.status = "not run"
            c.note = f"{self.gpus} GPU visible: NCCL needs one GPU per process"
            return
        if self.smoke and precision == "fp16":
            c.note = "--smoke trains in fp32 on the CPU: the bf16 run's command again"
            return
        name = f"gpu_check_ddp_{precision}"
        cmd, run_dir = self._train_cmd(name, "fp32" if self.smoke else precision, nproc=2)
        proc = _run(cmd, self.work / f"{name}.log", timeout=3600)
        self._judge(c, proc.returncode, run_dir, self.work / f"{name}.log")
        if proc.returncode == 0:
            summary = json.loads((run_dir / "train_summary.json").read_text())
            c.figures["world_size"] = summary["world_size"]

    def big_memory(self, c: Check) -> None:
        """``big`` with the big preset's settings (:func:`preset_overrides`: on the GPU
        ``max_tokens`` is what ``auto_max_tokens`` derives for ``tokens_per_step``, the size
        the real run trains at) and its vocabulary size (the model is built with it: the
        output layer and the loss are the real run's), bf16, 30 steps. ``--smoke``: the
        preset's ``max_tokens``, one micro-batch a step, 2 steps (a 37k-class output layer in
        fp32 on the CPU costs seconds a step)."""
        max_tokens, vocab = preset_figures()
        saved, self.args.steps = self.args.steps, min(self.args.steps, 2 if self.smoke else 30)
        try:
            extra = (("trainer.validate_every_steps=null", "trainer.valid_bleu=false")
                     if self.smoke else
                     (*preset_overrides(), "trainer.precision=bf16",
                      f"trainer.lr_multiplier={paper_lr_multiplier(100):.6g}"))
            cmd, run_dir = self._train_cmd("gpu_check_big", "fp32" if self.smoke else "bf16",
                                           preset="big", max_tokens=max_tokens, extra=extra)
        finally:
            self.args.steps = saved
        worker = [sys.executable, str(Path(__file__).resolve()), "--train-with-vocab", str(vocab),
                  "--", *cmd[3:]]
        proc = _run(worker, self.work / "train_big.log", timeout=3600)
        records = _train_records(run_dir)
        c.status = "passed" if proc.returncode == 0 and records else "failed"
        if records:
            c.figures.update(speed_figures(run_dir, records))
            summary = json.loads((run_dir / "train_summary.json").read_text())
            c.figures.update({"max_tokens": summary.get("max_tokens", max_tokens),
                              "update_freq": summary.get("update_freq"),
                              "model_vocab_size": vocab})
            kernels = _logged(self.work / "train_big.log", "attention kernels")
            if kernels:
                c.figures["attention"] = kernels

    def decode(self, c: Check) -> None:
        run_dir = self.work / "runs" / "gpu_check_bf16"
        if not (run_dir / "checkpoints").is_dir():
            c.note = "no bf16 model (its training failed)"
            return
        cmd, _ = self._train_cmd("gpu_check_bf16", "fp32", fresh=False)
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
        python = bench_python()
        if python is None or self.smoke:
            c.note = ("--smoke" if self.smoke else
                      f"no {BENCH_PYTHON} with fairseq and transformers (make bench-install)")
            return
        out = self.work / "bench_train.json"
        out.unlink(missing_ok=True)
        proc = _run([str(python), "scripts/bench/bench_train.py", "--device", "cuda", "--size",
                     "base", "--precision", "bf16", "--steps", "200", "--out", str(out)],
                    self.work / "bench_train.log", timeout=3600)
        c.status = "passed" if proc.returncode == 0 else "failed"
        if out.is_file():
            c.figures["bench_train"] = json.loads(out.read_text())

    # -- driver ------------------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, str, Callable[[Check], None]]]:
        """The checks in order: ``(key for --only, name, function)``; the keys are
        :data:`CHECK_KEYS`."""
        plan = [
            ("tests", "GPU tests (pytest -m gpu)", self.gpu_tests),
            ("bf16", "base, bf16 training", lambda c: self.train(c, "bf16")),
            ("fp16", "base, fp16 training", lambda c: self.train(c, "fp16")),
            ("compiled", "base, bf16, compiled, update_freq 2", self.compiled),
            ("resume", "resume the bf16 run from its GPU checkpoint", self.resume),
            ("compile_eager", "compiled steps equal eager steps on the same batches",
             self.compile_equals_eager),
            ("resume_curve", "a resumed run continues the uninterrupted loss curve",
             self.resume_curve),
            ("graphs_eager", "the whole step as a CUDA graph equals the eager packed step",
             self.graphs_equal_eager),
            ("sigterm", "SIGTERM: stop checkpoint, then resume", self.sigterm),
            ("ddp_bf16", "2-process DDP (NCCL), bf16", lambda c: self.ddp(c, "bf16")),
            ("ddp_fp16", "2-process DDP (NCCL), fp16", lambda c: self.ddp(c, "fp16")),
            ("big", "big at the WMT14 preset's max_tokens and vocabulary: peak memory",
             self.big_memory),
            ("decode", "beam 4 decoding of test_2016_flickr", self.decode),
            ("peers", "training benchmark vs fairseq and Marian", self.peers),
        ]
        assert tuple(key for key, _, _ in plan) == CHECK_KEYS
        return plan

    def run(self) -> dict:
        plan = self.plan()
        active = self.cuda or self.smoke
        if active:
            self._prepare()
        for key, name, fn in plan:
            c = Check(name)
            only = getattr(self.args, "only", None)
            if only and key not in only:
                c.note = "not run (--only)"
            elif active:
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
            "device": (torch.cuda.get_device_name(0) if self.cuda
                       else f"CPU ({platform.processor() or platform.machine()})"),
            "gpus": self.gpus, "smoke": self.smoke,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "cuda": torch.version.cuda, "nccl": _nccl_version()},
            "checks": [c.as_dict() for c in self.checks],
        }


def bench_python(path: Path = BENCH_PYTHON) -> Path | None:
    """``path`` when it is an interpreter that imports fairseq and transformers, else None."""
    if not path.is_file():
        return None
    proc = subprocess.run([str(path), "-c", "import fairseq, transformers"], check=False,
                          capture_output=True, timeout=300)
    return path if proc.returncode == 0 else None


def step_check(name: str, spec: dict, overrides: list[str], result: Path) -> None:
    """Run :mod:`gpu_step_checks`' check ``name`` on this machine's training device with the
    arguments ``spec`` and write its figures to ``result`` (JSON)."""
    import gpu_step_checks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    fn = {"compiled_matches_eager": gpu_step_checks.compiled_matches_eager,
          "graphed_matches_eager": gpu_step_checks.graphed_matches_eager,
          "resume_continues_curve": gpu_step_checks.resume_continues_curve}[name]
    result.write_text(json.dumps(fn(overrides, device=device, **spec), indent=1))


def train_with_vocab(vocab: int, overrides: list[str]) -> None:
    """nmt-train's run of ``overrides`` with the model built for at least ``vocab`` classes
    (``train(..., model_vocab_size=)``, what a dry run does)."""
    from transformer_nmt.config import compose
    from transformer_nmt.train.loop import train

    train(compose(overrides), model_vocab_size=vocab)


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
        "", "Command: `make gpu-check` (`python scripts/cluster/gpu_check.py`).", "",
        "| check | status | figures | note |", "|---|---|---|---|",
    ]
    for c in report["checks"]:
        figures = ", ".join(f"{k} {v}" for k, v in c["figures"].items() if k != "bench_train")
        lines.append(f"| {c['name']} | {c['status']} | {figures} | {c['note']} |")
    with atomic_write(out.with_suffix(".md")) as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "runs" / "gpu_check" / "report"),
                   help="report path without suffix (.md and .json are written)")
    p.add_argument("--work", default=str(REPO / "runs" / "gpu_check"),
                   help="folder for the check's runs and logs")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each training run")
    p.add_argument("--only", type=lambda v: [k for k in v.split(",") if k], default=None,
                   help="comma-separated keys of the checks to run (GpuCheck.plan: bf16, big, "
                        "decode, ...); the others are reported as not run")
    p.add_argument("--smoke", action="store_true",
                   help="run every step on the CPU with a tiny model (checks the commands)")
    p.add_argument("--train-with-vocab", type=int, metavar="V",
                   help="internal: train the overrides after -- with a V-class model")
    p.add_argument("--step-check", choices=("compiled_matches_eager", "graphed_matches_eager",
                                            "resume_continues_curve"),
                   help="internal: run one check of gpu_step_checks on the overrides after --")
    p.add_argument("--step-check-args", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--step-check-result", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.step_check:
        step_check(args.step_check, json.loads(args.step_check_args), args.overrides,
                   Path(args.step_check_result))
        return 0
    if args.train_with_vocab:
        train_with_vocab(args.train_with_vocab, args.overrides)
        return 0
    unknown = sorted(set(args.only or ()) - set(CHECK_KEYS))
    if unknown:
        p.error(f"--only: unknown check(s) {', '.join(unknown)}")
    if args.smoke:
        args.steps = min(args.steps, 10)
    report = GpuCheck(args).run()
    write_report(report, Path(args.out))
    print(f"report: {Path(args.out).with_suffix('.md')}")
    return 1 if any(c["status"] == "failed" for c in report["checks"]) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError) as e:  # one line naming the log, no traceback
        sys.exit(f"error: {str(e).strip().splitlines()[0]}")
