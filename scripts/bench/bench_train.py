"""Training throughput against the peers: transformer-nmt vs fairseq vs Hugging Face Marian.

One invocation runs the three trainers back to back (same machine state), each in its own
process so that its peak memory is its own:

* ``ours``: the real ``nmt-train`` (experiment multi30k_en_de, the chosen model size) for
  ``--steps`` optimizer steps with ``trainer.log_every_steps=1``; per-step target tokens/s
  and loss come from ``<run>/metrics.jsonl``.
* ``fairseq``: ``fairseq-train --arch transformer`` with the same sizes, shared embeddings,
  label smoothing 0.1, Adam(0.9, 0.98, 1e-9), the same inverse-square-root schedule and
  ``--max-tokens``, on the same sentences and pieces (see bench_common.prepare_fairseq_data);
  per-step ``wps`` and ``loss`` (base 2, converted to nats) from its JSON log.
* ``marian``: ``transformers.MarianMTModel`` configured to the same sizes, trained here
  with our sampler + collate (the same batches as ours), ``torch.optim.Adam`` and
  ``CrossEntropyLoss(label_smoothing=0.1)``.

Tokens/s counts non-pad target tokens (eos included) of full optimizer steps (data,
forward, backward, Adam). The figure per toolkit is the median over the steps after
``--skip`` warm-up steps; the aggregate (tokens / seconds over the same steps) is kept too.
The first ``--steps`` losses of ours and fairseq form the loss-curve check (same data,
same schedule, each toolkit's own Xavier-style initialisation).

MFU (GPU sizes): achieved model FLOP/s / the GPU's peak FLOP/s at the run's precision
(transformer_nmt.model.flops.PEAK_FLOPS, as in train_summary.json and the GPU check), with model
FLOPs per target token from bench_common.training_flops averaged over the training split:

    FLOPs = 6 (P_src sum s_i + P_tgt sum t_i)
            + 12 D (L_e sum s_i^2 + L_d sum t_i^2 + L_d sum s_i t_i)
    P_src = L_e (4 D^2 + 2 D F) + L_d 2 D^2,   P_tgt = L_d (6 D^2 + 2 D F) + D V

Examples::

    .venv-bench/bin/python scripts/bench/bench_train.py                      # CPU tiny, 200 steps
    .venv-bench/bin/python scripts/bench/bench_train.py --steps 12 --marian-steps 6 --skip 2
    .venv-bench/bin/python scripts/bench/bench_train.py --size base --device cuda \\
        --precision bf16 \\
        --steps 300 --marian-steps 100 --max-tokens 8192

Results: ``data/bench/train_<size>_<device>.json`` (curves included) and a Markdown table on
stdout for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

LN2 = math.log(2.0)


# ------------------------------------------------------------------------------ ours


def run_ours(args, out: Path) -> dict:
    """``nmt-train`` for ``args.steps`` steps in a fresh run directory; its per-step metrics."""
    run_dir = out / "ours"
    shutil.rmtree(run_dir, ignore_errors=True)  # a leftover checkpoint would resume
    overrides = [
        "experiment=multi30k_en_de", f"model={args.size}", "name=bench_ours",
        f"model.dropout={bc.DROPOUT[args.size]}",  # the experiment's own value is for its budget
        f"run_dir={run_dir}", f"trainer.max_steps={args.steps}", "trainer.log_every_steps=1",
        "trainer.validate_every_steps=null", "trainer.save_every_steps=null",
        "trainer.save_every_minutes=null", f"trainer.max_tokens={args.max_tokens}",
        f"trainer.warmup_steps={args.warmup}", f"trainer.lr_multiplier={args.lr_multiplier}",
        "trainer.lr_scheduler=inverse_sqrt",  # fairseq's inverse_sqrt, as the peers run
        f"trainer.precision={args.precision}", "trainer.num_workers=0", "trainer.seed=1",
        "trainer.keep_last=1", "trainer.max_time_minutes=null", "trainer.max_epochs=null",
        "trainer.update_freq=1", "trainer.valid_bleu=false", "trainer.patience=null",
        "trainer.compile=false",
    ]
    proc = bc.run_child([bc.venv_tool("nmt-train"), *overrides], out / "ours.log",
                        bc.thread_env(args.threads))
    steps = [json.loads(line) for line in bc.read_lines(run_dir / "metrics.jsonl") if line]
    steps = [s for s in steps if s["split"] == "train"]
    tok_s = [s["tokens_per_s"] for s in steps]
    ntok = [s["tokens_per_s"] * s["seconds_per_step"] for s in steps]
    secs = [s["seconds_per_step"] for s in steps]
    summary = json.loads((run_dir / "train_summary.json").read_text())
    return {
        "tokens_per_s_steps": tok_s, "ntokens_steps": ntok, "seconds_steps": secs,
        "loss_steps": [s["loss"] for s in steps], "peak_rss_mib": proc["peak_rss_mib"],
        "peak_gpu_mib": max((s.get("gpu_mem_gib", 0.0) for s in steps), default=0.0) * 1024
        or None,
        "wall_seconds": proc["seconds"], "parameters": summary.get("parameters"),
        "checkpoint": summary.get("last_checkpoint"),
    }


# --------------------------------------------------------------------------- fairseq


def run_fairseq(args, out: Path, data_bin: Path, vocab: int) -> dict:
    """``fairseq-train`` with matching sizes; per-step wps/loss from its JSON log."""
    d = bc.SIZES[args.size][2]
    peak_lr = args.lr_multiplier * d ** -0.5 * args.warmup ** -0.5
    cmd = bc.fairseq_train_cmd(
        data_bin, args.size, dropout=bc.DROPOUT[args.size], peak_lr=peak_lr, warmup=args.warmup,
        max_tokens=args.max_tokens, log_interval=1,
    ) + ["--max-update", str(args.steps), "--no-save", "--disable-validation"]
    if args.device == "cpu":
        cmd.append("--cpu")
    elif args.precision == "bf16":
        cmd.append("--bf16")
    proc = bc.run_child(cmd, out / "fairseq.log", bc.thread_env(args.threads))
    steps = []
    for line in bc.read_lines(out / "fairseq.log"):
        if "train_inner" in line and "{" in line:
            rec = json.loads(line[line.index("{"):])
            steps.append(rec)
    if not steps:
        raise RuntimeError(f"no train_inner lines in {out / 'fairseq.log'}")
    wps = [float(s["wps"]) for s in steps]
    wpb = [float(s["wpb"]) for s in steps]
    return {
        "tokens_per_s_steps": wps, "ntokens_steps": wpb,
        "seconds_steps": [n / max(w, 1e-9) for n, w in zip(wpb, wps)],
        "loss_steps": [float(s["loss"]) * LN2 for s in steps],  # base 2 -> nats
        "peak_rss_mib": proc["peak_rss_mib"],
        "peak_gpu_mib": None, "wall_seconds": proc["seconds"],
        "fairseq_lr_peak": peak_lr,
    }


# ---------------------------------------------------------------------------- marian


def marian_worker(args) -> None:
    """Train MarianMTModel on our batches for ``args.marian_steps`` steps; write JSON."""
    import torch

    bc.import_transformers()
    from transformers import MarianMTModel

    from transformer_nmt.data.batching import LengthBucketSampler, collate
    from transformer_nmt.train.data import load_split
    from transformer_nmt.train.optim import inverse_sqrt_lr

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    device = torch.device(args.device)
    from transformer_nmt.config import compose

    cfg = compose(["experiment=multi30k_en_de"])
    train_set = load_split(cfg, cfg.data.train_split)
    vocab = int(cfg.data.vocab_size)
    model = MarianMTModel(bc.marian_config(args.size, vocab, dropout=bc.DROPOUT[args.size]))
    model.to(device).train()
    d = bc.SIZES[args.size][2]
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                           fused=True if device.type == "cuda" else None)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda n: inverse_sqrt_lr(n + 1, d, args.warmup, args.lr_multiplier))
    crit = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1, reduction="sum")
    sampler = LengthBucketSampler(train_set.src_sizes, train_set.tgt_sizes, args.max_tokens,
                                  shuffle=True, seed=1)
    sampler.set_epoch(0)
    use_bf16 = args.precision == "bf16"
    tok_s, ntoks, secs, losses = [], [], [], []
    it = iter(sampler)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.marian_steps):
        sync()
        t0 = time.perf_counter()
        try:
            indices = next(it)
        except StopIteration:
            sampler.set_epoch(1)
            it = iter(sampler)
            indices = next(it)
        batch = collate([train_set[i] for i in indices]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=batch.src_tokens,
                           attention_mask=batch.src_tokens.ne(0),
                           decoder_input_ids=batch.tgt_in).logits  # (B, T, V)
        loss = crit(logits.float().reshape(-1, vocab), batch.tgt_out.reshape(-1))  # sum
        (loss / batch.ntokens).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss) / batch.ntokens
        sync()
        dt = time.perf_counter() - t0
        tok_s.append(batch.ntokens / dt)
        ntoks.append(batch.ntokens)
        secs.append(dt)
        losses.append(value)
    bc.write_json(Path(args.worker_out), {
        "tokens_per_s_steps": tok_s, "ntokens_steps": ntoks, "seconds_steps": secs,
        "loss_steps": losses, "peak_rss_mib": bc.peak_rss_mib(),
        "peak_gpu_mib": bc.peak_gpu_mib(),
        "parameters": sum(p.numel() for p in model.parameters()),
    })


def run_marian(args, out: Path) -> dict:
    """:func:`marian_worker` in a child process (its own peak memory)."""
    result = out / "marian.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "marian",
           "--worker-out", str(result), "--size", args.size, "--device", args.device,
           "--precision", args.precision, "--threads", str(args.threads),
           "--max-tokens", str(args.max_tokens), "--marian-steps", str(args.marian_steps),
           "--warmup", str(args.warmup), "--lr-multiplier", str(args.lr_multiplier)]
    proc = bc.run_child(cmd, out / "marian.log", bc.thread_env(args.threads))
    data = json.loads(result.read_text())
    data["wall_seconds"] = proc["seconds"]
    return data


# -------------------------------------------------------------------------- profile


def profile_ours(args) -> None:
    """torch.profiler over ``args.profile`` of our training steps (after 2 warm-up steps).

    Runs our real step in-process: ``train.forward_backward`` (forward, label-smoothed loss,
    backward) then Adam and the schedule, on our batches; prints the top operators by self
    CPU time and the share of the step spent in the output projection + loss.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from transformer_nmt.config import compose
    from transformer_nmt.data.batching import LengthBucketSampler, collate
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.train.data import load_split
    from transformer_nmt.train.optim import build_optimizer, build_scheduler
    from transformer_nmt.train.step import forward_backward

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    cfg = compose(["experiment=multi30k_en_de", f"model={args.size}"])
    train_set = load_split(cfg, "train")
    model = Transformer(cfg.model, vocab_size=int(cfg.data.vocab_size)).train()
    opt = build_optimizer(model, cfg.trainer)
    sched = build_scheduler(opt, int(cfg.model.d_model), cfg.trainer)
    sampler = LengthBucketSampler(train_set.src_sizes, train_set.tgt_sizes, args.max_tokens,
                                  shuffle=True, seed=1)
    it = iter(sampler)

    def step():
        with record_function("data"):
            batch = collate([train_set[i] for i in next(it)])
        with record_function("forward_backward"):
            forward_backward(model, [batch], epsilon=0.1, device=torch.device("cpu"),
                             world_size=1)
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))


# --------------------------------------------------------------------------- summary


def summarize(res: dict, skip: int, flops_per_token: float | None, peak: float | None) -> dict:
    """Median and aggregate tokens/s over the steps after ``skip``; MFU when a peak is known."""
    tok = res["tokens_per_s_steps"][skip:]
    ntok = res["ntokens_steps"][skip:]
    secs = res["seconds_steps"][skip:]
    out = {
        "measured_steps": len(tok),
        "median_tokens_per_s": bc.median(tok),
        "aggregate_tokens_per_s": float(sum(ntok) / sum(secs)) if secs else float("nan"),
        "peak_rss_mib": res.get("peak_rss_mib"),
        "peak_gpu_mib": res.get("peak_gpu_mib"),
        "load_average_before_after": res.get("load_average_before_after"),
    }
    if flops_per_token:
        out["model_tflops_per_s"] = out["median_tokens_per_s"] * flops_per_token / 1e12
        if peak:
            out["mfu"] = out["median_tokens_per_s"] * flops_per_token / peak
    return out


def loss_curve_check(ours: list[float], peer: list[float], window: int = 50) -> dict:
    """Per-window mean losses, their difference, and whether it is within batch noise.

    The two toolkits see different batches, so per-step losses scatter around each curve.
    Noise of a curve = standard deviation of its residual around an 11-step centred moving
    average. In a window of n steps the standard error of the difference of the two window
    means is ``se = sqrt((noise_ours^2 + noise_peer^2) / n)`` (residuals taken as independent);
    the window is "within noise" when ``|mean_diff| <= 2 se`` (z-score at most 2).
    """
    n = min(len(ours), len(peer))
    a, b = np.asarray(ours[:n]), np.asarray(peer[:n])

    def residual(x: np.ndarray) -> np.ndarray:
        k = 11
        pad = np.pad(x, k // 2, mode="edge")
        smooth = np.convolve(pad, np.ones(k) / k, mode="valid")
        return x - smooth

    ra, rb = residual(a), residual(b)
    windows = []
    for lo in range(0, n, window):
        hi = min(lo + window, n)
        mean_diff = float(np.mean(a[lo:hi] - b[lo:hi]))
        na, nb = float(np.std(ra[lo:hi])), float(np.std(rb[lo:hi]))
        se = math.sqrt((na * na + nb * nb) / (hi - lo))
        z = mean_diff / se if se > 0 else float("inf")
        windows.append({
            "steps": f"{lo + 1}-{hi}", "ours_mean": float(np.mean(a[lo:hi])),
            "peer_mean": float(np.mean(b[lo:hi])), "mean_diff": mean_diff,
            "mean_abs_diff": float(np.mean(np.abs(a[lo:hi] - b[lo:hi]))),
            "noise_ours": na, "noise_peer": nb, "se": se, "z": z,
            "within_noise": abs(z) <= 2.0,
        })
    return {"steps": n, "windows": windows,
            "first_step": {"ours": float(a[0]), "peer": float(b[0])} if n else None}


def markdown(results: dict) -> str:
    """The tables for docs/benchmarks.md."""
    lines = []
    s = results["summary"]
    ours = s.get("ours", {}).get("median_tokens_per_s")
    has_mfu = any("mfu" in v for v in s.values())
    head = ("| toolkit | steps measured | median target tok/s | aggregate tok/s | ours / toolkit"
            " | peak RSS MiB |")
    sep = "|---|---:|---:|---:|---:|---:|"
    if has_mfu:
        head += " peak GPU MiB | model TFLOP/s | MFU |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    for name, v in s.items():
        ratio = ours / v["median_tokens_per_s"] if ours else float("nan")
        row = (f"| {name} | {v['measured_steps']} | {v['median_tokens_per_s']:,.0f} | "
               f"{v['aggregate_tokens_per_s']:,.0f} | {ratio:.2f} | {v['peak_rss_mib']:,.0f} |")
        if has_mfu:
            gpu = v.get("peak_gpu_mib")
            row += (f" {gpu:,.0f} |" if gpu else " - |")
            row += (f" {v.get('model_tflops_per_s', float('nan')):.1f} |"
                    f" {v.get('mfu', float('nan')):.1%} |")
        lines.append(row)
    check = results.get("loss_curve")
    if check:
        lines += ["", ("| steps | ours loss (nats) | fairseq loss (nats) | mean diff | "
                       "mean abs diff | noise ours / fairseq | se of diff | z | within noise |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for w in check["windows"]:
            lines.append(
                f"| {w['steps']} | {w['ours_mean']:.3f} | {w['peer_mean']:.3f} | "
                f"{w['mean_diff']:+.3f} | {w['mean_abs_diff']:.3f} | "
                f"{w['noise_ours']:.3f} / {w['noise_peer']:.3f} | {w['se']:.3f} | "
                f"{w['z']:+.1f} | {'yes' if w['within_noise'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(bc.SIZES), default="tiny")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default=None, choices=["fp32", "bf16"],
                   help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of ours and fairseq")
    p.add_argument("--marian-steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=1000,
                   help="warm-up steps of the inverse-sqrt schedule (multi30k recipe: 1000)")
    p.add_argument("--lr-multiplier", type=float, default=2.0)
    p.add_argument("--toolkits", default="ours,fairseq,marian")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", type=int, default=0,
                   help="profile this many of our training steps in-process instead")
    p.add_argument("--worker", choices=["marian"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.precision is None:
        args.precision = "bf16" if args.device == "cuda" else "fp32"
    if args.worker == "marian":
        marian_worker(args)
        return
    if args.profile:
        profile_ours(args)
        return
    out = args.out or bc.BENCH_DIR / f"train_{args.size}_{args.device}"
    out.mkdir(parents=True, exist_ok=True)
    toolkits = args.toolkits.split(",")
    dcfg = bc.data_cfg()
    vocab = int(dcfg.vocab_size)
    from transformer_nmt.config import compose
    from transformer_nmt.train.data import load_split

    train_set = load_split(compose(["experiment=multi30k_en_de"]), "train")
    fpt = bc.flops_per_target_token(args.size, vocab, train_set.src_sizes, train_set.tgt_sizes)
    info = bc.machine_info()
    peak = bc.peak_flops(info["gpu"], args.precision) if args.device == "cuda" else None
    raw: dict[str, dict] = {}
    if "fairseq" in toolkits:
        data_bin = bc.prepare_fairseq_data(dcfg, bc.BENCH_DIR / "fairseq_data", bc.FAIRSEQ_SPLITS)
    for name in toolkits:  # back to back, same conditions
        load_before = bc.machine_info()["load_average"]
        print(f"[bench_train] {name}: start (load {load_before})", flush=True)
        if name == "ours":
            raw[name] = run_ours(args, out)
        elif name == "fairseq":
            raw[name] = run_fairseq(args, out, data_bin, vocab)
        elif name == "marian":
            raw[name] = run_marian(args, out)
        else:
            raise ValueError(f"unknown toolkit {name!r} (ours, fairseq, marian)")
        raw[name]["load_average_before_after"] = [load_before, bc.machine_info()["load_average"]]
        print(f"[bench_train] {name}: {bc.median(raw[name]['tokens_per_s_steps'][args.skip:]):,.0f}"
              f" tok/s (median)", flush=True)
    results = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": info, "machine_after": bc.machine_info()["load_average"],
        "flops_per_target_token": fpt, "peak_flops": peak,
        "summary": {k: summarize(v, args.skip, fpt, peak) for k, v in raw.items()},
        "raw": raw,
    }
    if "ours" in raw and "fairseq" in raw:
        results["loss_curve"] = loss_curve_check(raw["ours"]["loss_steps"],
                                                 raw["fairseq"]["loss_steps"])
    bc.write_json(out / "results.json", results)
    print(f"\n[bench_train] results: {out / 'results.json'}\n")
    print(markdown(results))


if __name__ == "__main__":
    bc.run_main(main)
