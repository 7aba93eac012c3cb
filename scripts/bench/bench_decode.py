"""Decoding throughput against the peers: beam 4 on real sentences, one model for all three.

One trained transformer-nmt checkpoint is decoded by

* ``ours``: ``translate.translate_lines`` (our batching and ``beam_search``), as nmt-translate
  runs it: its fp32 linear weights packed once by oneDNN on a CPU (``decode.weight_prepack``, the
  default: ``transformer_nmt.decode.prepack``);
* ``ours_unpacked`` (CPU): the same with ``decode.weight_prepack=false`` (PyTorch's plain
  ``F.linear``);
* ``ours_int8`` (CPU): the same with ``decode.precision=int8``, the model's linear layers
  quantized to int8 with one scale per output channel (``transformer_nmt.decode.quantize``);
* ``ours_compiled``: the same with ``decode.compile=true``, the decoder step compiled over a
  static cache (compiled once; on CUDA a CUDA graph recorded for each shape bucket the first
  time it is met, so the first pass includes both: time ``--repeats 2`` or more);
* ``fairseq``: fairseq's ``SequenceGenerator`` (the search engine of ``fairseq-generate``)
  on a ``TransformerModel`` holding the same weights (bench_common.port_to_fairseq);
* ``marian``: Hugging Face ``MarianMTModel.generate(num_beams=K)`` on the same weights
  (``transformer_nmt.interop.marian.port_to_marian``, the exporter of nmt-export);
* ``ct2_float32`` / ``ct2_int8`` / ``ct2_float16`` (GPU): CTranslate2 on the same weights
  (``transformer_nmt.interop.ctranslate2.export_ctranslate2``, the exporter of nmt-export and of
  ``decode.engine=ctranslate2``), compute type float32, int8 or float16, through
  ``CTranslate2Engine.translate_lines`` (sentences grouped by source length so that each has
  its own maximum length; CTranslate2 batches of ``--max-tokens`` source tokens). CTranslate2
  picks its instruction set and GEMM backends from the CPU (``CT2_FORCE_CPU_ISA`` and
  ``CT2_USE_MKL`` in the environment override them); its child runs with ``CT2_VERBOSE=1``
  and the choice it logs is recorded as ``ct2_runtime``, beside the ``CT2_*`` settings.

The ports are exact (logits agree to ~1e-6, checked at start-up), so the three decode the
same network; every toolkit gets the same sentences in the same batches (our
``LengthBucketSampler``, ``--max-tokens`` source tokens per batch), the same beam size,
length penalty ``|Y|^alpha`` (the form the peers use), maximum length
``max_len_a * src_len + max_len_b`` and stopping rule: a sentence stops once K hypotheses
have finished (fairseq; Hugging Face ``early_stopping=True``; ours ``stopping="beam"``).
``--stopping bound`` times ours with its exact default rule instead (no live hypothesis
can beat the best finished one), which runs more decoder steps.

The timed span covers SentencePiece encoding, search and decoding back to text, after a
warm-up on ``--warmup-sentences`` sentences; each toolkit decodes the input ``--repeats``
times and the fastest pass is reported (all are in the results file, which is rewritten after
each toolkit). ``--profile-sentences N`` adds one more pass over N sentences under
``torch.profiler`` per toolkit whose decoder calls are counted (ours, fairseq, ``generate``):
wall, kernel and host time and kernel launches per decoding step, and on a GPU the share of
the pass the GPU was busy, a second table. Each toolkit runs in its own process (its own peak
RSS / GPU memory). Target
tokens count each output's tokens plus its eos. The table compares every toolkit's speed and
outputs with ``ours``, or where it did not run with the first of ``ours_unpacked``,
``ours_int8``, ``ours_compiled`` that did; a peer's int8 also with ``ours_int8``; and names
the CPU's int8-relevant flags.

Examples::

    .venv-bench/bin/python scripts/bench/bench_decode.py                 # CPU, 1,000 test sentences
    .venv-bench/bin/python scripts/bench/bench_decode.py --sentences 50 --warmup-sentences 4
    .venv-bench/bin/python scripts/bench/bench_decode.py --device cuda --precision bf16
    .venv-bench/bin/python scripts/bench/bench_decode.py --profile 200   # torch.profiler, ours only
    .venv/bin/python scripts/bench/bench_decode.py --toolkits ours,ct2_float32,ct2_int8,marian \
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt    # no fairseq needed
    .venv/bin/python scripts/bench/bench_decode.py --toolkits ours,ours_int8,ct2_int8 \
        --checkpoint runs/multi30k_en_de/checkpoints/averaged.pt    # int8 against int8

The default model is the last checkpoint of scripts/bench/bench_train.py's ``ours`` run
(``data/bench/train_tiny_cpu/ours``); pass ``--checkpoint`` for any other.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig

OURS = ("ours", "ours_unpacked", "ours_int8", "ours_compiled")
"""Our engine's toolkits: as nmt-translate runs it, without packed fp32 weights, with int8
weights, with the compiled step."""


def decode_config(args) -> DecodeConfig:
    """The DecodeConfig shared by the three toolkits."""
    return DecodeConfig(
        beam_size=args.beam, lenpen=args.lenpen, lenpen_form="fairseq", stopping=args.stopping,
        max_len_a=args.max_len_a, max_len_b=args.max_len_b, max_tokens=args.max_tokens,
        precision=args.precision, device=args.device, compile=args.compile,
        weight_prepack=not getattr(args, "unpacked", False),
    )


def batches(tokenizer, lines: list[str], max_tokens: int):
    """Our batches: ``(line indices, src_tokens (B, S) right-padded with eos)``."""
    from transformer_nmt.data.batching import LengthBucketSampler, collate

    ids = [np.asarray(tokenizer.encode(line.strip()), dtype=np.int64) for line in lines]
    sizes = np.asarray([len(x) for x in ids], dtype=np.int64)
    for indices in LengthBucketSampler(sizes, None, max_tokens, shuffle=False):
        if indices:
            batch = collate([(j, ids[j], None) for j in indices])
            yield batch.ids.tolist(), batch.src_tokens


def autocast(args):
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    return torch.autocast(args.device, dtype=dtype, enabled=dtype is not None)


def sync(args) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- toolkits


def decode_ours(model, tokenizer, lines, args):
    from transformer_nmt.decode.translate import translate_lines

    outputs, stats = translate_lines(model, tokenizer, lines, decode_config(args), args.device)
    return outputs, stats["target_tokens"]


def decode_fairseq(fs_model, dictionary, tokenizer, lines, args):
    from fairseq.sequence_generator import SequenceGenerator

    gen = SequenceGenerator(
        [fs_model], dictionary, beam_size=args.beam, max_len_a=args.max_len_a,
        max_len_b=args.max_len_b, min_len=1, normalize_scores=True, len_penalty=args.lenpen,
    )
    to_fs = torch.tensor([bc.fairseq_index(i) for i in range(len(dictionary))])
    from_fs = torch.argsort(to_fs)  # fairseq id -> our id
    pad_fs = dictionary.pad()
    outputs = [""] * len(lines)
    target_tokens = 0
    for indices, src in batches(tokenizer, lines, args.max_tokens):
        lengths = src.ne(PAD_ID).sum(1)  # (B,)
        fs_src = torch.full_like(src, pad_fs)  # (B, S) left-padded, as fairseq-generate pads
        for r, n in enumerate(lengths.tolist()):
            fs_src[r, src.size(1) - n:] = to_fs[src[r, :n]]
        sample = {"net_input": {"src_tokens": fs_src.to(args.device),
                                "src_lengths": lengths.to(args.device)}}
        with autocast(args):
            hyps = gen.generate([fs_model], sample, bos_token=bc.fairseq_index(BOS_ID))
        for j, nbest in zip(indices, hyps):
            toks = from_fs[nbest[0]["tokens"].cpu()].tolist()
            target_tokens += len(toks)  # ends with eos
            outputs[j] = tokenizer.decode([t for t in toks if t != EOS_ID])
    return outputs, target_tokens


def decode_ctranslate2(engine, tokenizer, lines, args):
    outputs, stats = engine.translate_lines(tokenizer, lines, decode_config(args))
    return outputs, stats["target_tokens"]


CT2_RUNTIME = {"Selected ISA": "isa", "SGEMM backend": "sgemm", "GEMM_S8 backend": "gemm_s8"}
"""The lines CTranslate2 logs at load (``CT2_VERBOSE=1``) and their keys in ``ct2_runtime``."""


def ct2_runtime(log: str) -> dict[str, str]:
    """CTranslate2's own report of the instruction set and GEMM backends it runs, read from a
    log of its load-time lines (``... [info]  - GEMM_S8 backend: DNNL (packed: false, ...)``);
    keys of :data:`CT2_RUNTIME`, those it logged."""
    found = {}
    for line in log.splitlines():
        _, sep, entry = line.partition("]  - ")
        if not sep:
            continue
        name, sep, value = entry.partition(": ")
        if sep and name in CT2_RUNTIME:
            found[CT2_RUNTIME[name]] = value.strip()
    return found


def decode_marian(mm, tokenizer, lines, args):
    from transformers import GenerationConfig

    outputs = [""] * len(lines)
    target_tokens = 0
    for indices, src in batches(tokenizer, lines, args.max_tokens):
        src = src.to(args.device)
        gcfg = GenerationConfig(
            num_beams=args.beam, length_penalty=args.lenpen, early_stopping=True,
            do_sample=False, max_new_tokens=int(args.max_len_a * src.size(1) + args.max_len_b) + 1,
            decoder_start_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
            bos_token_id=BOS_ID, suppress_tokens=[PAD_ID, BOS_ID], forced_eos_token_id=EOS_ID,
            min_new_tokens=1,  # eos barred at the first step, as in our search (min_len 1)
        )
        with torch.no_grad(), autocast(args):
            seqs = mm.generate(input_ids=src, attention_mask=src.ne(PAD_ID),
                               generation_config=gcfg)  # (B, 1 + T)
        for j, row in zip(indices, seqs[:, 1:].cpu().tolist()):
            toks = []
            for t in row:
                if t == EOS_ID:
                    break
                if t != PAD_ID:
                    toks.append(t)
            target_tokens += len(toks) + 1
            outputs[j] = tokenizer.decode(toks)
    return outputs, target_tokens


# ------------------------------------------------------------------------------ worker


def load(args):
    """(our model in eval mode on the device, tokenizer)."""
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.data.bpe import SentencePieceTokenizer

    model, _ = load_model(args.checkpoint, "cpu")
    model.eval()
    tokenizer = SentencePieceTokenizer(spm_path(args))
    return model, tokenizer


def ours_model(model, args, int8: bool):
    """Our model as nmt-translate decodes it under ``decode_config(args)``
    (``decoding_model``: fp32 weights packed on a CPU unless ``args.unpacked``), or with
    ``int8`` as ``ours_int8`` does: quantized (``decode.precision=int8``, which
    ``args.precision`` then says for the decode config)."""
    from transformer_nmt.decode.quantize import decoding_model

    if int8:
        args.precision = "int8"
    return decoding_model(model, decode_config(args), args.device, args.checkpoint)


def spm_path(args) -> Path:
    """The SentencePiece model: ``--spm``, else the prepared Multi30k EN-DE's under data/."""
    from transformer_nmt.fileio import spm_model_path

    return Path(args.spm) if args.spm else spm_model_path(bc.data_cfg())


def check_port(model, ported, kind: str) -> float:
    """Max |logit difference| between our model and a port on a real-looking batch."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.vocab_size, (2, 9), generator=g)
    src[:, -1] = EOS_ID
    src[1, 6:] = PAD_ID
    src[1, 5] = EOS_ID
    tgt = torch.randint(4, model.vocab_size, (2, 6), generator=g)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        ref = model(src, tgt)  # (B, T, V)
        if kind == "fairseq":
            to_fs = torch.tensor([bc.fairseq_index(i) for i in range(model.vocab_size)])
            out, _ = ported(to_fs[src], src.ne(PAD_ID).sum(1), to_fs[tgt])
            out = out[..., to_fs]  # fairseq columns back to our id order
        else:
            out = ported(input_ids=src, attention_mask=src.ne(PAD_ID), decoder_input_ids=tgt).logits
    diff = float((out - ref).abs().max())
    if diff > 1e-3:
        raise RuntimeError(f"{kind} port disagrees with our model: max |logit diff| = {diff}")
    return diff


def worker(args) -> None:
    """Decode the input with one toolkit; write timings and translations as JSON."""
    torch.set_num_threads(args.threads)
    ours = args.worker in OURS
    if (ours and not args.system_malloc) or (not ours and args.peers_retain_freed_memory):
        from transformer_nmt.runtime import retain_freed_memory

        retain_freed_memory()  # as nmt-translate / nmt-evaluate do
    model, tokenizer = load(args)
    lines = bc.read_lines(args.input)[: args.sentences]
    port_diff = None
    counts = {"decoder_calls": 0, "row_steps": 0}  # calls, and rows summed over calls

    def counted(fn):
        def wrapper(tokens, *a, **kw):
            counts["decoder_calls"] += 1
            counts["row_steps"] += tokens.size(0)
            return fn(tokens, *a, **kw)
        return wrapper

    if ours:
        if args.worker == "ours_compiled":
            args.compile = "true"
        args.unpacked = args.worker == "ours_unpacked"
        engine = ours_model(model.to(args.device), args, args.worker == "ours_int8")
        engine.decode = counted(engine.decode)
        from transformer_nmt.decode import compiled_step

        if compiled_step.resolve_compile(args.compile, args.device):
            call = compiled_step._call  # decode_static runs inside the compiled step's graph

            def counted_call(fn, device, model, cache, *rest):
                counts["decoder_calls"] += 1
                counts["row_steps"] += cache.sentences * cache.step_width
                return call(fn, device, model, cache, *rest)

            compiled_step._call = counted_call

        def run(x):
            return decode_ours(engine, tokenizer, x, args)
    elif args.worker == "fairseq":
        fs, dictionary = bc.port_to_fairseq(model, bc.BENCH_DIR / "fairseq_data" / "bin")
        port_diff = check_port(model, fs, "fairseq")
        fs = fs.to(args.device)
        fs.decoder.forward = counted(fs.decoder.forward)

        def run(x):
            return decode_fairseq(fs, dictionary, tokenizer, x, args)
    elif args.worker.startswith("ct2_"):
        from transformer_nmt.interop.ctranslate2 import CTranslate2Engine, export_ctranslate2

        folder = Path(args.worker_out).parent / "ct2_model"
        export_ctranslate2(args.checkpoint, spm_path(args), folder, "none", overwrite=True)
        compute = args.worker.split("_", 1)[1]
        engine = CTranslate2Engine(folder, args.device, compute, int(model.cfg.max_positions),
                                   threads=args.threads)
        counts = {"decoder_calls": None, "row_steps": None}  # not counted

        def run(x):
            return decode_ctranslate2(engine, tokenizer, x, args)
    else:
        mm = bc.port_to_marian(model, args.size)
        port_diff = check_port(model, mm, "marian")
        mm = mm.to(args.device)

        def count_call(_module, a, kw):  # generate calls the decoder once per step
            tokens = kw.get("input_ids") if kw.get("input_ids") is not None else a[0]
            counts["decoder_calls"] += 1
            counts["row_steps"] += tokens.size(0)

        mm.get_decoder().register_forward_pre_hook(count_call, with_kwargs=True)

        def run(x):
            return decode_marian(mm, tokenizer, x, args)
    if args.warmup_sentences:
        run(lines[: args.warmup_sentences])
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    all_seconds = []
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if counts["decoder_calls"] is not None:
        counts.update(decoder_calls=0, row_steps=0)  # leave out the warm-up
    for _ in range(args.repeats):  # the same work each time; the fastest is least disturbed
        sync(args)
        start = time.perf_counter()
        outputs, target_tokens = run(lines)
        sync(args)
        all_seconds.append(time.perf_counter() - start)
    seconds = min(all_seconds)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) // args.repeats
    per_pass = {k: (v // args.repeats if v is not None else None) for k, v in counts.items()}
    profiled = None
    if args.profile_sentences and counts["decoder_calls"] is not None:
        profiled = profile_pass(run, lines[: args.profile_sentences], counts, args)
    bc.write_json(Path(args.worker_out), {
        "sentences": len(lines), "seconds": seconds, "all_seconds": all_seconds,
        "target_tokens": target_tokens, **per_pass, "profile": profiled,
        "compiler": compiler_counts() if ours and resolve_compile_arg(args) else None,
        "page_faults_per_pass": faults,
        "sentences_per_s": len(lines) / seconds, "target_tokens_per_s": target_tokens / seconds,
        "peak_rss_mib": bc.peak_rss_mib(), "peak_gpu_mib": bc.peak_gpu_mib(),
        "port_max_logit_diff": port_diff, "outputs": outputs,
    })


def resolve_compile_arg(args) -> bool:
    """Whether our search runs with ``decode.compile`` (``--compile`` as it resolves on
    ``--device``)."""
    from transformer_nmt.decode.compiled_step import resolve_compile

    return resolve_compile(args.compile, args.device)


def compiler_counts() -> dict:
    """What ``torch.compile`` did in this process: the graphs it compiled and the compiled
    graphs that CUDA graphs skipped (``reduce-overhead`` falls back to the compiled code for
    them, launching every kernel: a step not replayed as one graph)."""
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"],
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def profile_pass(run, lines: list[str], counts: dict, args) -> dict:
    """One more pass of ``run`` over ``lines`` under ``torch.profiler`` (CPU ops; on CUDA its
    kernels too), summed per decoder call (``counts``, which ``run`` increments):
    :func:`bench_common.summarize_profile`'s figures, "step" being one decoder call, and the
    sentences profiled."""
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    before = counts["decoder_calls"]
    sync(args)
    with profile(activities=acts) as prof:
        start = time.perf_counter()
        run(lines)
        sync(args)
        wall_us = (time.perf_counter() - start) * 1e6
    summary = bc.summarize_profile(prof.events(), counts["decoder_calls"] - before, wall_us, cuda)
    return {"sentences": len(lines), **summary}


def profile_ours(args) -> None:
    """torch.profiler over our beam search on the first ``args.profile`` sentences (int8 when
    ``--toolkits`` is ``ours_int8``, plain fp32 weights when it is ``ours_unpacked``)."""
    from torch.profiler import ProfilerActivity, profile

    from transformer_nmt.runtime import retain_freed_memory

    torch.set_num_threads(args.threads)
    retain_freed_memory()
    model, tokenizer = load(args)
    args.unpacked = args.toolkits == "ours_unpacked"
    model = ours_model(model, args, args.toolkits == "ours_int8")
    lines = bc.read_lines(args.input)[: args.profile]
    decode_ours(model, tokenizer, lines[:8], args)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        decode_ours(model, tokenizer, lines, args)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


# ------------------------------------------------------------------------------- main


def reference_toolkit(toolkits: dict) -> str | None:
    """The toolkit the others are compared with: the first of :data:`OURS` that ran."""
    return next((name for name in OURS if name in toolkits), None)


def int8_reference(name: str, toolkits: dict) -> str | None:
    """What the table's int8 column times ``name`` against: ``ours_int8`` for a peer's int8
    (``ct2_int8``) when both ran, else None."""
    if name.endswith("_int8") and name not in OURS and "ours_int8" in toolkits:
        return "ours_int8"
    return None


def markdown(results: dict) -> str:
    """The results as a Markdown table, then the CPU's flags and CTranslate2's choices."""
    toolkits = results["toolkits"]
    ref = reference_toolkit(toolkits) or "ours"
    rows = [(f"| toolkit | sentences | seconds | sentences/s | target tok/s | {ref} / toolkit "
             "(sent/s) | ours_int8 / toolkit | decoder row-steps | peak RSS MiB | BLEU | "
             f"same output as {ref} |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ours = toolkits.get(ref, {}).get("sentences_per_s")
    for name, r in toolkits.items():
        ratio = f"{ours / r['sentences_per_s']:.2f}" if ours else "-"
        int8 = int8_reference(name, toolkits)
        int8_ratio = (f"{toolkits[int8]['sentences_per_s'] / r['sentences_per_s']:.2f}"
                      if int8 else "-")
        steps = f"{r['row_steps']:,}" if r.get("row_steps") is not None else "-"
        rows.append(
            f"| {name} | {r['sentences']} | {r['seconds']:.1f} | {r['sentences_per_s']:.1f} | "
            f"{r['target_tokens_per_s']:,.0f} | {ratio} | {int8_ratio} | {steps} | "
            f"{r['peak_rss_mib']:,.0f} | "
            f"{r.get('bleu', float('nan')):.2f} | {r.get('same_as_ours', float('nan')):.1%} |")
    rows += profile_rows(toolkits)
    machine = results.get("machine", {})
    flags = ", ".join(machine.get("cpu_flags") or []) or "none of bench_common.INT8_FLAGS"
    rows += ["", f"CPU: {machine.get('cpu')}, {flags}; PyTorch's kernels: "
             f"{machine.get('cpu_capability')}"]
    for name, r in results["toolkits"].items():
        if r.get("ct2_runtime"):
            chosen = ", ".join(f"{k} {v}" for k, v in r["ct2_runtime"].items())
            env = " ".join(f"{k}={v}" for k, v in r.get("ct2_env", {}).items()
                           if k != "CT2_VERBOSE")
            rows.append(f"{name}: CTranslate2 ran {chosen}" + (f" (with {env})" if env else ""))
    return "\n".join(rows)


def profile_rows(toolkits: dict) -> list[str]:
    """The profiled passes (``--profile-sentences``) as a Markdown table, per decoding step
    (one decoder call); none when no toolkit was profiled."""
    profiled = {name: r["profile"] for name, r in toolkits.items() if r.get("profile")}
    if not profiled:
        return []
    rows = ["", "| toolkit | sentences profiled | decoding steps | wall ms / step | kernel ms / "
            "step | kernels / step | GPU busy | host ms / step | top kernels (ms / step) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, p in profiled.items():
        busy = f"{p['gpu_busy_share']:.0%}" if p.get("gpu_busy_share") is not None else "-"
        top = "; ".join(f"{n[:40]} {ms:.3f}" for n, ms in p["top_kernels"][:3])
        rows.append(f"| {name} | {p['sentences']} | {p['steps']} | {p['wall_ms_per_step']:.3f} | "
                    f"{p['kernel_ms_per_step']:.3f} | {p['kernels_per_step'] or '-'} | {busy} | "
                    f"{p['host_ms_per_step']:.3f} | {top} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--size", default="tiny", choices=sorted(bc.SIZES),
                   help="the checkpoint's size (Marian port)")
    p.add_argument("--input", default="data/raw/multi30k_en_de/test_2016_flickr.en")
    p.add_argument("--reference", default="data/raw/multi30k_en_de/test_2016_flickr.de")
    p.add_argument("--spm", default=None,
                   help="the SentencePiece model (default: data/spm/multi30k_en_de/spm.model)")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--warmup-sentences", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3,
                   help="timed passes over the input per toolkit; the fastest is reported")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=0.6)
    p.add_argument("--system-malloc", action="store_true",
                   help="run ours with glibc's default malloc settings instead of those of "
                        "nmt-translate (transformer_nmt.runtime.retain_freed_memory)")
    p.add_argument("--peers-retain-freed-memory", action="store_true",
                   help="run the peers with the glibc malloc settings our entry points use "
                        "(transformer_nmt.runtime.retain_freed_memory) too")
    p.add_argument("--stopping", default="beam", choices=["beam", "bound"],
                   help="our stopping rule: beam = the peers' (K finished hypotheses), "
                        "bound = our exact default")
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=8000, help="source tokens per batch")
    p.add_argument("--compile", default="false", choices=["auto", "true", "false"],
                   help="decode.compile of ours: the decoder step compiled over a static cache "
                        "(compiled once, a CUDA graph recorded per bucket on CUDA, both in the "
                        "first pass: time the later repeats)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--toolkits", default="ours,fairseq,marian,ct2_float32,ct2_int8",
                   help="comma-separated: ours, ours_unpacked (CPU), ours_int8 (CPU), "
                        "ours_compiled, fairseq, marian, "
                        "ct2_float32, "
                        "ct2_int8, ct2_float16 (GPU)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", type=int, default=0,
                   help="profile ours on this many sentences instead of benchmarking")
    p.add_argument("--profile-sentences", type=int, default=0,
                   help="after the timed passes, one more over this many sentences under "
                        "torch.profiler (its kernels too on CUDA), per toolkit whose decoder "
                        "calls are counted: kernel and host time per decoding step")
    p.add_argument("--worker", choices=[*OURS, "fairseq", "marian", "ct2_float32",
                                        "ct2_int8", "ct2_float16"],
                   help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.checkpoint is None:
        from transformer_nmt.checkpoint import latest_checkpoint

        run_dir = bc.BENCH_DIR / "train_tiny_cpu" / "ours"
        found = latest_checkpoint(run_dir)
        if found is None:
            raise SystemExit(f"no checkpoint under {run_dir}: run scripts/bench/bench_train.py "
                             "first "
                             "or pass --checkpoint")
        args.checkpoint = str(found)
    if args.worker:
        worker(args)
        return
    if args.profile:
        profile_ours(args)
        return
    out = args.out or bc.BENCH_DIR / f"decode_{args.device}"
    out.mkdir(parents=True, exist_ok=True)
    if "fairseq" in args.toolkits:
        bc.prepare_fairseq_data(bc.data_cfg(), bc.BENCH_DIR / "fairseq_data", bc.FAIRSEQ_SPLITS)
    import sacrebleu

    refs = bc.read_lines(args.reference)[: args.sentences]
    info = bc.machine_info()
    results: dict = {"args": {k: (str(v) if isinstance(v, Path) else v)
                              for k, v in vars(args).items()},
                     "machine": info, "toolkits": {}}
    passthrough = ["--checkpoint", args.checkpoint, "--size", args.size, "--input", args.input,
                   *(["--spm", args.spm] if args.spm else []),
                   "--sentences", str(args.sentences), "--warmup-sentences",
                   str(args.warmup_sentences), "--repeats", str(args.repeats), "--beam",
                   str(args.beam), "--lenpen", str(args.lenpen), "--stopping", args.stopping,
                   "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
                   "--max-tokens", str(args.max_tokens), "--device", args.device,
                   "--precision", args.precision, "--threads", str(args.threads),
                   "--compile", args.compile, "--profile-sentences", str(args.profile_sentences)]
    if args.peers_retain_freed_memory:
        passthrough.append("--peers-retain-freed-memory")
    if args.system_malloc:
        passthrough.append("--system-malloc")
    for name in args.toolkits.split(","):  # back to back, same conditions
        load_before = bc.machine_info()["load_average"]
        print(f"[bench_decode] {name}: start (load {load_before})", flush=True)
        result_path = out / f"{name}.json"
        env = bc.thread_env(args.threads)
        if name.startswith("ct2_"):
            env.setdefault("CT2_VERBOSE", "1")  # it logs its ISA and GEMM backends at load
        bc.run_child([sys.executable, str(Path(__file__).resolve()), *passthrough,
                      "--worker", name, "--worker-out", str(result_path)],
                     out / f"{name}.log", env)
        r = json.loads(result_path.read_text())
        if name.startswith("ct2_"):
            r["ct2_runtime"] = ct2_runtime((out / f"{name}.log").read_text(errors="replace"))
            r["ct2_env"] = {k: v for k, v in sorted(os.environ.items())
                            if k.startswith("CT2_")}
            print(f"[bench_decode] {name}: CTranslate2 runs {r['ct2_runtime']}", flush=True)
        outputs = r.pop("outputs")
        with open(out / f"{name}.de", "w", encoding="utf-8") as f:
            f.write("\n".join(outputs) + "\n")
        r["bleu"] = float(sacrebleu.corpus_bleu(outputs, [refs]).score)
        r["outputs_path"] = str(out / f"{name}.de")
        r["load_average_before_after"] = [load_before, bc.machine_info()["load_average"]]
        results["toolkits"][name] = r
        print(f"[bench_decode] {name}: {r['sentences_per_s']:.1f} sentences/s, "
              f"{r['target_tokens_per_s']:,.0f} target tokens/s", flush=True)
        ref = reference_toolkit(results["toolkits"])
        if ref is not None:  # same_as_ours: the share of outputs equal to this one's
            ours_out = bc.read_lines(out / f"{ref}.de")
            for other_name, other in results["toolkits"].items():
                lines = bc.read_lines(out / f"{other_name}.de")
                other["same_as_ours"] = float(np.mean([a == b for a, b in zip(ours_out, lines)]))
        results["machine_after"] = bc.machine_info()["load_average"]
        bc.write_json(out / "results.json", results)  # what finished, should a later one fail
    print(f"\n[bench_decode] results: {out / 'results.json'}\n")
    print(markdown(results))


if __name__ == "__main__":
    bc.run_main(main)
