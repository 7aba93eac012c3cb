"""The training step on a GPU, measured in-process: speed, MFU, memory and where the time goes.

For each model size (``base``, ``big``) at the WMT14 presets' settings (dropout, label
smoothing, clipping, the presets' 37k vocabulary for the output layer and the loss, bf16
autocast, ``torch.compile`` with Inductor, fused Adam), on real length-bucketed batches of the
prepared Multi30k EN-DE training split (``make data``; its sentences are shorter than
WMT14's), with the training loop's own pieces (``train.step.forward_backward``,
``grad_norm_``, ``step_optimizer``):

1. **speed**: after ``--warmup`` steps (compilation included), ``--steps`` timed optimizer
   steps at ``--max-tokens`` padded tokens per batch (the presets' tokens per GPU): target
   tokens/s, MFU against the device's dense peak at the precision
   (:func:`transformer_nmt.model.flops.peak_flops`, the project's one peak table), peak memory
   allocated and reserved, graphs compiled, the attention backend the model chose;
2. **profile**: ``--profile-steps`` more steps under ``torch.profiler``; the GPU kernel time by
   kind (attention, matrix products, the label-smoothed loss, the optimizer, the rest), the
   share of the steps' wall time the GPU was idle (host gaps) and the host's own time by op;
3. **loss**: the compiled label-smoothed loss alone, forward and backward, on (N, V) logits with
   N the mean real target tokens of the timed batches (CUDA events, median of 20);
4. **memory**: peak memory of steps on the longest batches at each ``--memory-tokens`` budget,
   fitted as ``fixed + per_1k x padded tokens / 1000`` GiB: the constants of
   ``trainer.auto_max_tokens`` (:mod:`transformer_nmt.train.batch_size`).

Writes ``<out>/gpu_profile.json`` and ``<out>/gpu_profile.md`` (the table and the host's
time by op) and prints both. Batches are pinned on a GPU, as nmt-train's DataLoader pins
them. ``--smoke`` runs every part on the CPU
with a tiny model and ``aot_eager`` (no C++ build), the test suite's check of the script.

    python scripts/cluster/gpu_profile.py --out runs/gpu_profile            # on the GPU
    python scripts/cluster/gpu_profile.py --smoke --out /tmp/gpu_profile    # CPU, tiny
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

SCRIPTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(SCRIPTS / "bench"), str(SCRIPTS / "micro")]
import bench_common as bc  # noqa: E402  (scripts/bench, on the path above)
import bench_loss  # noqa: E402  (scripts/micro)

from transformer_nmt.config import PAD_ID, compose  # noqa: E402
from transformer_nmt.data.batching import LengthBucketSampler, collate  # noqa: E402
from transformer_nmt.data.packing import PackedSampler, collate_packed  # noqa: E402
from transformer_nmt.model.flops import TokenCounts, peak_flops, training_flops  # noqa: E402
from transformer_nmt.model.transformer import Transformer  # noqa: E402
from transformer_nmt.runtime import autocast_context  # noqa: E402
from transformer_nmt.train.data import load_split  # noqa: E402
from transformer_nmt.train.distributed import DistInfo  # noqa: E402
from transformer_nmt.train.loss import label_smoothed_nll_loss  # noqa: E402
from transformer_nmt.train.optim import build_optimizer, build_scheduler  # noqa: E402
from transformer_nmt.train.setup import (  # noqa: E402
    packed_attention_kind,
    resolve_pack_length,
    wrap_model,
)
from transformer_nmt.train.step import forward_backward, grad_norm_, step_optimizer  # noqa: E402
from transformer_nmt.train.whole_step import WholeStep  # noqa: E402

PRESETS = {"base": "wmt14_en_de_base", "big": "wmt14_en_de_big"}
SMOKE_DATA = ("data.max_train_pairs=400", "data.vocab_size=200")
"""The data of ``--smoke`` (prepare it with ``nmt-prepare experiment=multi30k_en_de`` and these)."""


def config_for(size: str, args: argparse.Namespace):
    """Config of a Multi30k run with the WMT14 preset's model and regularisation (``args``'
    overrides last), and the model's vocabulary: the preset's (37k) or the data's if larger."""
    preset = compose([f"experiment={PRESETS[size]}"])
    overrides = ["experiment=multi30k_en_de", f"data.root={args.data_root}",
                 f"trainer.precision={args.precision}"]
    if args.smoke:
        overrides += ["model=tiny", "model.d_model=32", "model.d_ff=64", "model.heads=2",
                      "model.encoder_layers=1", "model.decoder_layers=1", *SMOKE_DATA]
    else:
        overrides += [f"model={size}", f"model.dropout={preset.model.dropout}",
                      f"trainer.label_smoothing={preset.trainer.label_smoothing}",
                      f"trainer.clip_norm={preset.trainer.clip_norm}"]
    cfg = compose([*overrides, *args.overrides])
    vocab = max(int(cfg.data.vocab_size), 0 if args.smoke else int(preset.data.vocab_size))
    return cfg, vocab


def batches_for(cfg, max_tokens: int, count: int, pad: int, longest: bool = False,
                pin: bool = False, packing: bool = False) -> list:
    """``count`` training batches of ``max_tokens`` padded tokens in the loop's order (the
    first ones of epoch 1), or the ``count`` with the most padded tokens (``longest``; packed
    batches all have one shape, so ``longest`` does not apply to them); packed as
    ``trainer.packing`` packs them (:class:`PackedSampler`, the run's one (rows, pack_length)
    shape) with ``packing``; in page-locked memory with ``pin``, as nmt-train's DataLoader
    gives them on a GPU (``pin_memory=True``), so that their copies to the device do not wait
    for it."""
    data = load_split(cfg, cfg.data.train_split)
    if packing:
        sampler = PackedSampler(data.src_sizes, data.tgt_sizes, max_tokens,
                                pack_length=resolve_pack_length(cfg, data), shuffle=True,
                                seed=1)
        rows, length = sampler.shape
        batches = [collate_packed([data[j] for j in b], rows=rows, length=length)
                   for b in epochs(sampler, count)[:count]]
        return [b.pin_memory() for b in batches] if pin else batches
    sampler = LengthBucketSampler(data.src_sizes, data.tgt_sizes, max_tokens, shuffle=True,
                                  seed=1, pad_to_multiple=pad)
    index = list(sampler) if longest else epochs(sampler, count)
    if longest:
        index.sort(key=lambda b: -len(b) * max(int(data.tgt_sizes[j]) for j in b))
    batches = [collate([data[j] for j in b], pad_to_multiple=pad) for b in index[:count]]
    return [b.pin_memory() for b in batches] if pin else batches


def epochs(sampler: LengthBucketSampler, count: int) -> list[list[int]]:
    """The sampler's batches of epochs 0, 1, ... in the loop's order until there are at least
    ``count`` (a large ``max_tokens`` on a small corpus gives few batches per epoch)."""
    index: list[list[int]] = []
    epoch = 0
    while len(index) < count:
        sampler.set_epoch(epoch)
        got = list(sampler)
        if not got:
            break
        index += got
        epoch += 1
    return index


class Trainer:
    """Model, compiled wrapper, optimizer and autocast of one size; :meth:`step` is one
    optimizer step of the training loop (forward, loss, backward, clip, Adam); on packed
    batches (``packing``) through :meth:`Transformer.forward_packed` with the attention
    nmt-train chooses (:func:`packed_attention_kind`); with ``cuda_graphs`` (packed batches
    only) the whole step as one compiled function, a CUDA graph on CUDA
    (:class:`~transformer_nmt.train.whole_step.WholeStep`, ``trainer.cuda_graphs``)."""

    def __init__(self, cfg, vocab: int, device: torch.device, backend: str,
                 packing: bool = False, cuda_graphs: bool = False):
        from torch._dynamo.utils import counters

        counters.clear()  # graphs_compiled counts this size's graphs
        torch.manual_seed(1)
        self.cfg, self.device = cfg, device
        self.model = Transformer(cfg.model, vocab_size=vocab).to(device).train()
        self.model.set_sdpa_backends(list(cfg.trainer.sdpa_backends))
        self.packing = packing
        if packing:
            self.model.set_packed_attention(  # as nmt-train: dense under the whole step
                packed_attention_kind(cfg, device, compiled=not cuda_graphs))
        info = DistInfo(rank=0, world_size=1, local_rank=0, device=device)
        self.wrapped = wrap_model(self.model, info, compile=True, backend=backend)
        self.optimizer = build_optimizer(self.model, cfg.trainer)
        for group in self.optimizer.param_groups:
            group["lr"] = 1e-4
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.pad = 8 if device.type == "cuda" else 1
        self.whole = None
        self.whole_args = None
        if cuda_graphs:
            if not packing:
                raise ValueError("--cuda-graphs needs --packing (one static batch shape)")
            scheduler = build_scheduler(self.optimizer, cfg.model.d_model, cfg.trainer)
            self.whole_args = (self.model, self.optimizer, scheduler, cfg.trainer)
            self.backend = backend
            self.autocast = lambda: autocast_context(cfg.trainer.precision, device)

    def step(self, batch) -> torch.Tensor:
        if self.whole_args is not None:
            if self.whole is None:  # the run's one shape is the first batch's
                self.whole = WholeStep(*self.whole_args, tuple(batch.src_tokens.shape),
                                       self.device, self.autocast, compile=True,
                                       backend=self.backend)
            return self.whole.launch([batch]).figures[5]  # the loss sum, read after a sync
        out = forward_backward(
            self.wrapped, [batch], epsilon=float(self.cfg.trainer.label_smoothing),
            device=self.device, world_size=1,
            autocast=lambda: autocast_context(self.cfg.trainer.precision, self.device),
            pad_to_multiple=self.pad,
            packed_shape=tuple(batch.src_tokens.shape) if batch.packed else None)
        norm = grad_norm_(self.params, float(self.cfg.trainer.clip_norm))
        step_optimizer(self.optimizer, torch.isfinite(norm) & torch.isfinite(out["loss_sum"]))
        self.optimizer.zero_grad(set_to_none=True)
        return out["loss_sum"]


def counts_of(batches: list) -> TokenCounts:
    """The real tokens of ``batches``, per sentence (a packed batch's rows hold several)."""
    src = np.concatenate([b.src_lengths.numpy() for b in batches])
    tgt = np.concatenate([b.tgt_lengths.numpy() if b.packed
                          else b.tgt_out.ne(PAD_ID).sum(1).numpy() for b in batches])
    return TokenCounts.of(src, tgt)


def measure_speed(tr: Trainer, warm: list, batches: list, precision: str) -> dict:
    """Steps on ``warm``, then one untimed pass over ``batches`` (every shape compiled before
    the clock starts: Inductor's size guards recompile for some new shapes), then the timed
    pass over the same batches: tokens/s, MFU, memory, graphs compiled before and during."""
    from torch._dynamo.utils import counters

    for b in warm + batches:
        tr.step(b)
    bc.sync_device(tr.device)
    graphs_before = int(counters["stats"].get("unique_graphs", 0))
    timed = batches
    if tr.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(tr.device)
    start = time.perf_counter()
    for b in timed:
        loss = tr.step(b)
    bc.sync_device(tr.device)
    seconds = time.perf_counter() - start
    counts = counts_of(timed)
    flops = training_flops(tr.cfg.model, tr.model.vocab_size, counts)
    name = torch.cuda.get_device_name(tr.device) if tr.device.type == "cuda" else "cpu"
    peak = peak_flops(name, precision)
    out = {
        "steps": len(timed), "seconds": round(seconds, 4),
        "target_tokens": counts.tgt, "source_tokens": counts.src,
        "target_tokens_per_s": round(counts.tgt / seconds),
        "ms_per_step": round(seconds / len(timed) * 1e3, 3),
        "sentences_per_batch": round(sum(b.nsentences for b in timed) / len(timed), 1),
        "padded_tokens_per_batch": round(sum(b.tgt_out.numel() for b in timed) / len(timed)),
        "model_tflops_per_s": round(flops / seconds / 1e12, 2),
        "mfu": round(flops / seconds / peak, 4) if peak else None,
        "last_loss_sum": float(loss),
        "graphs_compiled": graphs_before,
        "graphs_compiled_while_timed": int(counters["stats"].get("unique_graphs", 0))
        - graphs_before,
        "parameters": tr.model.num_parameters(),
    }
    if tr.device.type == "cuda":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(tr.device) / 2**30, 2)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(tr.device) / 2**30, 2)
    return out


PROFILER_WARMUP = 2
"""Steps the profiler runs before it records (its own start-up stays out of the figures)."""


def profile_steps(tr: Trainer, batches: list) -> dict:
    """Kernel time by kind and the GPU's idle share over ``batches`` (one step each; the
    first :data:`PROFILER_WARMUP` are run under the profiler but not recorded)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = tr.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    warm, batches = batches[:PROFILER_WARMUP], batches[PROFILER_WARMUP:]
    plan = schedule(wait=0, warmup=len(warm), active=len(batches), repeat=1)
    bc.sync_device(tr.device)
    with profile(activities=acts, schedule=plan) as prof:
        for b in warm:
            tr.step(b)
            prof.step()
        bc.sync_device(tr.device)
        t0 = time.perf_counter()
        for b in batches:
            tr.step(b)
            prof.step()
        bc.sync_device(tr.device)
        wall_us = (time.perf_counter() - t0) * 1e6
    return bc.summarize_profile(prof.events(), len(batches), wall_us, cuda)


def time_loss(tr: Trainer, n: int, backend: str, repeats: int = 20) -> dict:
    """The compiled label-smoothed loss, forward + backward, on (n, V) logits of the run's
    activation dtype (``bench_loss.measure``: its first call compiles and gives the peak)."""
    v = tr.model.vocab_size
    dtype = "bf16" if tr.cfg.trainer.precision == "bf16" else "fp32"
    eps = float(tr.cfg.trainer.label_smoothing)
    fn = torch.compile(label_smoothed_nll_loss, backend=backend, dynamic=False)
    r = bench_loss.measure("compiled", n, v, dtype, tr.device.type, repeats,
                           fn=lambda logits, target: fn(logits, target, eps, None))
    return {"n": n, "vocab": v, "dtype": dtype, "peak_bytes": r["peak_bytes"],
            "ms_fwd_bwd": round(r["seconds_median"] * 1e3, 4)}


def memory_fit(tr: Trainer, cfg, budgets: list[int], steps: int) -> dict:
    """Peak memory at each padded-token budget on its longest batches; a least-squares line
    over the largest batch's padded tokens (source side, what ``max_tokens`` bounds)."""
    rows = []
    for max_tokens in budgets:
        batches = batches_for(cfg, max_tokens, steps, tr.pad, longest=True,
                              pin=tr.device.type == "cuda")
        if tr.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(tr.device)
        for b in batches:
            tr.step(b)
        bc.sync_device(tr.device)
        row = {"max_tokens": max_tokens,
               "padded_tokens": max(int(b.src_tokens.numel()) for b in batches)}
        if tr.device.type == "cuda":
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated(tr.device) / 2**30
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved(tr.device) / 2**30
        rows.append(row)
    out: dict = {"rows": rows}
    if len(rows) >= 2 and "peak_reserved_gib" in rows[0]:
        x = np.array([r["padded_tokens"] / 1000 for r in rows])
        for key in ("peak_allocated_gib", "peak_reserved_gib"):
            slope, fixed = np.polyfit(x, np.array([r[key] for r in rows]), 1)
            out[key.replace("peak_", "fit_")] = {"gib_per_1k_tokens": round(float(slope), 4),
                                                 "fixed_gib": round(float(fixed), 3)}
    return out


PARTS = ("speed", "profile", "loss", "memory")
"""The script's parts, in the order they run (``--parts``; speed always runs)."""


def run_size(size: str, args: argparse.Namespace, device: torch.device, result: dict,
             save) -> None:
    """Fill ``result`` with the four parts for ``size``, calling ``save()`` after each."""
    cfg, vocab = config_for(size, args)
    backend = "aot_eager" if args.smoke else "inductor"
    tr = Trainer(cfg, vocab, device, backend, packing=args.packing,
                 cuda_graphs=args.cuda_graphs)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    result.update({"size": size, "max_tokens": args.max_tokens, "vocab": vocab,
              "precision": args.precision, "compile_backend": backend,
              "sdpa_choice": tr.model.sdpa_kernels(device, dtype), "packing": args.packing,
              "cuda_graphs": args.cuda_graphs,
              "packed_attention": tr.model.packed_attention if args.packing else None})
    need = args.warmup + args.steps + (PROFILER_WARMUP + args.profile_steps
                                       if "profile" in args.parts else 0)
    batches = batches_for(cfg, args.max_tokens, need, tr.pad, pin=device.type == "cuda",
                          packing=args.packing)
    if args.packing:
        result["packed_shape"] = list(batches[0].src_tokens.shape)
    t0 = time.perf_counter()
    timed_end = args.warmup + args.steps
    result["speed"] = measure_speed(tr, batches[: args.warmup], batches[args.warmup:timed_end],
                                    args.precision)
    result["speed"]["seconds_incl_warmup"] = round(time.perf_counter() - t0, 1)
    print(f"{size}: {json.dumps(result['speed'])}", flush=True)
    save()
    if "profile" in args.parts:
        result["profile"] = profile_steps(tr, batches[timed_end:])
        # the profiler slows the host; the kernels' share of the step timed without it
        result["profile"]["kernel_share_of_timed_step"] = round(
            result["profile"]["kernel_ms_per_step"] / result["speed"]["ms_per_step"], 4)
        print(f"{size}: profile {json.dumps(result['profile']['share_by_kind'])}", flush=True)
        save()
    if "loss" in args.parts:
        mean_tgt = result["speed"]["target_tokens"] // max(result["speed"]["steps"], 1)
        result["loss"] = time_loss(tr, max(int(mean_tgt), 8), backend)
        save()
    if "memory" in args.parts and args.memory_tokens and not args.packing:
        result["memory"] = memory_fit(tr, cfg, args.memory_tokens, args.memory_steps)
        print(f"{size}: memory {json.dumps(result['memory'])}", flush=True)
        save()


def environment(device: torch.device) -> dict:
    """``bench_common.machine_info()`` with the CUDA build and, on a GPU, its properties."""
    env = {**bc.machine_info(), "cuda": torch.version.cuda, "device": "cpu"}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
    return env


def table(report: dict) -> str:
    lines = ["| size | batch | target tok/s | model TFLOP/s | MFU | peak alloc GiB | graphs | "
             "attention | matmul | loss | optimizer | other | GPU idle | loss ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["sizes"]:
        if "speed" not in r:
            lines.append(f"| {r['size']} | (incomplete) |")
            continue
        s, p = r["speed"], r.get("profile") or {}
        share = p.get("share_by_kind") or {}
        mfu = f"{s['mfu']:.1%}" if s.get("mfu") else "-"
        idle = f"{1 - p['gpu_busy_share']:.1%}" if "gpu_busy_share" in p else "-"
        kinds = (" | ".join(f"{share.get(k, 0):.1%}" for k in
                            ("attention", "matmul", "loss", "optimizer", "other"))
                 if share else " | ".join(["-"] * 5))
        batch = (f"packed {r['packed_shape'][0]}x{r['packed_shape'][1]}" if r.get("packing")
                 else f"padded {r['max_tokens']:,}") + (", graphed" if r.get("cuda_graphs")
                                                         else "")
        lines.append(
            f"| {r['size']} | {batch} | {s['target_tokens_per_s']:,} | "
            f"{s['model_tflops_per_s']} | {mfu} | {s.get('peak_allocated_gib', '-')} | "
            f"{s['graphs_compiled']} | {kinds} | {idle} | "
            f"{(r.get('loss') or {}).get('ms_fwd_bwd', '-')} |")
    return "\n".join(lines)


def host_table(report: dict, top: int = 12) -> str:
    """The host's own time by op, per size: the ops that launch (on a GPU) or run (on the CPU)
    a step, in ms per step, the most expensive first."""
    lines = []
    for r in report["sizes"]:
        ops = (r.get("profile") or {}).get("top_host_ops")
        if not ops:
            continue
        lines += ["", f"host time by op, {r['size']} ({r['profile']['host_ms_per_step']} ms of "
                  f"host time per step, wall {r['profile']['wall_ms_per_step']} ms):", "",
                  "| op | ms per step |", "|---|---:|"]
        lines += [f"| `{name}` | {ms} |" for name, ms in ops[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu_profile", help="folder for gpu_profile.json")
    p.add_argument("--data-root", default="data", help="the prepared data (make data)")
    p.add_argument("--sizes", nargs="+", default=["base", "big"], choices=sorted(PRESETS))
    p.add_argument("--max-tokens", type=int, default=3600,
                   help="padded tokens per batch (the WMT14 presets' trainer.max_tokens)")
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--profile-steps", type=int, default=10,
                   help="profiled steps (after PROFILER_WARMUP more)")
    p.add_argument("--memory-tokens", type=int, nargs="*", default=[3600, 7200, 14400, 28800])
    p.add_argument("--memory-steps", type=int, default=3, help="longest batches per budget")
    p.add_argument("--packing", action="store_true",
                   help="packed batches (trainer.packing): one (rows, pack_length) shape")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="the whole step as one CUDA graph (trainer.cuda_graphs; needs --packing)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                   help="the parts to run (speed always runs)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, aot_eager")
    p.add_argument("overrides", nargs="*",
                   help="Hydra overrides after the script's own (another data= corpus)")
    args = p.parse_args(argv)
    if args.smoke:
        args.precision = "fp32"
        args.max_tokens, args.warmup, args.steps, args.profile_steps = 256, 1, 3, 2
        args.memory_tokens, args.memory_steps = [256, 512], 1
    if args.cuda_graphs and not args.packing:
        p.error("--cuda-graphs needs --packing (the whole step runs on one static shape)")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type == "cpu" and not args.smoke:
        print("error: no CUDA device (use --smoke to check the script on the CPU)",
              file=sys.stderr)
        return 2
    report = {"environment": environment(device), "command": " ".join(sys.argv),
              "sizes": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / "gpu_profile.json").write_text(json.dumps(report, indent=1))
        (out / "gpu_profile.md").write_text(f"{table(report)}\n{host_table(report)}\n")

    for size in args.sizes:
        result: dict = {"size": size}
        report["sizes"].append(result)
        try:
            run_size(size, args, device, result, save)
        except Exception as e:  # noqa: BLE001 -- one size failing must not lose the other
            report.setdefault("failed", {})[size] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{size}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    print(table(report))
    print(host_table(report))
    return 1 if report.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
