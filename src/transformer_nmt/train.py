"""``train(cfg)``: the paper's training recipe (section 5) as setup, a :class:`TrainState` and one loop.

The same loop runs for every world size (one CPU process, one GPU, ``torchrun`` on many
GPUs or nodes); with world size 1 every collective of :mod:`transformer_nmt.distributed` is
a no-op. One optimizer ``step`` = ``update_freq`` micro-batches (``micro_step``) per rank:
their non-pad target tokens are all-reduced once (``ntokens_global``), each micro-batch's
summed label-smoothed loss is scaled by ``world_size / ntokens_global`` (undoing DDP's mean)
and back-propagated, so the gradient is that of ``sum(token losses) / ntokens_global``
whatever the world size and ``update_freq``. A rank without a batch for a micro-step runs a
zero-weight dummy batch so it joins every all-reduce. Gradients are unscaled (fp16), their
norm taken (and clipped when ``clip_norm > 0``); a step with a non-finite loss or norm is
skipped, and ``max_bad_steps`` in a row stop training with a RuntimeError.

Checkpoints (rank 0 writes; parts in :mod:`transformer_nmt.checkpoint`) restore a run
bit-for-bit on the same world size; an unreadable newest checkpoint is skipped for the one
before it. SIGTERM / SIGUSR1 / SIGINT (Ctrl-C) stop the run at the next step boundary with a
checkpoint; a run resumed after it finished does nothing. The prepared data is read, never
made (``nmt-prepare``).
See docs/training.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
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
from transformer_nmt.bpe import SentencePieceTokenizer, vocab_identity
from transformer_nmt.config import PAD_ID
from transformer_nmt.errors import MissingFileError
from transformer_nmt.fileio import atomic_write, bin_prefix, spm_model_path
from transformer_nmt.flops import FORMULA as FLOPS_FORMULA
from transformer_nmt.flops import TokenCounts, training_flops
from transformer_nmt.loss import label_smoothed_nll_loss
from transformer_nmt.metrics import MetricsLog, Window, log_train_line
from transformer_nmt.model import Transformer
from transformer_nmt.optim import build_optimizer, build_scheduler
from transformer_nmt.runtime import (
    StopFlag,
    autocast_context,
    device_name,
    grad_scaler,
    resolve_precision,
    seed_everything,
)
from transformer_nmt.validation import run_validation, valid_references

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------- data


class MissingDataError(MissingFileError):
    """The prepared data training reads (SentencePiece model, binarized splits) is missing."""


def required_files(cfg: Any) -> list[Path]:
    """The prepared files training reads: the SentencePiece model and the binarized
    ``.bin`` / ``.idx`` of the train and valid splits, both languages."""
    d = cfg.data
    needed = [spm_model_path(d)]
    for split in (d.train_split, d.valid_split):
        for lang in (d.src_lang, d.tgt_lang):
            prefix = bin_prefix(d, split, lang)
            needed += [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
    return needed


def data_ready(cfg: Any) -> bool:
    """True when every file of :func:`required_files` exists."""
    return all(p.is_file() for p in required_files(cfg))


def check_data(cfg: Any) -> None:
    """Raise :class:`MissingDataError` (one line: the first missing file and the command that
    makes it) unless the prepared data exists."""
    missing = [p for p in required_files(cfg) if not p.is_file()]
    if missing:
        exp = cfg.get("name") if hasattr(cfg, "get") else getattr(cfg, "name", None)
        raise MissingDataError(
            f"prepared data not found: {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; run "
            f"`nmt-prepare experiment={exp or '<experiment>'}` with the same data overrides "
            f"(or `make data EXP={exp or '<experiment>'}`) first"
        )


def load_split(cfg: Any, split: str) -> ParallelDataset:
    """The binarized ``split`` as a :class:`ParallelDataset` (source and target)."""
    d = cfg.data
    src = TokenDataset(bin_prefix(d, split, d.src_lang))
    tgt = TokenDataset(bin_prefix(d, split, d.tgt_lang))
    return ParallelDataset(src, tgt)


# ---------------------------------------------------------------------------------- state


@dataclass
class TrainState:
    """The training loop's counters: what a checkpoint's ``train_state`` and ``sampler`` hold.

    Token counts are non-pad tokens (eos included) over all ranks, skipped steps included.
    """

    step: int = 0  # successful optimizer updates (the learning-rate schedule follows it)
    micro_step: int = 0  # micro-batches consumed per rank
    tokens_seen: int = 0  # target tokens processed
    src_tokens_seen: int = 0  # source tokens processed
    src_sq_seen: int = 0  # sum over sentences of source length^2 (attention FLOPs)
    tgt_sq_seen: int = 0  # sum over sentences of target length^2
    src_tgt_seen: int = 0  # sum over sentences of source length x target length
    epoch: int = 0  # completed passes over the training set
    position: int = 0  # batches per rank consumed in the current epoch
    train_seconds: float = 0.0  # wall-clock seconds in the loop, all resumed segments
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm
    overflow_steps: int = 0  # of which fp16 loss-scaler overflows (finite loss, inf gradient)
    bad_steps_in_row: int = 0  # consecutive skipped steps (stop at trainer.max_bad_steps)
    best_valid_loss: float | None = None
    best_valid_bleu: float | None = None
    validations_without_improvement: int = 0
    world_size: int = 1  # ranks of the run that wrote the state

    DATA_POSITION = ("epoch", "position")

    def state_dict(self) -> dict[str, Any]:
        """Every field except the data position (``epoch``, ``position``: the sampler part)."""
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if k not in self.DATA_POSITION}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s fields; absent ones keep their value.

        Raises:
            ValueError: naming keys that are not fields.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"train_state has unknown keys {unknown}")
        for k, v in d.items():
            setattr(self, k, v)

    def sampler_state(self, seed: int) -> dict[str, int]:
        """The data position as ``LengthBucketSampler.state_dict()`` writes it."""
        return {"epoch": self.epoch, "position": self.position, "seed": seed}

    def token_counts(self) -> TokenCounts:
        """The processed tokens in the form :func:`transformer_nmt.flops.training_flops` reads."""
        return TokenCounts(self.src_tokens_seen, self.tokens_seen, self.src_sq_seen,
                           self.tgt_sq_seen, self.src_tgt_seen)


# ---------------------------------------------------------------------------------- setup


@dataclass
class Setup:
    """Everything :func:`setup` builds for a run."""

    device: torch.device
    precision: str
    model: Transformer
    """The plain model (what checkpoints hold)."""
    train_model: torch.nn.Module
    """The model the loop calls: ``model``, compiled and / or wrapped in DDP."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    sampler: LengthBucketSampler
    train_loader: DataLoader
    valid_set: ParallelDataset
    valid_loader: DataLoader
    tokenizer: SentencePieceTokenizer
    vocab_size: int
    vocab: dict[str, Any]
    """The vocabulary's identity (:func:`transformer_nmt.bpe.vocab_identity`), saved in checkpoints."""
    steps_per_epoch: int
    params: list[torch.nn.Parameter] = field(default_factory=list)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the run's precision."""
        return autocast_context(self.precision, self.device)


def setup(cfg: Any, info: distributed.DistInfo, model_vocab_size: int | None = None) -> Setup:
    """Data loaders, model, optimizer, schedule and grad scaler of ``cfg`` on this rank.

    Args:
        model_vocab_size: build the model with at least this vocabulary (a dry run on a
            smaller SentencePiece model keeps the experiment's size).

    Raises:
        MissingDataError: the prepared data is missing.
        ValueError: bad precision for the device, empty training set.
    """
    t_cfg = cfg.trainer
    device = info.device
    if device.type == "cuda" and t_cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = resolve_precision(t_cfg.precision, device)
    check_data(cfg)
    tokenizer = SentencePieceTokenizer(spm_model_path(cfg.data))
    vocab_size = max(tokenizer.vocab_size, model_vocab_size or 0)
    train_set = load_split(cfg, cfg.data.train_split)
    valid_set = load_split(cfg, cfg.data.valid_split)
    seed = int(t_cfg.seed)
    sampler = LengthBucketSampler(
        train_set.src_sizes, train_set.tgt_sizes, int(t_cfg.max_tokens), shuffle=True,
        seed=seed, rank=info.rank, world_size=info.world_size,
        skip_too_long=t_cfg.too_long == "skip",
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
    steps_per_epoch = math.ceil(len(sampler) / int(t_cfg.update_freq))
    src_step, tgt_step = real_tokens_per_step(sampler, int(t_cfg.update_freq), info.world_size)
    log.info(
        "a step holds %s real source and %s real target tokens on average (max_tokens %d "
        "padded x %d micro-batches x %d ranks, over every batch of an epoch)",
        f"{src_step:,.0f}", f"{tgt_step:,.0f}", int(t_cfg.max_tokens), int(t_cfg.update_freq),
        info.world_size,
    )
    log.info(
        "data %s: %d train pairs in %d batches/rank/epoch (%d steps/epoch), %d valid pairs, "
        "vocab %d, padding efficiency %.3f",
        cfg.data.name, len(train_set), len(sampler), steps_per_epoch, len(valid_set),
        tokenizer.vocab_size, sampler.padding_efficiency,
    )

    seed_everything(seed)
    model = Transformer(cfg.model, vocab_size=vocab_size)
    if t_cfg.init_from and ckpt_lib.latest_checkpoint(cfg.run_dir) is None:
        from transformer_nmt.export import load_initial_weights

        load_initial_weights(model, t_cfg.init_from)
        log.info("weights from %s (trainer.init_from)", t_cfg.init_from)
    model = model.to(device)
    log.info("model %s: %s parameters", cfg.model.name, f"{model.num_parameters():,}")
    optimizer = build_optimizer(model, t_cfg)
    scheduler = build_scheduler(optimizer, int(cfg.model.d_model), t_cfg)
    scaler = grad_scaler(precision == "fp16")
    train_model = wrap_model(model, info, compile=bool(t_cfg.compile))
    seed_everything(seed + info.rank)
    return Setup(
        device=device, precision=precision, model=model, train_model=train_model,
        optimizer=optimizer, scheduler=scheduler, scaler=scaler, sampler=sampler,
        train_loader=train_loader, valid_set=valid_set, valid_loader=valid_loader,
        tokenizer=tokenizer, vocab_size=vocab_size, vocab=vocab_identity(tokenizer.model_path),
        steps_per_epoch=steps_per_epoch,
        params=[p for p in model.parameters() if p.requires_grad],
    )


def real_tokens_per_step(sampler: LengthBucketSampler, update_freq: int,
                         world_size: int) -> tuple[float, float]:
    """Mean real (non-pad, eos included) ``(source, target)`` tokens per optimizer step:
    the sampler's mean per batch x ``update_freq`` x ``world_size``."""
    src, tgt = sampler.real_tokens_per_batch
    return src * update_freq * world_size, tgt * update_freq * world_size


def wrap_model(model: torch.nn.Module, info: distributed.DistInfo, *, compile: bool) -> torch.nn.Module:
    """The module the training loop calls: ``model`` wrapped in DDP (several ranks), then
    compiled (``compile``).

    DDP comes first so that the compiled graph is split at DDP's gradient buckets
    (``torch._dynamo.config.optimize_ddp``) and the all-reduce of each bucket overlaps the
    rest of the backward; compiling first and wrapping after leaves DDP one opaque backward
    to wait for. ``broadcast_buffers=False``: the model's only buffers are the sinusoidal
    position tables, deterministic on every rank (and of a size that depends on the longest
    sentence a rank has seen), so broadcasting them each forward is wasted at best and, with
    tables of different sizes, a collective of mismatched shapes at worst.
    """
    wrapped = model
    if info.distributed:
        import inspect

        from torch.nn.parallel import DistributedDataParallel as DDP

        # torch >= 2.13 names the per-forward buffer broadcast ``forward_sync_buffers``
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                          else {"broadcast_buffers": False})
        wrapped = DDP(
            model,
            device_ids=[info.local_rank] if model_device(model).type == "cuda" else None,
            gradient_as_bucket_view=True,
            **no_buffer_sync,
        )
    return torch.compile(wrapped) if compile else wrapped


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


# ----------------------------------------------------------------------------- the step


def _dummy_batch() -> Batch:
    """A one-sentence batch with an empty source and target (1 source, 1 target token)."""
    empty = np.zeros(0, dtype=np.int64)
    batch = collate([(0, empty, empty)])
    assert batch is not None
    return batch


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

    After DDP's averaging over ranks the gradient is that of
    ``sum(token losses over all micro-batches and ranks) / ntokens_global``.

    Args:
        model: the training model (plain, compiled, or DDP, whose ``no_sync`` is used).
        micro_batches: this rank's batches of the step; None = no data on this rank for
            that micro-step (a zero-weight dummy batch joins DDP's all-reduce).
        epsilon: label smoothing.
        world_size: data-parallel ranks (the loss factor that cancels DDP's mean).
        autocast: a callable returning the autocast context.
        scaler: an fp16 GradScaler (or None / a disabled one).

    Returns:
        ``counts``: (5,) float64 on ``device``, global sums over all ranks in the order of
        :data:`COUNT_NAMES`: non-pad target tokens, source tokens (incl. eos), and the
        sums over sentences of source length², target length², source × target length;
        this rank's ``loss_sum``, ``nll_sum`` (float32 0-dim on ``device``, detached) and
        ``nsentences`` (int). Nothing is read back to the host: the step makes no device
        synchronisation (the caller reads everything once, see :func:`train`).
    """
    real = [b for b in micro_batches if b is not None]
    # Host-side counts (the batches are still on the CPU): no device synchronisation.
    if real:
        src_lens = torch.cat([b.src_lengths for b in real]).to(torch.float64)  # (sum B,)
        tgt_lens = torch.cat([b.tgt_out.ne(PAD_ID).sum(1) for b in real]).to(torch.float64)
        counts = torch.stack([tgt_lens.sum(), src_lens.sum(), (src_lens * src_lens).sum(),
                              (tgt_lens * tgt_lens).sum(), (src_lens * tgt_lens).sum()])
    else:
        counts = torch.zeros(5, dtype=torch.float64)
    counts = counts.to(device)
    distributed.all_reduce_sum(counts)  # once per step: the global normaliser
    # The factor stays on the device: reading ntokens_global here would stall every step.
    factor = (world_size / counts[0].clamp(min=1.0)).to(torch.float32)  # 0-dim
    pin = device.type == "cuda"
    loss_total = torch.zeros((), dtype=torch.float32, device=device)
    nll_total = torch.zeros((), dtype=torch.float32, device=device)
    no_sync = getattr(model, "no_sync", None)
    for i, batch in enumerate(micro_batches):
        dummy = batch is None
        if dummy:
            batch = _dummy_batch()
        # real target positions as flat indices, found on the host (a bool mask on the
        # device would be read back to size the selection)
        keep = batch.tgt_out.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)  # (N,)
        target = batch.tgt_out.reshape(-1).index_select(0, keep)  # (N,)
        if pin:
            keep, target = keep.pin_memory(), target.pin_memory()
        keep = keep.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        batch = batch.to(device)
        last = i == len(micro_batches) - 1
        sync_ctx = contextlib.nullcontext() if (last or no_sync is None) else no_sync()
        with sync_ctx:
            with autocast():
                logits = model(batch.src_tokens, batch.tgt_in, keep)  # (N, V), N real
            loss, nll = label_smoothed_nll_loss(logits, target, epsilon, ignore_index=None)
            scaled = loss * (0.0 if dummy else factor)
            if scaler is not None:
                scaled = scaler.scale(scaled)
            scaled.backward()
        if not dummy:
            loss_total += loss.detach()
            nll_total += nll.detach()
    return {
        "counts": counts,
        "loss_sum": loss_total,
        "nll_sum": nll_total,
        "nsentences": sum(b.nsentences for b in real),
    }


COUNT_NAMES = ("ntokens", "src_tokens", "src_sq", "tgt_sq", "src_tgt")
"""The global sums in ``forward_backward(...)["counts"]``, in order."""


def grad_norm_(params: list[torch.nn.Parameter], clip_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (clipped to ``clip_norm`` when > 0), a float32 0-dim
    tensor on the parameters' device (not read back: no synchronisation); inf/nan if any is."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        device = params[0].device if params else torch.device("cpu")
        return torch.zeros((), dtype=torch.float32, device=device)
    max_norm = clip_norm if clip_norm > 0 else float("inf")
    return torch.nn.utils.clip_grad_norm_(with_grad, max_norm).float()


# ---------------------------------------------------------------------------- bookkeeping


def _epoch_progress(state: TrainState, sampler: LengthBucketSampler, world_size: int) -> float:
    """Epochs done as a fraction (global batches consumed / batches per epoch)."""
    done = min(state.position * world_size, sampler.num_batches)
    return state.epoch + done / sampler.num_batches


def _reached_limit(t_cfg: Any, state: TrainState) -> str | None:
    if t_cfg.max_steps is not None and state.step >= int(t_cfg.max_steps):
        return "max_steps"
    if t_cfg.max_epochs is not None and state.epoch >= int(t_cfg.max_epochs):
        return "max_epochs"
    return None


def finished_by(t_cfg: Any, state: TrainState) -> str | None:
    """Why a resumed run has nothing left to do, or None: ``max_steps`` / ``max_epochs``
    reached, the ``max_time_minutes`` budget spent (``train_seconds`` over all segments), or
    ``patience`` validations without improvement. With a raised limit the run goes on."""
    reached = _reached_limit(t_cfg, state)
    if reached is not None:
        return reached
    if t_cfg.max_time_minutes and state.train_seconds >= float(t_cfg.max_time_minutes) * 60:
        return "max_time"
    if t_cfg.patience is not None and state.validations_without_improvement >= int(t_cfg.patience):
        return "patience"
    return None


def _bad_steps_error(state: TrainState, t_cfg: Any, loss: float, gnorm: float, lr: float,
                     run_dir: Path) -> RuntimeError:
    return RuntimeError(
        f"training stopped at step {state.step}: {state.bad_steps_in_row} "
        f"consecutive steps had a non-finite loss or gradient "
        f"(trainer.max_bad_steps={t_cfg.max_bad_steps}; last loss={loss}, "
        f"gradient norm={gnorm}, lr={lr:.3g}). Lower the learning rate "
        "(trainer.lr_multiplier), set trainer.clip_norm, or use bf16/fp32; "
        f"the last good checkpoint is {ckpt_lib.latest_checkpoint(run_dir)}"
    )


MIN_LOSS_SCALE = 1e-4
"""fp16: training stops when gradient overflows push the dynamic loss scale below this
(fairseq's ``--min-loss-scale`` default)."""


def loss_overflow(scaler: Any, loss_sum: float, grad_norm: float) -> bool:
    """True for an fp16 loss-scaler overflow: the loss is finite, the (scaled) gradient is not.

    Such a step is skipped and the scale lowered; it is normal while the scale calibrates,
    so it does not count towards ``trainer.max_bad_steps`` (a non-finite loss does).
    """
    enabled = getattr(scaler, "is_enabled", lambda: False)()
    return bool(enabled) and math.isfinite(loss_sum) and not math.isfinite(grad_norm)


def _loss_scale_error(state: TrainState, scale: float, run_dir: Path) -> RuntimeError:
    return RuntimeError(
        f"training stopped at step {state.step}: fp16 gradient overflows lowered the loss "
        f"scale to {scale:g} (< {MIN_LOSS_SCALE:g}; {state.overflow_steps} overflow steps). "
        "Lower the learning rate (trainer.lr_multiplier), set trainer.clip_norm, or use "
        f"bf16/fp32; the last good checkpoint is {ckpt_lib.latest_checkpoint(run_dir)}"
    )


# ----------------------------------------------------------------------------------- train


def train(cfg: Any, *, model_vocab_size: int | None = None,
          valid_max_batches: int | None = None) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data`` with ``cfg.trainer``; resume when the run has checkpoints.

    A resumed run that has already finished (:func:`finished_by`) takes no step, validates
    and saves nothing, and rewrites ``train_summary.json`` with ``"already_finished": true``.

    Args:
        cfg: the composed, validated config (``config.validate`` already called); the
            prepared data must exist (``nmt-prepare``).
        model_vocab_size: build the model with at least this vocabulary (dry runs).
        valid_max_batches: validate on at most this many batches per rank (dry runs).

    Returns:
        The run summary, also written to ``<run_dir>/train_summary.json`` (rank 0): steps,
        tokens_seen, train_seconds, world_size, device, gpu_hours, flops, stopped_by, ...

    Raises:
        MissingDataError: the prepared data is missing (one line naming the file).
        RuntimeError: ``max_bad_steps`` consecutive non-finite steps.
        ValueError: ``trainer.dry_run`` set (dry runs go through
            :func:`transformer_nmt.dryrun.dry_run`), bad precision for the device, empty
            training set, or a checkpoint of another layout in the run directory.
        UserError: the run directory holds another model, or none of its checkpoints can be
            read (:func:`transformer_nmt.checkpoint.resume_training`).
    """
    if cfg.trainer.dry_run:
        raise ValueError("trainer.dry_run=true: run it with nmt-train or "
                         "transformer_nmt.dryrun.dry_run(cfg), not train(cfg)")
    info = distributed.init_distributed()
    try:
        return _train(cfg, info, model_vocab_size, valid_max_batches)
    finally:
        distributed.cleanup()


def _train(cfg: Any, info: distributed.DistInfo, model_vocab_size: int | None,
           valid_max_batches: int | None) -> dict[str, Any]:
    t_cfg = cfg.trainer
    run_dir = Path(cfg.run_dir)
    if not info.is_main:
        log.setLevel(logging.WARNING)
    s = setup(cfg, info, model_vocab_size)
    seed, update_freq, epsilon = int(t_cfg.seed), int(t_cfg.update_freq), float(t_cfg.label_smoothing)
    state = TrainState(world_size=info.world_size)
    resumed_from = ckpt_lib.resume_training(run_dir, s, state, seed, info, config=cfg)
    done = finished_by(t_cfg, state) if resumed_from is not None else None
    if done is not None:  # a requeued or repeated finished run: no step, validation or save
        log.info("the run in %s has already finished (%s reached at step %d): nothing to do; "
                 "raise that limit to train on", run_dir, done, state.step)
        return _finish(cfg, s, state, info, done, {}, resumed_from, already_finished=True)

    metrics = MetricsLog(run_dir, info.is_main)
    bleu_refs: list[str] = []
    if t_cfg.valid_bleu and info.is_main:
        bleu_refs = valid_references(cfg, s.valid_set, s.tokenizer, int(t_cfg.valid_bleu_sentences))
    last_valid: dict[str, float] = {}
    stop_flag = StopFlag()
    stop_flag.install()
    total_steps = (int(t_cfg.max_steps) if t_cfg.max_steps is not None
                   else int(t_cfg.max_epochs) * s.steps_per_epoch if t_cfg.max_epochs is not None
                   else None)
    show_bar = info.is_main and sys.stderr.isatty()
    from tqdm import tqdm

    bar = tqdm(total=total_steps, initial=state.step, disable=not show_bar, unit="step",
               dynamic_ncols=True)
    log_every = max(int(t_cfg.log_every_steps), 1)
    save_every_s = float(t_cfg.save_every_minutes) * 60 if t_cfg.save_every_minutes else None
    max_time_s = float(t_cfg.max_time_minutes) * 60 if t_cfg.max_time_minutes else None
    last_saved_step = last_valid_step = state.step if resumed_from is not None else -1
    last_save_time = time.monotonic()
    window = Window()
    loop_start = time.perf_counter()
    seconds_before = float(state.train_seconds)
    loader_iter = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    log.info("training on %s x %d (%s), update_freq %d, max_tokens %d: step %d of %s",
             device_name(s.device), info.world_size, s.precision, update_freq,
             int(t_cfg.max_tokens), state.step, total_steps)

    stopped_by = _reached_limit(t_cfg, state)
    try:
        while stopped_by is None:
            # -- draw this step's micro-batches (the same count on every rank) --------------
            if loader_iter is None:
                s.sampler.set_epoch(state.epoch)
                s.sampler.load_state_dict(state.sampler_state(seed))
                loader_iter = iter(s.train_loader)
            k = min(update_freq, len(s.sampler) - state.position)
            micro_batches = [next(loader_iter) for _ in range(k)]
            state.position += k
            state.micro_step += k
            if state.position >= len(s.sampler):
                state.epoch, state.position, loader_iter = state.epoch + 1, 0, None

            # -- forward / backward over the micro-batches, then the update ----------------
            t0 = time.perf_counter()
            out = forward_backward(s.train_model, micro_batches, epsilon=epsilon, device=s.device,
                                   world_size=info.world_size, autocast=s.autocast, scaler=s.scaler)
            loss_sum, lr, stepped = _update(s, state, window, out, t_cfg, run_dir)
            if stepped:
                bar.update(1)
            window.steps += 1
            step_seconds = time.perf_counter() - t0
            state.train_seconds = seconds_before + time.perf_counter() - loop_start
            bar.set_postfix(loss=f"{loss_sum / max(out['ntokens'], 1):.3f}", lr=f"{lr:.2e}",
                            tok_s=f"{out['ntokens'] / max(step_seconds, 1e-9):,.0f}",
                            refresh=False)
            if state.step % log_every == 0 and window.steps and state.bad_steps_in_row == 0:
                record = window.record(
                    lr=lr, skipped_steps=state.skipped_steps, tokens_seen=state.tokens_seen,
                    epoch=_epoch_progress(state, s.sampler, info.world_size), device=s.device)
                metrics.write("train", state.step, record)
                if not show_bar:
                    log_train_line(state.step, total_steps, record)
                window = Window(grad_norm=window.grad_norm)

            # -- decisions every rank must agree on (time is read on rank 0) --------------------
            flags = [stop_flag.requested,
                     int(info.is_main and save_every_s is not None
                         and time.monotonic() - last_save_time >= save_every_s),
                     int(info.is_main and max_time_s is not None
                         and state.train_seconds >= max_time_s)]
            if info.distributed:  # one process decides alone: no device round trip
                flags = distributed.all_reduce_max(
                    torch.tensor(flags, dtype=torch.int64, device=s.device)).tolist()
            signal_num, save_for_time, out_of_time = flags
            stopped_by = _reached_limit(t_cfg, state)
            if stopped_by is None and out_of_time:
                stopped_by = "max_time"
            if stopped_by is None and signal_num:
                stopped_by = f"signal {signal.Signals(signal_num).name}"

            # -- validation, checkpoints ------------------------------------------------------------
            stepped = state.bad_steps_in_row == 0
            best = False
            vfreq = t_cfg.validate_every_steps
            if stepped and state.step != last_valid_step and (
                (vfreq and state.step % int(vfreq) == 0)
                or stopped_by in ("max_steps", "max_epochs", "max_time")
            ):
                last_valid, best = run_validation(
                    cfg, s.model, s.valid_loader, s.valid_set, s.tokenizer, state,
                    device=s.device, autocast=s.autocast, is_main=info.is_main,
                    references=bleu_refs, max_batches=valid_max_batches)
                metrics.write("valid", state.step, last_valid)
                last_valid_step = state.step
                if (t_cfg.patience is not None and stopped_by is None
                        and state.validations_without_improvement >= int(t_cfg.patience)):
                    stopped_by = "patience"
            sfreq = t_cfg.save_every_steps
            regular = state.step != last_saved_step and (
                (stepped and sfreq and state.step % int(sfreq) == 0)
                or save_for_time or stopped_by is not None
            )
            if regular or best:
                ckpt_lib.save_training(run_dir, s, state, info, config=cfg, seed=seed,
                                       keep_last=int(t_cfg.keep_last), best=best, regular=regular)
                if regular:
                    last_saved_step, last_save_time = state.step, time.monotonic()
    finally:
        bar.close()
        stop_flag.restore()
        metrics.close()

    state.train_seconds = seconds_before + time.perf_counter() - loop_start
    return _finish(cfg, s, state, info, stopped_by, last_valid, resumed_from)


def _update(s: Setup, state: TrainState, window: Window, out: dict[str, Any], t_cfg: Any,
            run_dir: Path) -> tuple[float, float, bool]:
    """After one step's backward: unscale and clip, read the step's figures (its one host
    synchronisation: counts, losses and gradient norm together), then apply the optimizer
    update, or skip the step (an fp16 overflow while the loss scale calibrates, or a
    non-finite loss or gradient, counted towards ``max_bad_steps``).

    Returns:
        ``(loss_sum, lr, stepped)``: the step's summed label-smoothed loss over all ranks,
        the learning rate it used, and whether the parameters were updated.

    Raises:
        RuntimeError: ``max_bad_steps`` non-finite steps in a row, or the fp16 loss scale
            below :data:`MIN_LOSS_SCALE`.
    """
    s.scaler.unscale_(s.optimizer)
    grad_norm_t = grad_norm_(s.params, float(t_cfg.clip_norm))
    losses = distributed.all_reduce_sum(torch.stack([out["loss_sum"], out["nll_sum"]]))
    # The step's one host-device synchronisation: counts, losses and norm together.
    read = torch.cat([out["counts"], losses.to(torch.float64),
                      grad_norm_t.to(torch.float64).reshape(1)]).tolist()
    counts = dict(zip(COUNT_NAMES, (int(x) for x in read[:5])))
    loss_sum, nll_sum, grad_norm = read[5], read[6], read[7]
    lr = s.scheduler.get_last_lr()[0]
    state.tokens_seen += counts["ntokens"]
    state.src_tokens_seen += counts["src_tokens"]
    state.src_sq_seen += counts["src_sq"]
    state.tgt_sq_seen += counts["tgt_sq"]
    state.src_tgt_seen += counts["src_tgt"]
    out["ntokens"] = counts["ntokens"]
    if math.isfinite(loss_sum) and math.isfinite(grad_norm):
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.scheduler.step()
        s.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.bad_steps_in_row = 0
        window.loss += loss_sum
        window.nll += nll_sum
        window.ntokens += out["ntokens"]
        window.grad_norm = grad_norm
        return loss_sum, lr, True
    if loss_overflow(s.scaler, loss_sum, grad_norm):
        # fp16: the dynamic loss scaler calibrating (scale halved by update()); not a
        # bad step unless the scale collapses
        s.optimizer.zero_grad(set_to_none=True)
        s.scaler.update()
        state.skipped_steps += 1
        state.overflow_steps += 1
        scale = float(s.scaler.get_scale())
        log.info("step %d skipped: fp16 gradient overflow, loss scale lowered to %g",
                 state.step + 1, scale)
        if scale < MIN_LOSS_SCALE:
            raise _loss_scale_error(state, scale, run_dir)
        return loss_sum, lr, False
    s.optimizer.zero_grad(set_to_none=True)
    s.scaler.update()
    state.skipped_steps += 1
    state.bad_steps_in_row += 1
    log.warning("step %d skipped: loss %s, gradient norm %s (%d in a row, %d in total)",
                state.step + 1, loss_sum, grad_norm, state.bad_steps_in_row, state.skipped_steps)
    if state.bad_steps_in_row >= int(t_cfg.max_bad_steps):
        raise _bad_steps_error(state, t_cfg, loss_sum, grad_norm, lr, run_dir)
    return loss_sum, lr, False


def _previous_summary(run_dir: Path) -> dict[str, Any]:
    """``<run_dir>/train_summary.json`` as written before, or {} when absent or unreadable."""
    try:
        return json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _real_tokens_per_step(state: TrainState) -> dict[str, float]:
    """Mean real (non-pad, eos included) source and target tokens per optimizer step of this
    run, over all ranks, skipped steps included."""
    steps = max(state.step + state.skipped_steps, 1)
    return {"src": state.src_tokens_seen / steps, "tgt": state.tokens_seen / steps}


def _finish(cfg: Any, s: Setup, state: TrainState, info: distributed.DistInfo,
            stopped_by: str | None, last_valid: dict[str, float],
            resumed_from: Path | None, already_finished: bool = False) -> dict[str, Any]:
    """The run summary; rank 0 writes it to ``<run_dir>/train_summary.json``.

    ``already_finished``: the run was resumed after it had finished and did nothing
    (``"already_finished": true``); the previous summary's validation results and time are
    kept.
    """
    run_dir = Path(cfg.run_dir)
    on_gpu = s.device.type == "cuda"
    hours = state.train_seconds / 3600 * info.world_size
    counts = state.token_counts()
    flops = training_flops(cfg.model, s.vocab_size, counts)
    summary = {
        "name": cfg.name,
        "stopped_by": stopped_by,
        "steps": state.step,
        "micro_steps": state.micro_step,
        "epochs": _epoch_progress(state, s.sampler, info.world_size),
        "tokens_seen": state.tokens_seen,
        "src_tokens_seen": state.src_tokens_seen,
        "token_counts": dataclasses.asdict(counts),
        "skipped_steps": state.skipped_steps,
        "train_seconds": state.train_seconds,
        "world_size": info.world_size,
        "device": device_name(s.device),
        "precision": s.precision,
        "gpu_hours": hours if on_gpu else 0.0,
        "cpu_hours": 0.0 if on_gpu else hours,
        "flops": flops,
        "flops_formula": FLOPS_FORMULA,
        "parameters": s.model.num_parameters(),
        "vocab_size": s.vocab_size,
        "max_tokens": int(cfg.trainer.max_tokens),
        "real_tokens_per_step": _real_tokens_per_step(state),
        "update_freq": int(cfg.trainer.update_freq),
        "valid": dict(last_valid),
        "best_valid_loss": state.best_valid_loss,
        "best_valid_bleu": state.best_valid_bleu,
        "last_checkpoint": str(ckpt_lib.latest_checkpoint(run_dir)) if info.is_main else None,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "already_finished": already_finished,
    }
    previous = _previous_summary(run_dir) if already_finished and info.is_main else {}
    if previous.get("steps") == state.step:  # the finished run's own figures, unchanged
        summary.update({k: previous[k] for k in ("valid", "train_seconds", "gpu_hours",
                                                   "cpu_hours") if k in previous})
    if info.is_main:
        with atomic_write(run_dir / "train_summary.json") as f:
            json.dump(summary, f, indent=2)
        per_step = summary["real_tokens_per_step"]
        log.info("finished (%s): %d steps, %s target tokens (%s source and %s target per "
                 "step), %.1f %s-hours, %.3g FLOPs", stopped_by, state.step,
                 f"{state.tokens_seen:,}", f"{per_step['src']:,.0f}", f"{per_step['tgt']:,.0f}",
                 hours, "GPU" if on_gpu else "CPU", flops)
    distributed.barrier()
    return summary
