"""``train(cfg)``: the paper's training recipe (section 5) in one explicit loop.

The same loop runs for every world size: one CPU process, one GPU, ``torchrun`` on eight
GPUs, or many nodes. With world size 1 there is no process group and every collective in
:mod:`transformer_nmt.distributed` is a no-op.

One optimizer step (``step``) = ``update_freq`` micro-batches (``micro_step``) per rank:

1. The step's micro-batches are drawn first; their non-pad target tokens are summed and
   all-reduced once, giving ``ntokens_global`` (all micro-batches, all ranks).
2. Each micro-batch's summed label-smoothed loss (:mod:`transformer_nmt.loss`) is
   multiplied by ``world_size / ntokens_global`` and back-propagated; DDP's ``no_sync()``
   holds the gradient all-reduce until the last micro-batch. DDP *averages* gradients over
   ranks, so the factor ``world_size`` undoes that average: the final gradient is exactly
   ``d(sum of all token losses of the step) / d(theta) / ntokens_global``, whatever the
   world size and ``update_freq``.
3. A rank whose sampler has no batch left for a micro-step (the ``[]`` padding batches at
   the end of an epoch) runs a one-token dummy batch with weight 0, so every rank joins
   every gradient all-reduce.
4. Gradients are unscaled (fp16), their global norm computed (and clipped when
   ``clip_norm > 0``); a step whose loss or gradient norm is not finite is skipped: no
   optimizer or schedule update, gradients zeroed, ``skipped_steps`` incremented. After
   ``max_bad_steps`` such steps in a row training stops with a RuntimeError.

Counters: ``micro_step`` (micro-batches consumed per rank), ``step`` (successful optimizer
updates; the learning-rate schedule follows it), ``tokens_seen`` (non-pad target tokens
processed over all ranks, skipped steps included), ``epoch`` (completed passes over the
training set).

Checkpoints (rank 0 writes; see :mod:`transformer_nmt.checkpoint`) hold the plain model
state, optimizer, schedule, grad scaler, the sampler position counted by this loop, every
rank's RNG states and the counters, so a run restarted in the same run directory continues
bit-for-bit (same world size). SIGTERM / SIGUSR1 set a flag; at the next step boundary
rank 0 writes a checkpoint and every rank returns.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from transformer_nmt import checkpoint as ckpt_lib
from transformer_nmt import distributed
from transformer_nmt.batching import (
    Batch,
    LengthBucketSampler,
    ParallelDataset,
    build_dataloader,
    collate,
)
from transformer_nmt.binarize import TokenDataset
from transformer_nmt.config import PAD_ID
from transformer_nmt.fileio import atomic_write, bin_prefix, raw_path, spm_model_path
from transformer_nmt.loss import label_smoothed_nll_loss
from transformer_nmt.model import Transformer
from transformer_nmt.optim import build_optimizer, build_scheduler
from transformer_nmt.translate import autocast_context

log = logging.getLogger(__name__)

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")
"""Signals that make the run checkpoint and exit at the next step boundary."""

DRY_RUN_TRAIN_PAIRS = 2000
"""Training pairs of the slice a dry run prepares when the experiment's data is missing."""
DRY_RUN_VOCAB = 1000
"""SentencePiece vocabulary of that slice (the model still uses the experiment's size)."""


# ------------------------------------------------------------------------------ precision


def resolve_precision(requested: str, device: torch.device) -> str:
    """The precision actually used: ``fp32``, ``bf16`` or ``fp16``.

    ``auto`` is bf16 on GPUs that support it (Ampere and later), fp16 with dynamic loss
    scaling on older GPUs (P100 / V100 class), fp32 on CPU.

    Raises:
        ValueError: fp16 requested on CPU (no loss-scaled fp16 training there).
    """
    if device.type != "cuda":
        if requested == "fp16":
            raise ValueError("trainer.precision=fp16 needs a CUDA GPU; use fp32 or bf16 on CPU")
        return "fp32" if requested == "auto" else requested
    if requested == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return requested


def _grad_scaler(enabled: bool):
    """A dynamic loss scaler for fp16 (a disabled one otherwise)."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)  # torch < 2.3


# ----------------------------------------------------------------------------------- FLOPs


def matmul_params_per_token(model_cfg: Any, vocab_size: int) -> tuple[int, int]:
    """Weights each source / target token is multiplied by in one forward pass.

    Counts the weight matrices of every linear map (biases, LayerNorm, embedding lookups and
    the attention score / context products are left out):

    * per source token: each encoder layer's W^Q, W^K, W^V, W^O and feed-forward, plus the
      W^K, W^V of every decoder cross-attention (applied to the encoder output);
    * per target token: each decoder layer's self-attention W^Q, W^K, W^V, W^O,
      cross-attention W^Q, W^O, feed-forward, plus the pre-softmax projection (D x V).

    Returns:
        ``(per_source_token, per_target_token)`` weight counts.
    """
    d = int(model_cfg.d_model)
    h = int(model_cfg.heads)
    dk = int(model_cfg.d_k or d // h)
    dv = int(model_cfg.d_v or d // h)
    q = k = d * h * dk
    v = d * h * dv
    o = h * dv * d
    ffn = 2 * d * int(model_cfg.d_ff)
    self_attn = q + k + v + o
    per_src = int(model_cfg.encoder_layers) * (self_attn + ffn) + int(model_cfg.decoder_layers) * (
        k + v
    )
    per_tgt = int(model_cfg.decoder_layers) * (self_attn + q + o + ffn) + d * int(vocab_size)
    return per_src, per_tgt


def estimate_training_flops(
    model_cfg: Any, vocab_size: int, src_tokens: int, tgt_tokens: int
) -> float:
    """Estimated training FLOPs: ``6 x (P_src x src_tokens + P_tgt x tgt_tokens)``.

    ``P_src, P_tgt`` come from :func:`matmul_params_per_token`; a multiply-add is 2 FLOPs
    and the backward pass costs twice the forward, hence 6. Tokens are non-pad tokens
    (eos included) processed over all ranks, skipped steps included; padding and the
    attention score products (about L / (3 d_model) of the rest for length L) are not
    counted. See docs/training.md.
    """
    per_src, per_tgt = matmul_params_per_token(model_cfg, vocab_size)
    return 6.0 * (per_src * float(src_tokens) + per_tgt * float(tgt_tokens))


# ------------------------------------------------------------------------------------ RNG


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's RNG states in types ``torch.load(weights_only=True)`` accepts."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {"version": int(py_version), "state": list(py_state), "gauss_next": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    if torch.cuda.is_available() and state.get("cuda"):
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


# ----------------------------------------------------------------------------------- data


def _split_files(cfg: Any, split: str) -> list[Path]:
    d = cfg.data
    out = []
    for lang in (d.src_lang, d.tgt_lang):
        prefix = bin_prefix(d, split, lang)
        out += [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
    return out


def data_ready(cfg: Any) -> bool:
    """True when the SentencePiece model and the binarized train / valid splits exist."""
    needed = [spm_model_path(cfg.data)]
    needed += _split_files(cfg, cfg.data.train_split) + _split_files(cfg, cfg.data.valid_split)
    return all(p.is_file() for p in needed)


def ensure_data(cfg: Any, info: distributed.DistInfo, poll_seconds: float = 5.0) -> None:
    """Run ``prepare.prepare(cfg)`` on rank 0 when the binarized data is missing; all ranks wait.

    The other ranks poll the file system instead of waiting in a collective, so a long
    preparation (WMT14) cannot run into the process group's timeout; if rank 0 fails,
    torchrun stops the whole job. ``data.root`` must be visible to every rank.

    Raises:
        transformer_nmt.corpora.DataError and others from ``prepare`` (rank 0).
    """
    if not data_ready(cfg):
        if info.is_main:
            from transformer_nmt import prepare

            log.info("binarized data for %s not found under %s: running prepare",
                     cfg.data.name, cfg.data.root)
            prepare.prepare(cfg)
        else:
            while not data_ready(cfg):
                time.sleep(poll_seconds)
    distributed.barrier()


def load_split(cfg: Any, split: str) -> ParallelDataset:
    """The binarized ``split`` as a :class:`ParallelDataset` (source and target)."""
    d = cfg.data
    src = TokenDataset(bin_prefix(d, split, d.src_lang))
    tgt = TokenDataset(bin_prefix(d, split, d.tgt_lang))
    return ParallelDataset(src, tgt)


def _dummy_batch() -> Batch:
    """A one-sentence batch with an empty source and target (1 source, 1 target token)."""
    empty = np.zeros(0, dtype=np.int64)
    batch = collate([(0, empty, empty)])
    assert batch is not None
    return batch


# ----------------------------------------------------------------------------- the step


def forward_backward(
    model: torch.nn.Module,
    micro_batches: list[Batch | None],
    *,
    epsilon: float,
    device: torch.device,
    world_size: int,
    autocast: Any = contextlib.nullcontext,
    scaler: Any = None,
) -> dict[str, Any]:
    """Accumulate the gradient of one optimizer step over its micro-batches.

    The result, after DDP's averaging over ranks, is the gradient of
    ``sum(token losses over all micro-batches and ranks) / ntokens_global``.

    Args:
        model: the training model (plain, compiled, or wrapped in DDP, which has ``no_sync``).
        micro_batches: this rank's ``update_freq`` (or fewer, at an epoch's end) batches;
            None marks a micro-step without data on this rank (a dummy batch with weight 0
            is run so that every rank joins DDP's all-reduce).
        epsilon: label smoothing.
        device: where the model lives.
        world_size: number of data-parallel ranks (the loss factor that cancels DDP's mean).
        autocast: a callable returning the autocast context.
        scaler: an fp16 GradScaler (or None / a disabled one).

    Returns:
        ``{"ntokens": global non-pad target tokens (int), "src_tokens": global source
        tokens incl. eos (int), "loss_sum", "nll_sum": this rank's summed losses (float32
        0-dim tensors, detached), "nsentences": this rank's sentences (int)}``.
    """
    real = [b for b in micro_batches if b is not None]
    counts = torch.tensor(
        [sum(b.ntokens for b in real), sum(int(b.src_lengths.sum()) for b in real)],
        dtype=torch.float64,
        device=device,
    )
    distributed.all_reduce_sum(counts)  # once per step: the global normaliser
    ntokens_global = int(counts[0].item())
    src_tokens_global = int(counts[1].item())
    factor = world_size / max(ntokens_global, 1)
    loss_total = torch.zeros((), dtype=torch.float32, device=device)
    nll_total = torch.zeros((), dtype=torch.float32, device=device)
    no_sync = getattr(model, "no_sync", None)
    for i, batch in enumerate(micro_batches):
        weight = factor
        if batch is None:
            batch, weight = _dummy_batch(), 0.0
        batch = batch.to(device)
        last = i == len(micro_batches) - 1
        sync_ctx = contextlib.nullcontext() if (last or no_sync is None) else no_sync()
        with sync_ctx:
            keep = batch.tgt_out.ne(PAD_ID)  # (B, T): real target positions
            with autocast():
                logits = model(batch.src_tokens, batch.tgt_in, keep)  # (N, V), N real
            loss, nll = label_smoothed_nll_loss(
                logits, batch.tgt_out[keep], epsilon, ignore_index=None  # (N,) real
            )
            scaled = loss * weight
            if scaler is not None:
                scaled = scaler.scale(scaled)
            scaled.backward()
        if weight != 0.0:
            loss_total += loss.detach()
            nll_total += nll.detach()
    return {
        "ntokens": ntokens_global,
        "src_tokens": src_tokens_global,
        "loss_sum": loss_total,
        "nll_sum": nll_total,
        "nsentences": sum(b.nsentences for b in real),
    }


def grad_norm_(params: list[torch.nn.Parameter], clip_norm: float) -> float:
    """Global L2 norm of the gradients (clipped to ``clip_norm`` when > 0); inf/nan if any is."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    max_norm = clip_norm if clip_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(with_grad, max_norm))


# ------------------------------------------------------------------------------ validation


@torch.no_grad()
def validate_loss(
    model: torch.nn.Module,
    loader: DataLoader,
    *,
    epsilon: float,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity on the valid split, summed over ranks.

    Returns:
        ``{"loss": smoothed loss per target token (nats), "nll_loss": NLL per token (nats),
        "ppl": exp(nll_loss), "ntokens": tokens scored over all ranks}``.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, ntokens
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        if batch is None:
            continue
        batch = batch.to(device)
        keep = batch.tgt_out.ne(PAD_ID)  # (B, T)
        with autocast():
            logits = model(batch.src_tokens, batch.tgt_in, keep)  # (N, V)
        loss, nll = label_smoothed_nll_loss(logits, batch.tgt_out[keep], epsilon, ignore_index=None)
        sums += torch.stack([loss.double(), nll.double(), torch.tensor(
            float(batch.ntokens), dtype=torch.float64, device=device)])
    distributed.all_reduce_sum(sums)
    model.train(was_training)
    n = max(float(sums[2]), 1.0)
    nll_loss = float(sums[1]) / n
    return {
        "loss": float(sums[0]) / n,
        "nll_loss": nll_loss,
        "ppl": math.exp(min(nll_loss, 100.0)),
        "ntokens": float(sums[2]),
    }


@torch.no_grad()
def validate_bleu(
    model: torch.nn.Module,
    dataset: ParallelDataset,
    references: list[str],
    tokenizer: Any,
    cfg: Any,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
) -> float:
    """sacreBLEU of greedy translations of the first ``len(references)`` valid sentences."""
    import sacrebleu

    from transformer_nmt.beam_search import greedy_search

    n = len(references)
    was_training = model.training
    model.eval()
    sampler = LengthBucketSampler(
        dataset.src_sizes[:n], None, int(cfg.decode.max_tokens), shuffle=False,
        skip_too_long=True,
    )
    hyps = [""] * n
    for indices in sampler:
        batch = collate([(i, dataset[i][1], None) for i in indices])
        if batch is None:
            continue
        with autocast():
            results = greedy_search(
                model, batch.src_tokens.to(device),
                max_len_a=float(cfg.decode.max_len_a), max_len_b=int(cfg.decode.max_len_b),
            )
        for i, nbest in zip(indices, results):
            hyps[i] = tokenizer.decode(nbest[0].tokens)
    model.train(was_training)
    return float(sacrebleu.corpus_bleu(hyps, [references]).score)


def _valid_references(cfg: Any, dataset: ParallelDataset, tokenizer: Any, n: int) -> list[str]:
    """The first ``n`` valid targets as text: the cleaned text file, else decoded ids."""
    path = raw_path(cfg.data, cfg.data.valid_split, cfg.data.tgt_lang)
    n = min(n, len(dataset))
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(n), f)]
        if len(lines) == n:
            return lines
    return [tokenizer.decode(dataset[i][2]) for i in range(n)]


# ---------------------------------------------------------------------------- bookkeeping


class _MetricsLog:
    """TensorBoard scalars and ``metrics.jsonl`` lines (rank 0 only; no-ops elsewhere)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.writer = None
        self.jsonl = run_dir / "metrics.jsonl"
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def write(self, split: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        for key, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        line = {"split": split, "step": step, "time": time.time(), **values}
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


class _StopFlag:
    """Installs SIGTERM / SIGUSR1 handlers that only record that a stop was requested."""

    def __init__(self) -> None:
        self.requested = 0
        self.previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = signum

    def install(self) -> None:
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                self.previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()


def _fmt_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _dry_run_config(cfg: Any) -> Any:
    """The config of a dry run: a few steps in ``<run_dir>/dry_run``, never the real checkpoints.

    When the experiment's binarized data is missing, a slice is prepared instead under its
    own name (``<data.name>_dry_run``): the first ``DRY_RUN_TRAIN_PAIRS`` training pairs of
    the real corpus with a ``DRY_RUN_VOCAB`` SentencePiece vocabulary. The model is still
    built with the experiment's ``data.vocab_size`` so that parameter count, memory and
    speed are those of the real run.
    """
    cfg = copy.deepcopy(cfg)
    t = cfg.trainer
    t.max_steps = int(t.dry_run_steps)
    t.max_epochs = None
    t.max_time_minutes = None
    t.save_every_steps = None
    t.save_every_minutes = None
    t.validate_every_steps = None
    t.log_every_steps = 1
    t.keep_last = 1
    t.patience = None
    t.valid_bleu_sentences = min(int(t.valid_bleu_sentences), 16)
    cfg.run_dir = str(Path(cfg.run_dir) / "dry_run")
    if not data_ready(cfg):
        cfg.data.name = f"{cfg.data.name}_dry_run"
        limit = cfg.data.max_train_pairs
        cfg.data.max_train_pairs = min(limit, DRY_RUN_TRAIN_PAIRS) if limit else DRY_RUN_TRAIN_PAIRS
        cfg.data.vocab_size = min(int(cfg.data.vocab_size), DRY_RUN_VOCAB)
    return cfg


# ----------------------------------------------------------------------------------- train


def train(cfg: Any) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data`` with ``cfg.trainer``; resume when the run has checkpoints.

    Args:
        cfg: the composed, validated config (``config.validate`` already called).

    Returns:
        The run summary, also written to ``<run_dir>/train_summary.json`` (rank 0): steps,
        tokens_seen, train_seconds, world_size, device, gpu_hours, flops, stopped_by, ...

    Raises:
        RuntimeError: ``max_bad_steps`` consecutive non-finite steps, or data preparation
            failed.
        ValueError: bad precision for the device, empty training set.
    """
    info = distributed.init_distributed()
    try:
        return _train(cfg, info)
    finally:
        distributed.cleanup()


def _train(cfg: Any, info: distributed.DistInfo) -> dict[str, Any]:
    full_vocab: int | None = None
    if cfg.trainer.dry_run:
        full_vocab = int(cfg.data.vocab_size)
        cfg = _dry_run_config(cfg)
        if info.is_main:
            shutil.rmtree(cfg.run_dir, ignore_errors=True)
        distributed.barrier()
    t_cfg = cfg.trainer
    device = info.device
    run_dir = Path(cfg.run_dir)
    if not info.is_main:
        log.setLevel(logging.WARNING)
    if device.type == "cuda" and t_cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = resolve_precision(t_cfg.precision, device)

    def autocast() -> contextlib.AbstractContextManager:
        return autocast_context(precision, device)

    # --- data ---------------------------------------------------------------------------
    ensure_data(cfg, info)
    from transformer_nmt.bpe import SentencePieceTokenizer, vocab_identity

    tokenizer = SentencePieceTokenizer(spm_model_path(cfg.data))
    vocab_size = max(tokenizer.vocab_size, full_vocab or 0)
    train_set = load_split(cfg, cfg.data.train_split)
    valid_set = load_split(cfg, cfg.data.valid_split)
    seed = int(t_cfg.seed)
    sampler = LengthBucketSampler(
        train_set.src_sizes, train_set.tgt_sizes, int(t_cfg.max_tokens), shuffle=True,
        seed=seed, rank=info.rank, world_size=info.world_size,
    )
    if len(sampler) == 0:
        raise ValueError(f"training split {cfg.data.train_split!r} of {cfg.data.name} is empty")
    valid_sampler = LengthBucketSampler(
        valid_set.src_sizes, valid_set.tgt_sizes, int(t_cfg.max_tokens), shuffle=False,
        rank=info.rank, world_size=info.world_size, skip_too_long=True,
    )
    pin = device.type == "cuda"
    # Private generators: creating a loader iterator must not draw from the global torch RNG.
    train_loader = build_dataloader(train_set, sampler, int(t_cfg.num_workers), pin,
                                    generator=torch.Generator().manual_seed(seed))
    valid_loader = build_dataloader(valid_set, valid_sampler, 0, pin,
                                    generator=torch.Generator().manual_seed(seed))
    update_freq = int(t_cfg.update_freq)
    steps_per_epoch = math.ceil(len(sampler) / update_freq)
    log.info(
        "data %s: %d train pairs in %d batches/rank/epoch (%d steps/epoch), %d valid pairs, "
        "vocab %d, padding efficiency %.3f",
        cfg.data.name, len(train_set), len(sampler), steps_per_epoch, len(valid_set),
        tokenizer.vocab_size, sampler.padding_efficiency,
    )

    # --- model, optimizer, precision ------------------------------------------------------
    _seed_everything(seed)
    model = Transformer(cfg.model, vocab_size=vocab_size).to(device)
    log.info("model %s: %s parameters", cfg.model.name, f"{model.num_parameters():,}")
    optimizer = build_optimizer(model, t_cfg)
    scheduler = build_scheduler(optimizer, int(cfg.model.d_model), t_cfg)
    scaler = _grad_scaler(precision == "fp16")
    train_model: torch.nn.Module = torch.compile(model) if t_cfg.compile else model
    if info.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(
            train_model,
            device_ids=[info.local_rank] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
    _seed_everything(seed + info.rank)
    params = [p for p in model.parameters() if p.requires_grad]

    # --- state and resume -------------------------------------------------------------------
    state: dict[str, Any] = {
        "step": 0, "micro_step": 0, "tokens_seen": 0, "src_tokens_seen": 0, "epoch": 0,
        "position": 0, "train_seconds": 0.0, "skipped_steps": 0, "bad_steps_in_row": 0,
        "best_valid_loss": None, "best_valid_bleu": None, "validations_without_improvement": 0,
        "world_size": info.world_size,
    }
    resumed_from = ckpt_lib.latest_checkpoint(run_dir)
    if resumed_from is not None:
        saved = ckpt_lib.load_checkpoint(resumed_from, map_location="cpu")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if saved.get("scaler") and scaler.is_enabled():
            scaler.load_state_dict(saved["scaler"])
        state.update(saved["train_state"])
        saved_ws = int(state["world_size"])
        if saved_ws != info.world_size:
            log.warning(
                "%s was written with world_size=%d, now %d: the data position is rescaled and "
                "RNG streams reseeded, so the run will not match an uninterrupted one exactly",
                resumed_from, saved_ws, info.world_size,
            )
            state["position"] = state["position"] * saved_ws // info.world_size
            if state["position"] >= len(sampler):
                state["epoch"] += 1
                state["position"] = 0
            _seed_everything(seed + info.rank + 1000 * int(state["step"]))
        else:
            set_rng_state(saved["rng"][info.rank])
        state["world_size"] = info.world_size
        log.info("resumed from %s (step %d, epoch %d, batch %d of the epoch)", resumed_from,
                 state["step"], state["epoch"], state["position"])
        del saved

    def checkpoint_state() -> dict[str, Any] | None:
        """Every rank calls it (RNG states are gathered); rank 0 gets the dict."""
        rngs = distributed.all_gather_object(rng_state())
        if not info.is_main:
            return None
        return {
            "model": model.state_dict(),
            "config": OmegaConf.to_container(
                cfg if OmegaConf.is_config(cfg) else OmegaConf.structured(cfg), resolve=True
            ),
            "vocab_size": vocab_size,
            "vocab": vocab_identity(tokenizer.model_path),
            "step": state["step"],
            "micro_step": state["micro_step"],
            "tokens_seen": state["tokens_seen"],
            "epoch": state["epoch"],
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "sampler": {"epoch": state["epoch"], "position": state["position"], "seed": seed},
            "rng": rngs,
            "train_state": dict(state),
        }

    def save(best: bool = False, regular: bool = True) -> None:
        ckpt = checkpoint_state()
        if ckpt is None:
            return
        folder = ckpt_lib.checkpoint_dir(run_dir)
        if regular:
            path = ckpt_lib.save_checkpoint(folder / f"checkpoint_{state['step']}.pt", ckpt)
            ckpt_lib.prune_checkpoints(run_dir, int(t_cfg.keep_last))
            log.info("saved %s", path)
        if best:
            ckpt_lib.save_checkpoint(folder / ckpt_lib.BEST_NAME, ckpt)
            log.info("saved %s (step %d)", folder / ckpt_lib.BEST_NAME, state["step"])

    # --- validation (+ best checkpoint and patience) ------------------------------------------
    metrics = _MetricsLog(run_dir, info.is_main)
    bleu_refs: list[str] = []
    if t_cfg.valid_bleu and info.is_main:
        bleu_refs = _valid_references(cfg, valid_set, tokenizer, int(t_cfg.valid_bleu_sentences))
    last_valid: dict[str, float] = {}

    def run_validation() -> bool:
        """Validate; returns True when this is the best validation so far."""
        res = validate_loss(
            model, valid_loader, epsilon=float(t_cfg.label_smoothing), device=device,
            autocast=autocast, max_batches=4 if t_cfg.dry_run else None,
        )
        if t_cfg.valid_bleu:
            bleu = None
            if info.is_main:
                bleu = validate_bleu(model, valid_set, bleu_refs, tokenizer, cfg, device, autocast)
            res["bleu"] = distributed.broadcast_object(bleu)
        last_valid.clear()
        last_valid.update(res)
        loss_improved = state["best_valid_loss"] is None or res["loss"] < state["best_valid_loss"]
        if loss_improved:
            state["best_valid_loss"] = res["loss"]
        improved = loss_improved
        if t_cfg.valid_bleu:
            improved = state["best_valid_bleu"] is None or res["bleu"] > state["best_valid_bleu"]
            if improved:
                state["best_valid_bleu"] = res["bleu"]
        state["validations_without_improvement"] = (
            0 if improved else state["validations_without_improvement"] + 1
        )
        metrics.write("valid", state["step"], res)
        log.info(
            "valid step %d | loss %.4f | nll %.4f | ppl %.2f%s%s", state["step"], res["loss"],
            res["nll_loss"], res["ppl"],
            f" | bleu {res['bleu']:.2f}" if "bleu" in res else "", " | best" if improved else "",
        )
        return improved

    # --- the loop --------------------------------------------------------------------------------
    stop_flag = _StopFlag()
    stop_flag.install()
    max_steps = t_cfg.max_steps
    max_epochs = t_cfg.max_epochs
    if max_steps is not None:
        total_steps: int | None = int(max_steps)
    elif max_epochs is not None:
        total_steps = int(max_epochs) * steps_per_epoch
    else:
        total_steps = None
    show_bar = info.is_main and sys.stderr.isatty()
    from tqdm import tqdm

    bar = tqdm(total=total_steps, initial=state["step"], disable=not show_bar, unit="step",
               dynamic_ncols=True)
    epsilon = float(t_cfg.label_smoothing)
    log_every = max(int(t_cfg.log_every_steps), 1)
    save_every_s = (
        float(t_cfg.save_every_minutes) * 60 if t_cfg.save_every_minutes else None
    )
    max_time_s = float(t_cfg.max_time_minutes) * 60 if t_cfg.max_time_minutes else None
    last_saved_step = state["step"] if resumed_from is not None else -1
    last_valid_step = state["step"] if resumed_from is not None else -1
    last_save_time = time.monotonic()
    interval = {"loss": 0.0, "nll": 0.0, "ntokens": 0, "steps": 0, "start": time.perf_counter()}
    last_grad_norm = float("nan")
    stopped_by = None
    loop_start = time.perf_counter()
    seconds_before = float(state["train_seconds"])
    loader_iter: Iterator[Batch | None] | None = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    log.info(
        "training on %s x %d (%s), update_freq %d, max_tokens %d: step %d of %s",
        _device_name(device), info.world_size, precision, update_freq, int(t_cfg.max_tokens),
        state["step"], total_steps,
    )

    def epoch_progress() -> float:
        """Epochs done as a fraction (global batches consumed / batches per epoch)."""
        done = min(state["position"] * info.world_size, sampler.num_batches)
        return state["epoch"] + done / sampler.num_batches

    def reached_limit() -> str | None:
        if max_steps is not None and state["step"] >= int(max_steps):
            return "max_steps"
        if max_epochs is not None and state["epoch"] >= int(max_epochs):
            return "max_epochs"
        return None

    stopped_by = reached_limit()
    try:
        while stopped_by is None:
            # -- draw this step's micro-batches (the same count on every rank) --------------
            if loader_iter is None:
                sampler.set_epoch(state["epoch"])
                sampler.load_state_dict(
                    {"epoch": state["epoch"], "position": state["position"], "seed": seed}
                )
                loader_iter = iter(train_loader)
            k = min(update_freq, len(sampler) - state["position"])
            micro_batches = [next(loader_iter) for _ in range(k)]
            state["position"] += k
            state["micro_step"] += k
            if state["position"] >= len(sampler):
                state["epoch"] += 1
                state["position"] = 0
                loader_iter = None

            # -- forward / backward over the micro-batches, then the update ----------------
            t0 = time.perf_counter()
            out = forward_backward(
                train_model, micro_batches, epsilon=epsilon, device=device,
                world_size=info.world_size, autocast=autocast, scaler=scaler,
            )
            scaler.unscale_(optimizer)
            grad_norm = grad_norm_(params, float(t_cfg.clip_norm))
            losses = distributed.all_reduce_sum(torch.stack([out["loss_sum"], out["nll_sum"]]))
            loss_sum, nll_sum = float(losses[0]), float(losses[1])
            lr = scheduler.get_last_lr()[0]
            state["tokens_seen"] += out["ntokens"]
            state["src_tokens_seen"] += out["src_tokens"]
            if math.isfinite(loss_sum) and math.isfinite(grad_norm):
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                state["bad_steps_in_row"] = 0
                interval["loss"] += loss_sum
                interval["nll"] += nll_sum
                interval["ntokens"] += out["ntokens"]
                last_grad_norm = grad_norm
                bar.update(1)
            else:
                optimizer.zero_grad(set_to_none=True)
                scaler.update()
                state["skipped_steps"] += 1
                state["bad_steps_in_row"] += 1
                log.warning(
                    "step %d skipped: loss %s, gradient norm %s (%d in a row, %d in total)",
                    state["step"] + 1, loss_sum, grad_norm, state["bad_steps_in_row"],
                    state["skipped_steps"],
                )
                if state["bad_steps_in_row"] >= int(t_cfg.max_bad_steps):
                    raise RuntimeError(
                        f"training stopped at step {state['step']}: {state['bad_steps_in_row']} "
                        f"consecutive steps had a non-finite loss or gradient "
                        f"(trainer.max_bad_steps={t_cfg.max_bad_steps}; last loss={loss_sum}, "
                        f"gradient norm={grad_norm}, lr={lr:.3g}). Lower the learning rate "
                        "(trainer.lr_multiplier), set trainer.clip_norm, or use bf16/fp32; "
                        f"the last good checkpoint is {ckpt_lib.latest_checkpoint(run_dir)}"
                    )
            interval["steps"] += 1
            step_seconds = time.perf_counter() - t0
            train_seconds = seconds_before + time.perf_counter() - loop_start
            state["train_seconds"] = train_seconds
            bar.set_postfix(
                loss=f"{loss_sum / max(out['ntokens'], 1):.3f}", lr=f"{lr:.2e}",
                tok_s=f"{out['ntokens'] / max(step_seconds, 1e-9):,.0f}", refresh=False,
            )

            # -- logging -----------------------------------------------------------------------
            if state["step"] % log_every == 0 and interval["steps"] and state["bad_steps_in_row"] == 0:
                elapsed = time.perf_counter() - interval["start"]
                ntok = max(interval["ntokens"], 1)
                nll = interval["nll"] / ntok
                record = {
                    "loss": interval["loss"] / ntok,
                    "nll_loss": nll,
                    "ppl": math.exp(min(nll, 100.0)),
                    "lr": lr,
                    "grad_norm": last_grad_norm,
                    "tokens_per_s": interval["ntokens"] / max(elapsed, 1e-9),
                    "seconds_per_step": elapsed / interval["steps"],
                    "skipped_steps": state["skipped_steps"],
                    "epoch": epoch_progress(),
                    "tokens_seen": state["tokens_seen"],
                }
                if device.type == "cuda":
                    record["gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                metrics.write("train", state["step"], record)
                if not show_bar:
                    eta = ""
                    if total_steps:
                        eta = _fmt_seconds(
                            record["seconds_per_step"] * (total_steps - state["step"])
                        )
                    log.info(
                        "step %d/%s | loss %.4f | nll %.4f | ppl %.2f | lr %.3e | gnorm %.3f | "
                        "%.0f tok/s | %.3f s/step | epoch %.2f | eta %s",
                        state["step"], total_steps, record["loss"], nll, record["ppl"], lr,
                        last_grad_norm, record["tokens_per_s"], record["seconds_per_step"],
                        record["epoch"], eta or "?",
                    )
                interval = {"loss": 0.0, "nll": 0.0, "ntokens": 0, "steps": 0,
                            "start": time.perf_counter()}

            # -- decisions every rank must agree on (time is read on rank 0) --------------------
            flags = torch.tensor(
                [
                    stop_flag.requested,
                    int(info.is_main and save_every_s is not None
                        and time.monotonic() - last_save_time >= save_every_s),
                    int(info.is_main and max_time_s is not None and train_seconds >= max_time_s),
                ],
                dtype=torch.int64, device=device,
            )
            signal_num, save_for_time, out_of_time = distributed.all_reduce_max(flags).tolist()
            stopped_by = reached_limit()
            if stopped_by is None and out_of_time:
                stopped_by = "max_time"
            if stopped_by is None and signal_num:
                stopped_by = f"signal {signal.Signals(signal_num).name}"

            # -- validation, checkpoints ------------------------------------------------------------
            stepped = state["bad_steps_in_row"] == 0
            best = False
            vfreq = t_cfg.validate_every_steps
            if stepped and state["step"] != last_valid_step and (
                (vfreq and state["step"] % int(vfreq) == 0)
                or stopped_by in ("max_steps", "max_epochs", "max_time")
            ):
                best = run_validation()
                last_valid_step = state["step"]
                if (t_cfg.patience is not None and stopped_by is None
                        and state["validations_without_improvement"] >= int(t_cfg.patience)):
                    stopped_by = "patience"
            sfreq = t_cfg.save_every_steps
            regular = state["step"] != last_saved_step and (
                (stepped and sfreq and state["step"] % int(sfreq) == 0)
                or save_for_time
                or stopped_by is not None
            )
            if regular or best:
                save(best=best, regular=regular)
                if regular:
                    last_saved_step = state["step"]
                    last_save_time = time.monotonic()
    finally:
        bar.close()
        stop_flag.restore()
        metrics.close()

    state["train_seconds"] = seconds_before + time.perf_counter() - loop_start
    on_gpu = device.type == "cuda"
    hours = state["train_seconds"] / 3600 * info.world_size
    flops = estimate_training_flops(cfg.model, vocab_size, state["src_tokens_seen"],
                                    state["tokens_seen"])
    summary = {
        "name": cfg.name,
        "stopped_by": stopped_by,
        "steps": state["step"],
        "micro_steps": state["micro_step"],
        "epochs": epoch_progress(),
        "tokens_seen": state["tokens_seen"],
        "src_tokens_seen": state["src_tokens_seen"],
        "skipped_steps": state["skipped_steps"],
        "train_seconds": state["train_seconds"],
        "world_size": info.world_size,
        "device": _device_name(device),
        "precision": precision,
        "gpu_hours": hours if on_gpu else 0.0,
        "cpu_hours": 0.0 if on_gpu else hours,
        "flops": flops,
        "flops_formula": "6 * (P_src * src_tokens + P_tgt * tgt_tokens), matmul weights only "
        "(docs/training.md)",
        "parameters": model.num_parameters(),
        "vocab_size": vocab_size,
        "max_tokens": int(t_cfg.max_tokens),
        "update_freq": update_freq,
        "valid": dict(last_valid),
        "best_valid_loss": state["best_valid_loss"],
        "best_valid_bleu": state["best_valid_bleu"],
        "last_checkpoint": str(ckpt_lib.latest_checkpoint(run_dir)) if info.is_main else None,
        "resumed_from": str(resumed_from) if resumed_from else None,
    }
    if info.is_main:
        with atomic_write(run_dir / "train_summary.json") as f:
            json.dump(summary, f, indent=2)
        log.info("finished (%s): %d steps, %s target tokens, %.1f %s-hours, %.3g FLOPs",
                 stopped_by, state["step"], f"{state['tokens_seen']:,}", hours,
                 "GPU" if on_gpu else "CPU", flops)
    distributed.barrier()
    return summary
