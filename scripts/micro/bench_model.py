"""Time one forward + backward pass of the Transformer on a fixed-size batch.

Default: the ``base`` preset, 64 sentences x 64 source and 64 target tokens (4,096 target
tokens per batch), a shared 37,000-piece vocabulary; fp32 on CPU, bf16 autocast on CUDA.
The loss is plain cross-entropy summed over target tokens (the training loss's cost).
Warm-up iterations are excluded from the timing.

Examples::

    python scripts/micro/bench_model.py --device cpu --iterations 3 --warmup 1
    python scripts/micro/bench_model.py --preset big --device cuda --iterations 20
    python scripts/micro/bench_model.py --decode --device cpu   # incremental decoding steps
    python scripts/micro/bench_model.py --cache-ops --threads 1 --rounds 5  # K/V cache + attention
    python scripts/micro/bench_model.py --adam --preset tiny --vocab 8000 --threads 2  # Adam step

Prints target tokens per second and peak memory (CUDA: torch.cuda.max_memory_allocated;
CPU: the process's peak resident set size, which includes the Python runtime).
"""

from __future__ import annotations

import argparse
import functools
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from transformer_nmt.config import BOS_ID, ModelConfig
from transformer_nmt.model.transformer import DecoderCache, Transformer
from transformer_nmt.runtime import retain_freed_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_common as bc  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


def build(preset: str, vocab: int, device: torch.device) -> Transformer:
    """The preset's model (``configs/model/<preset>.yaml``) on ``device``."""
    yaml = OmegaConf.load(CONFIG_DIR / f"{preset}.yaml")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))
    return Transformer(cfg, vocab_size=vocab).to(device)


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory in MiB: CUDA allocator peak, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def bench_train(model: Transformer, args, device: torch.device, dtype: torch.dtype | None) -> float:
    """Seconds per forward + backward of one batch (mean over timed iterations)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.src_len), generator=g).to(device)
    tgt_in = torch.randint(4, args.vocab, (args.batch, args.tgt_len), generator=g).to(device)
    tgt_out = torch.randint(4, args.vocab, (args.batch, args.tgt_len), generator=g).to(device)
    model.train()
    times = []
    for it in range(args.warmup + args.iterations):
        bc.sync_device(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), tgt_out.view(-1),
                               reduction="sum")
        loss.backward()
        model.zero_grad(set_to_none=True)
        bc.sync_device(device)
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    return sum(times) / len(times)


def bench_decode(model: Transformer, args, device: torch.device,
                 dtype: torch.dtype | None) -> float:
    """Seconds per incremental decoder step (cache append + cache reorder, as beam search does)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.src_len), generator=g).to(device)
    order = torch.randperm(args.batch, generator=g).to(device)
    model.eval()
    times = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        for it in range(args.warmup + args.iterations):
            memory, src_mask = model.encode(src)
            cache = model.new_cache()
            token = torch.full((args.batch, 1), BOS_ID, device=device)
            bc.sync_device(device)
            start = time.perf_counter()
            for _ in range(args.tgt_len):
                logits = model.decode(token, memory, src_mask, cache)  # (B, 1, V)
                token = logits[:, -1].argmax(-1, keepdim=True)[order]
                cache.reorder(order, sources=order)  # rows and their sources move together
            bc.sync_device(device)
            if it >= args.warmup:
                times.append((time.perf_counter() - start) / args.tgt_len)
    return sum(times) / len(times)


def bench_adam(model: Transformer, args) -> None:
    """One Adam step over the model's parameters: PyTorch's per-tensor loop vs the fused kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    for label, options in (("per-tensor loop (foreach=False)", {"foreach": False}),
                           ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **options)
        for _ in range(args.warmup):
            opt.step()
        start = time.perf_counter()
        for _ in range(args.iterations):
            opt.step()
        ms = (time.perf_counter() - start) / args.iterations * 1e3
        print(f"Adam, {label}: {ms:.1f} ms per step")


def bench_cache_ops(args) -> None:
    """One layer's self-attention K/V update per beam-search step (append + reorder) and the
    step's attention over the result (q K^T, softmax, P V; one query per row).

    Three variants: ``DecoderCache`` with its CPU layout (``contiguous``: the kept rows
    gathered into fresh contiguous K/V of exactly L positions), ``DecoderCache`` with reused
    buffers (``buffers``, the layout of other devices: the gather writes into the other buffer
    pair, attention reads strided views), and growing by ``torch.cat`` then re-indexing with
    ``index_select`` (two copies into fresh tensors). 4 heads of d_k 64, glibc set to keep
    freed memory as nmt-translate does. The variants are timed in ``--rounds`` rounds whose
    order rotates (load that comes and goes falls on each); the table has the median
    milliseconds of each and the ratio buffers / contiguous with its range over the rounds.
    """
    retain_freed_memory()
    heads, d_k = 4, 64
    g = torch.Generator().manual_seed(0)

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(args.iterations):
            fn()
        return (time.perf_counter() - start) / args.iterations * 1e3

    print(f"{args.rounds} rotating rounds of {args.iterations} updates + attention each, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| rows x cached positions | torch.cat then index_select | DecoderCache buffers "
          "| DecoderCache contiguous | buffers / contiguous (rounds' range) |")
    print("|---|---:|---:|---:|---:|")
    names = ("concat", "buffers", "contiguous")
    for rows, length in [(2400, 10), (2400, 30), (400, 60)]:
        k_old, v_old = (torch.randn(rows, heads, length, d_k, generator=g) for _ in range(2))
        k_new, v_new, q = (torch.randn(rows, heads, 1, d_k, generator=g) for _ in range(3))
        order = torch.randint(0, rows, (rows,), generator=g)
        fns = {"concat": functools.partial(_concat_then_select, k_old, v_old, k_new, v_new,
                                           order, q)}
        for name in names[1:]:
            cache = DecoderCache(1, contiguous=name == "contiguous")
            cache.append_self(0, k_old, v_old)
            cache.length = length  # every call appends position `length` again
            fns[name] = functools.partial(_cache_update, cache, k_new, v_new, order, q)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                times[name].append(timed(fns[name]))
        med = {name: statistics.median(times[name]) for name in names}
        ratios = [b / c for b, c in zip(times["buffers"], times["contiguous"])]
        print(f"| {rows:,} x {length} | {med['concat']:.2f} ms | {med['buffers']:.2f} ms "
              f"| {med['contiguous']:.2f} ms | {med['buffers'] / med['contiguous']:.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")


def _attend(q, k, v) -> None:
    torch.matmul(torch.matmul(q, k.transpose(-2, -1)).softmax(-1), v)


def _concat_then_select(k_old, v_old, k_new, v_new, order, q) -> None:
    _attend(q, torch.cat([k_old, k_new], 2).index_select(0, order),
            torch.cat([v_old, v_new], 2).index_select(0, order))


def _cache_update(cache: DecoderCache, k_new, v_new, order, q) -> None:
    cache.reorder(order)
    _attend(q, *cache.append_self(0, k_new, v_new))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="base", choices=["tiny", "base", "big"])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--batch", type=int, default=64, help="sentences per batch")
    p.add_argument("--src-len", type=int, default=64, help="source tokens per sentence")
    p.add_argument("--tgt-len", type=int, default=64, help="target tokens per sentence")
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--iterations", type=int, default=5, help="timed iterations")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                   help="auto: fp32 on CPU, bf16 autocast on CUDA")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--decode", action="store_true",
                   help="time cached decoder steps (with a reorder each step) instead of training")
    p.add_argument("--adam", action="store_true",
                   help="time one Adam step over the preset's parameters (loop, foreach, fused)")
    p.add_argument("--cache-ops", action="store_true",
                   help="time the decoder cache's K/V update and attention per layer and "
                        "step, its two layouts and torch.cat + index_select")
    p.add_argument("--rounds", type=int, default=1,
                   help="--cache-ops: rotating rounds of the variants (medians reported)")
    args = p.parse_args(argv)
    if args.cache_ops:
        if args.threads:
            torch.set_num_threads(args.threads)
        bench_cache_ops(args)
        return

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    precision = args.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    dtype = torch.bfloat16 if precision == "bf16" else None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    model = build(args.preset, args.vocab, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"torch {torch.__version__}, device {device} ({name or 'cpu'}), "
          f"threads {torch.get_num_threads()}, precision {precision}")
    print(f"{args.preset}: {model.num_parameters():,} parameters, batch {args.batch} x "
          f"{args.src_len} source / {args.tgt_len} target tokens, vocab {args.vocab}")
    if args.adam:
        bench_adam(model, args)
        return
    if args.decode:
        seconds = bench_decode(model, args, device, dtype)
        print(f"decode step: {seconds * 1e3:.1f} ms for {args.batch} sentences "
              f"({args.batch / seconds:,.0f} tokens/s), peak memory "
              f"{peak_memory_mib(device):,.0f} MiB")
        return
    seconds = bench_train(model, args, device, dtype)
    tokens = args.batch * args.tgt_len
    print(f"forward+backward: {seconds:.3f} s per batch, {tokens / seconds:,.0f} target tokens/s, "
          f"peak memory {peak_memory_mib(device):,.0f} MiB "
          f"({args.iterations} timed, {args.warmup} warm-up iterations)")


if __name__ == "__main__":
    main()
