"""Shared pieces of the speed benchmarks against the peers (scripts/bench/bench_train.py,
bench_decode.py).

* machine and version facts recorded with every result;
* child processes timed with their own peak resident set size (``os.wait4``), so each
  toolkit's memory is measured alone;
* the fairseq copy of the binarized Multi30k data (same sentences, same SentencePiece
  pieces, a dictionary of exactly our vocabulary in our id order);
* the model-FLOP count used for MFU (formula in :func:`training_flops`);
* ports of one trained transformer-nmt model into fairseq's ``TransformerModel`` and
  Hugging Face's ``MarianMTModel`` (the latter is the product's exporter,
  ``transformer_nmt.interop``), so that all toolkits decode the same network.

The peers (``fairseq``, ``transformers``) are imported lazily: they are dependencies of the
benchmark environment (``make bench-install`` -> ``.venv-bench``), never of the package.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_nmt.interop.marian import layer_state_dict
from transformer_nmt.runtime import cpu_model

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO / "data" / "bench"
"""Scratch folder of every benchmark output except docs (ignored by git: under data/)."""
FAIRSEQ_SPLITS = ["train", "valid", "test_2016_flickr"]
"""Splits copied to fairseq's format (one copy serves both benchmarks)."""

MODEL_PRESETS = REPO / "configs" / "model"
"""The model presets (configs/model/<size>.yaml) whose sizes and dropout the benchmarks use."""


def load_presets() -> dict[str, dict[str, Any]]:
    """Every model preset of configs/model as a plain dict, by name (``tiny``, ``base``, ...)."""
    from omegaconf import OmegaConf

    return {p.stem: dict(OmegaConf.to_container(OmegaConf.load(p)))
            for p in sorted(MODEL_PRESETS.glob("*.yaml"))}


PRESETS = load_presets()
SIZES = {name: (p["encoder_layers"], p["decoder_layers"], p["d_model"], p["d_ff"], p["heads"])
         for name, p in PRESETS.items()}
"""name: (encoder_layers, decoder_layers, d_model, d_ff, heads) of configs/model/<name>.yaml."""
DROPOUT = {name: p["dropout"] for name, p in PRESETS.items()}
"""name: the preset's dropout (residual and embeddings)."""


def run_main(main: Any) -> None:
    """Run a benchmark's ``main()``; a failure ends in one ``error:`` line (exit 2) that names
    the log to read instead of a traceback."""
    try:
        main()
    except (RuntimeError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {first}", file=sys.stderr)
        sys.exit(2)


# ------------------------------------------------------------------------------ facts


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (None when absent); imports nothing."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "amx_int8")
"""The x86 flags that decide which int8 and fp32 kernels a CPU runs (fbgemm, oneDNN and
CTranslate2 each dispatch on them): AVX2 multiplies int8 pairs into 16-bit sums, VNNI
accumulates 8-bit products straight into 32 bits."""


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """Those of :data:`INT8_FLAGS` the CPU has, from the first ``flags`` line of
    ``/proc/cpuinfo`` (or of ``cpuinfo``); empty where there is none (not Linux, not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in INT8_FLAGS if f in have]
    return []


def machine_info() -> dict[str, Any]:
    """Machine, load and versions, recorded next to every measurement."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fairseq": package_version("fairseq-fixed") or package_version("fairseq"),
        "transformers": package_version("transformers"),
        "transformer_nmt": package_version("transformer-nmt"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync_device(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); a no-op elsewhere. Call around a timed region."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gpu_mib() -> float | None:
    """CUDA allocator peak in MiB, or None without a GPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return None


KINDS = (  # kernel name fragments, first match wins (lower case)
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "_amp_")),
    ("loss", ("log_softmax", "logsumexp", "nll", "label_smooth")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "aten::mm", "aten::addmm",
                "aten::bmm", "aten::linear", "matmul")),
)


def kind_of(name: str) -> str:
    """The kind of a kernel (or, on the CPU, an aten op) by its name: one of :data:`KINDS`'
    names, else ``other``."""
    low = name.lower()
    for kind, parts in KINDS:
        if any(p in low for p in parts):
            return kind
    return "other"


def busy_fraction(intervals: list[tuple[float, float]], span: tuple[float, float]) -> float:
    """Share of ``span`` covered by the union of ``intervals`` (same time unit)."""
    lo, hi = span
    if hi <= lo:
        return 0.0
    covered, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            covered += b - a
            end = b
    return covered / (hi - lo)


def device_kernels(events: list) -> list:
    """The profiler's GPU kernels and copies: its events on the device, less the ranges that
    ``record_function`` marks on the GPU's timeline (``ProfilerStep#N`` spans a whole step,
    ``Optimizer.step#Adam.step`` the optimizer), which would count the step's time as busy."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False)]


def summarize_profile(events: list, steps: int, wall_us: float, cuda: bool) -> dict:
    """Where ``steps`` steps' time went, from a ``torch.profiler`` run's ``events()``.

    Args:
        events: the profiler's events (CPU ops and ranges; on a GPU its kernels too).
        steps: what the figures are divided by (training steps, or a search's decoder calls).
        wall_us: the profiled span's wall time, microseconds.
        cuda: the events hold GPU kernels (else the device work is the CPU's leaf aten ops).

    Returns:
        ``wall_ms_per_step``; ``kernel_ms_per_step`` (on a CPU the aten ops' own time);
        ``kernels_per_step`` (launches; None on a CPU, where ops nest); ``share_by_kind``
        (:func:`kind_of`); ``top_kernels`` (name, ms per step); ``host_ms_per_step`` and
        ``top_host_ops`` (CPU events by their own time); on a
        GPU ``gpu_busy_share`` (the union of kernel spans over their window) and
        ``host_gap_ms_per_step`` (the window's idle time per step).
    """
    steps = max(steps, 1)
    if cuda:
        kernels = device_kernels(events)
        spans = [(e.time_range.start, e.time_range.end) for e in kernels]
        times = [(e.name, e.time_range.end - e.time_range.start) for e in kernels]
    else:  # the CPU: leaf aten ops by their own time
        spans = []
        times = [(e.name, e.self_cpu_time_total) for e in events if e.name.startswith("aten::")]
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, us in times:
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + us
        by_name[name] = by_name.get(name, 0.0) + us
    total = sum(by_kind.values()) or 1.0
    out = {"steps": steps, "wall_ms_per_step": round(wall_us / steps / 1e3, 3),
           "kernel_ms_per_step": round(total / steps / 1e3, 3),
           "kernels_per_step": round(len(times) / steps, 1) if cuda else None,
           "share_by_kind": {k: round(v / total, 4) for k, v in sorted(by_kind.items())},
           "top_kernels": [[n[:120], round(us / steps / 1e3, 4)] for n, us in
                           sorted(by_name.items(), key=lambda x: -x[1])[:15]],
           "attention_kernels": sorted({n[:120] for n, _ in times
                                        if kind_of(n) == "attention"})[:8]}
    # where the host's time goes: CPU-side ops and ranges by their own time (on the CPU the
    # host does all the work; on a GPU it launches what the GPU runs)
    host: dict[str, float] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU:
            host[e.name] = host.get(e.name, 0.0) + e.self_cpu_time_total
    out["host_ms_per_step"] = round(sum(host.values()) / steps / 1e3, 3)
    out["top_host_ops"] = [[n[:120], round(us / steps / 1e3, 4)] for n, us in
                           sorted(host.items(), key=lambda x: -x[1])[:25]]
    if spans:
        window = (min(a for a, _ in spans), max(b for _, b in spans))
        out["gpu_busy_share"] = round(busy_fraction(spans, window), 4)
        out["host_gap_ms_per_step"] = round(
            (1 - out["gpu_busy_share"]) * (window[1] - window[0]) / steps / 1e3, 3)
    return out


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a child process limited to ``threads`` intra-op threads."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_child(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path = REPO) -> dict:
    """Run ``cmd`` with stdout+stderr to ``log_path``; wait with ``os.wait4`` for its own rusage.

    Returns:
        ``{"returncode", "seconds" (wall), "peak_rss_mib"}``; the peak RSS is the child's
        (and its waited-for descendants'), not this process's.

    Raises:
        RuntimeError: non-zero exit, naming the command and the last lines of its log.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8",
                                          errors="replace").splitlines(True)[-25:])
        raise RuntimeError(
            f"command failed with exit code {proc.returncode} (log {log_path}):\n"
            f"  {' '.join(cmd)}\n{tail}"
        )
    return {"returncode": proc.returncode, "seconds": seconds,
            "peak_rss_mib": usage.ru_maxrss / 1024}


def venv_tool(name: str) -> str:
    """Path of console script ``name`` next to the running interpreter (same environment)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: run the benchmark with the interpreter of the environment "
            "made by `make bench-install` (.venv-bench/bin/python)"
        )
    return str(path)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON through the project's atomic writer."""
    from transformer_nmt.fileio import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(data, f, indent=2)


def add_search_arguments(parser: Any, sentences: int) -> None:
    """The arguments of a script that searches a trained model on the test sentences:
    ``--checkpoint``, ``--spm``, ``--input``, ``--sentences`` (default ``sentences``),
    ``--max-tokens`` (source tokens per batch) and ``--beam``."""
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--spm", default="data/spm/multi30k_en_de/spm.model")
    parser.add_argument("--input", default="data/raw/multi30k_en_de/test_2016_flickr.en")
    parser.add_argument("--sentences", type=int, default=sentences)
    parser.add_argument("--max-tokens", type=int, default=8000, help="source tokens per batch")
    parser.add_argument("--beam", type=int, default=4)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file without their newlines."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def median(values: list[float]) -> float:
    """Median (nan for an empty list)."""
    return float(np.median(values)) if values else float("nan")


# ------------------------------------------------------------------------ data (Multi30k)


def data_cfg(name: str = "multi30k_en_de"):
    """The composed DataConfig of ``data=<name>`` (paths under data/)."""
    from transformer_nmt.config import compose

    return compose([f"data={name}"]).data


def fairseq_index(our_id: int) -> int:
    """fairseq Dictionary id of our id: its specials are bos 0, pad 1, eos 2, unk 3."""
    return {BOS_ID: 0, PAD_ID: 1, EOS_ID: 2, UNK_ID: 3}.get(our_id, our_id)


def fairseq_permutation(vocab_size: int) -> torch.Tensor:
    """(V,) long: row j of a fairseq embedding = row perm[j] of ours."""
    perm = torch.arange(vocab_size)
    for ours in (BOS_ID, PAD_ID, EOS_ID, UNK_ID):
        perm[fairseq_index(ours)] = ours
    return perm


def fairseq_train_cmd(data_bin: Path, size: str, *, dropout: float, peak_lr: float, warmup: int,
                      max_tokens: int, log_interval: int) -> list[str]:
    """``fairseq-train`` with our recipe for model ``size`` (EN->DE data in ``data_bin``): the
    same sizes, shared embeddings, dropout only on residuals and embeddings, label smoothing
    0.1, Adam(0.9, 0.98, 1e-9), the inverse square root schedule and no clipping; JSON logs.
    Callers add how long it runs and what it saves."""
    le, ld, d, f, h = SIZES[size]
    return [
        venv_tool("fairseq-train"), str(data_bin), "--task", "translation",
        "--source-lang", "en", "--target-lang", "de", "--arch", "transformer",
        "--encoder-embed-dim", str(d), "--encoder-ffn-embed-dim", str(f),
        "--encoder-layers", str(le), "--encoder-attention-heads", str(h),
        "--decoder-embed-dim", str(d), "--decoder-ffn-embed-dim", str(f),
        "--decoder-layers", str(ld), "--decoder-attention-heads", str(h),
        "--share-all-embeddings", "--dropout", str(dropout),
        "--attention-dropout", "0.0", "--activation-dropout", "0.0",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-9",
        "--lr", f"{peak_lr:.8g}", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(warmup),
        # fairseq's first update runs at warmup_init_lr; this starts it where ours starts.
        "--warmup-init-lr", f"{peak_lr / warmup:.8g}", "--clip-norm", "0.0",
        "--max-tokens", str(max_tokens), "--seed", "1", "--num-workers", "0",
        "--log-format", "json", "--log-interval", str(log_interval), "--no-progress-bar",
    ]


def prepare_fairseq_data(dcfg: Any, out_dir: Path, splits: list[str]) -> Path:
    """fairseq-preprocess the binarized splits into ``out_dir`` (skipped when up to date).

    The text handed to fairseq is each sentence's SentencePiece pieces (from our token ids,
    so the sentences and their tokens are exactly ours, cleaning included), one space
    between pieces. ``dict.txt`` lists pieces 4 .. V-1 in id order, so fairseq's dictionary
    (its 4 specials first) has our size V and our ids, specials aside (see
    :func:`fairseq_index`).

    Returns:
        The ``data-bin`` folder (``out_dir / "bin"``).
    """
    import sentencepiece as spm

    from transformer_nmt.data.binarize import TokenDataset
    from transformer_nmt.fileio import bin_prefix, spm_model_path

    bin_dir = out_dir / "bin"
    stamp = bin_dir / "done.json"
    key = {"splits": splits, "spm": str(spm_model_path(dcfg)),
           "spm_mtime": Path(spm_model_path(dcfg)).stat().st_mtime}
    if stamp.is_file() and json.loads(stamp.read_text()) == key:
        return bin_dir
    shutil.rmtree(bin_dir, ignore_errors=True)  # fairseq-preprocess refuses to overwrite
    sp = spm.SentencePieceProcessor(model_file=str(spm_model_path(dcfg)))
    vocab = sp.get_piece_size()
    text_dir = out_dir / "text"
    text_dir.mkdir(parents=True, exist_ok=True)
    pieces = [sp.id_to_piece(i) for i in range(vocab)]
    bad = [p for p in pieces[4:] if not p or any(c.isspace() for c in p)]
    if bad:
        raise ValueError(f"SentencePiece pieces with whitespace cannot go to fairseq: {bad[:5]}")
    with open(out_dir / "dict.txt", "w", encoding="utf-8") as f:
        f.writelines(f"{pieces[i]} {vocab - i}\n" for i in range(4, vocab))
    for split in splits:
        for lang in (dcfg.src_lang, dcfg.tgt_lang):
            ds = TokenDataset(bin_prefix(dcfg, split, lang))
            with open(text_dir / f"{split}.{lang}", "w", encoding="utf-8") as f:
                f.writelines(" ".join(pieces[j] for j in ds[i]) + "\n" for i in range(len(ds)))
    fs_split = {"train": "--trainpref", "valid": "--validpref"}
    cmd = [venv_tool("fairseq-preprocess"), "--source-lang", dcfg.src_lang,
           "--target-lang", dcfg.tgt_lang, "--srcdict", str(out_dir / "dict.txt"),
           "--joined-dictionary", "--destdir", str(bin_dir), "--workers", "1"]
    tests = []
    for split in splits:
        if split in fs_split:
            cmd += [fs_split[split], str(text_dir / split)]
        else:
            tests.append(str(text_dir / split))
    if tests:
        cmd += ["--testpref", ",".join(tests)]
    run_child(cmd, out_dir / "preprocess.log", thread_env(1))
    n = len(read_lines(bin_dir / f"dict.{dcfg.src_lang}.txt")) + 4
    if n != vocab:
        raise RuntimeError(f"fairseq dictionary has {n} entries, expected {vocab}")
    stamp.write_text(json.dumps(key))
    return bin_dir


# ------------------------------------------------------------------------------- FLOPs


def training_flops(size: str, vocab: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Model FLOPs of one training pass (forward + backward) over the given sentences.

    Lengths count real tokens (eos on the source, bos/eos position on the target), padding
    excluded. The formula is the trainer's, :mod:`transformer_nmt.model.flops`.
    """
    from types import SimpleNamespace

    from transformer_nmt.model.flops import TokenCounts
    from transformer_nmt.model.flops import training_flops as model_training_flops

    le, ld, d, f, h = SIZES[size]
    model_cfg = SimpleNamespace(encoder_layers=le, decoder_layers=ld, d_model=d, d_ff=f,
                                heads=h, d_k=None, d_v=None)
    return model_training_flops(model_cfg, vocab, TokenCounts.of(src_lens, tgt_lens))


def flops_per_target_token(size: str, vocab: int, src_sizes: np.ndarray,
                           tgt_sizes: np.ndarray) -> float:
    """:func:`training_flops` over a whole split divided by its target tokens (sizes + 1)."""
    s, t = src_sizes + 1, tgt_sizes + 1
    return training_flops(size, vocab, s, t) / float(t.sum())


def peak_flops(device_name: str | None, precision: str = "bf16") -> float | None:
    """Peak dense FLOP/s of the named GPU at ``precision`` (None when unknown or on CPU): the
    MFU denominator of the trainer and the GPU check,
    :data:`transformer_nmt.model.flops.PEAK_FLOPS`."""
    from transformer_nmt.model.flops import peak_flops as model_peak_flops

    return model_peak_flops(device_name, precision) if device_name else None


# --------------------------------------------------------------------------- weight ports


def sinusoid_rows(model: Any, n: int) -> torch.Tensor:
    """Our positional encodings for positions 0 .. n-1, (n, D)."""
    return model.src_positions(n, 0).detach().clone()


def port_to_fairseq(model: Any, fairseq_data: Path, max_positions: int = 1024):
    """A fairseq ``TransformerModel`` holding the weights of our (post-norm, tied) model.

    Token rows are permuted to fairseq's special-symbol order; the sinusoidal tables are
    replaced by ours (fairseq numbers real positions from padding_idx + 1 = 2); W^Q, W^K,
    W^V are split out of our fused projections.

    Returns:
        ``(fairseq_model, task_dictionary)`` in eval mode on CPU.
    """
    from argparse import Namespace

    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture

    cfg = model.cfg
    if cfg.norm != "post" or cfg.share_embeddings != "all" or cfg.positions != "sinusoidal":
        raise ValueError("the fairseq port handles post-norm, shared, sinusoidal models only")
    dictionary = Dictionary.load(str(fairseq_data / "dict.en.txt"))
    if len(dictionary) != model.vocab_size:
        raise ValueError(f"fairseq dictionary {len(dictionary)} != model vocab {model.vocab_size}")
    args = Namespace(
        encoder_embed_dim=cfg.d_model, encoder_ffn_embed_dim=cfg.d_ff,
        encoder_layers=cfg.encoder_layers, encoder_attention_heads=cfg.heads,
        decoder_embed_dim=cfg.d_model, decoder_ffn_embed_dim=cfg.d_ff,
        decoder_layers=cfg.decoder_layers, decoder_attention_heads=cfg.heads,
        share_all_embeddings=True, dropout=0.0, max_source_positions=max_positions,
        max_target_positions=max_positions,
    )
    base_architecture(args)

    class _Task:
        source_dictionary = dictionary
        target_dictionary = dictionary

    fs = TransformerModel.build_model(args, _Task())
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    sd: dict[str, torch.Tensor] = {}
    emb = ours["embed_tokens.weight"][fairseq_permutation(model.vocab_size)]
    sd["encoder.embed_tokens.weight"] = emb
    sd["decoder.embed_tokens.weight"] = emb
    sd["decoder.output_projection.weight"] = emb

    sd.update(layer_state_dict(ours, cfg, "encoder.layers", "decoder.layers"))
    missing, unexpected = fs.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("embed_positions.weights")
               and not k.endswith("_float_tensor") and not k.endswith(".version")]
    if missing or unexpected:
        raise RuntimeError(f"fairseq port: missing {missing[:8]}, unexpected {unexpected[:8]}")
    pad = dictionary.pad()
    for part in (fs.encoder, fs.decoder):
        table = torch.zeros(max_positions + pad + 1, cfg.d_model)
        table[pad + 1:] = sinusoid_rows(model, max_positions)
        part.embed_positions.weights = table.to(part.embed_positions.weights)
    return fs.eval(), dictionary


def marian_config(size: str, vocab: int, max_positions: int = 1024, dropout: float = 0.1):
    """MarianConfig of preset ``size`` (transformer_nmt.interop.marian.marian_config: post-norm,
    ReLU, sqrt(D) scale, tied embeddings, our special ids, bos as decoder start)."""
    from transformer_nmt.interop.marian import marian_config as product_marian_config

    le, ld, d, f, h = SIZES[size]
    cfg = {"encoder_layers": le, "decoder_layers": ld, "d_model": d, "d_ff": f, "heads": h,
           "dropout": dropout, "attention_dropout": 0.0, "activation_dropout": 0.0,
           "max_positions": max_positions}
    return product_marian_config(cfg, vocab)


def import_transformers():
    """Import ``transformers`` without its optional torchaudio hook.

    fairseq pins a torchaudio whose compiled extension may not match the installed torch;
    transformers imports torchaudio whenever it is installed, and a broken one makes
    ``MarianMTModel`` unimportable. The benchmark needs no audio, so the check is answered
    'not available'.
    """
    import transformers.utils.import_utils as iu

    iu.is_torchaudio_available = lambda: False
    import transformers.utils as tu

    tu.is_torchaudio_available = lambda: False
    import transformers

    return transformers


def port_to_marian(model: Any, size: str | None = None):
    """A ``MarianMTModel`` computing our model's logits: the product's exporter
    (transformer_nmt.interop.marian.port_to_marian), with transformers imported without torchaudio.
    ``size`` is unused (the model's own config gives the sizes)."""
    import_transformers()
    from transformer_nmt.interop.marian import port_to_marian as product_port

    return product_port(model)
