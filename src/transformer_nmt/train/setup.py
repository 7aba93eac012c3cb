"""Everything a training run builds before its first step (:func:`setup`): data loaders,
model (DDP-wrapped and / or compiled for the loop, :func:`wrap_model`), optimizer, learning-rate
schedule and grad scaler, as one :class:`Setup`."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from transformer_nmt import checkpoint as ckpt_lib
from transformer_nmt.checkpoint import load_initial_weights, read_checkpoint
from transformer_nmt.config import Config, Positions, TrainerConfig, to_plain
from transformer_nmt.data.batching import LengthBucketSampler, ParallelDataset
from transformer_nmt.data.bpe import SentencePieceTokenizer, vocab_identity
from transformer_nmt.data.loader import build_dataloader
from transformer_nmt.data.packing import PackedSampler, PackLengthError, collate_packed
from transformer_nmt.data.prepare import training_data_identity
from transformer_nmt.errors import ConfigError, UserError
from transformer_nmt.fileio import spm_model_path
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runtime import (
    autocast_context,
    grad_scaler,
    resolve_precision,
    seed_everything,
)
from transformer_nmt.train import distributed
from transformer_nmt.train.batch_size import cuda_max_tokens, plan_batch
from transformer_nmt.train.data import check_data, load_split, log_data_report
from transformer_nmt.train.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)


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
    """The vocabulary's identity (:func:`transformer_nmt.data.bpe.vocab_identity`), saved in
    checkpoints."""
    steps_per_epoch: int
    params: list[torch.nn.Parameter] = field(default_factory=list)
    data: dict[str, Any] | None = None
    """The training data's identity (:func:`transformer_nmt.data.prepare.training_data_identity`),
    saved in checkpoints and compared on resume."""
    pad_to_multiple: int = 1
    """The batches' length multiple (``trainer.pad_to_multiple`` resolved for the device)."""
    packed_shape: tuple[int, int] | None = None
    """``(rows, pack_length)`` of every packed training micro-batch (``trainer.packing``);
    None for padded batches."""
    grads_in_buckets: bool = False
    """The gradients are views of DDP's buckets (``gradient_as_bucket_view``): they are
    zeroed in place, never set to None (which would detach them from the buckets)."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the run's precision."""
        return autocast_context(self.precision, self.device)


def setup(cfg: Config, info: distributed.DistInfo, model_vocab_size: int | None = None) -> Setup:
    """Data loaders, model, optimizer, schedule and grad scaler of ``cfg`` on this rank.

    Args:
        model_vocab_size: build the model with at least this vocabulary (a dry run on a
            smaller SentencePiece model keeps the experiment's size).

    Raises:
        MissingDataError: the prepared data is missing.
        UserError: bad precision for the device; a training pair longer than ``max_tokens``
            (``too_long=error``); no training or no validation pair within ``max_tokens``
            and ``model.max_positions`` (named with the counts).
    """
    t_cfg = cfg.trainer
    device = info.device
    check_bucket_cap_mb(float(t_cfg.bucket_cap_mb))
    if device.type == "cuda" and t_cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = resolve_precision(t_cfg.precision, device)
    check_data(cfg)
    tokenizer = SentencePieceTokenizer(spm_model_path(cfg.data))
    vocab_size = max(tokenizer.vocab_size, model_vocab_size or 0)
    train_set = load_split(cfg, cfg.data.train_split)
    valid_set = load_split(cfg, cfg.data.valid_split)
    seed = t_cfg.seed
    max_positions = cfg.model.max_positions
    pad_to_multiple = resolve_pad_to_multiple(t_cfg.pad_to_multiple, device)

    pack_length = (resolve_pack_length(cfg, train_set) if t_cfg.packing else None)

    def make_sampler(max_tokens: int) -> LengthBucketSampler:
        try:
            if pack_length is not None:
                return PackedSampler(
                    train_set.src_sizes, train_set.tgt_sizes, max_tokens,
                    pack_length=pack_length, shuffle=True, seed=seed, rank=info.rank,
                    world_size=info.world_size, skip_too_long=t_cfg.too_long == "skip",
                    max_positions=max_positions)
            return LengthBucketSampler(
                train_set.src_sizes, train_set.tgt_sizes, max_tokens, shuffle=True,
                seed=seed, rank=info.rank, world_size=info.world_size,
                skip_too_long=t_cfg.too_long == "skip", max_positions=max_positions,
                pad_to_multiple=pad_to_multiple,
            )
        except PackLengthError as e:
            raise ConfigError(
                f"trainer.pack_length={pack_length} is shorter than the longest training pair "
                f"of {cfg.data.name} ({e.longest} pieces with eos; pair {e.index} is the first "
                f"too long): set trainer.pack_length={e.longest} or more, or null") from e
        except ValueError as e:  # a pair alone longer than max_tokens, too_long=error
            raise UserError(f"training split {cfg.data.train_split!r} of {cfg.data.name}: {e} "
                            "(trainer.too_long=skip leaves such pairs out)") from e

    asked_update_freq = int(t_cfg.update_freq)
    plan = plan_batch(t_cfg, cfg.model, make_sampler, info.world_size,
                      **_device_cap(cfg, info, train_set))
    if t_cfg.tokens_per_step is not None and asked_update_freq not in (1, plan.update_freq):
        log.warning("trainer.update_freq=%d is not used: trainer.tokens_per_step=%d derives it "
                    "(%d here); set trainer.tokens_per_step=null to train with update_freq as "
                    "given", asked_update_freq, int(t_cfg.tokens_per_step), plan.update_freq)
    # The loop, the summary and the checkpoints read the chosen values from the config.
    t_cfg.max_tokens, t_cfg.update_freq, sampler = plan.max_tokens, plan.update_freq, plan.sampler
    if t_cfg.tokens_per_step is not None:
        log.info("trainer.tokens_per_step=%d: update_freq %d x %d rank(s) x max_tokens %d "
                 "(%s real source and %s real target tokens per step on average)",
                 t_cfg.tokens_per_step, plan.update_freq, info.world_size,
                 plan.max_tokens, f"{plan.src_per_step:,.0f}", f"{plan.tgt_per_step:,.0f}")
    if len(sampler) == 0:
        raise UserError(
            f"training split {cfg.data.train_split!r} of {cfg.data.name} has no pair to train "
            f"on: {_left_out(sampler, len(train_set), cfg)}")
    valid_sampler = LengthBucketSampler(
        valid_set.src_sizes, valid_set.tgt_sizes, t_cfg.max_tokens, shuffle=False,
        rank=info.rank, world_size=info.world_size, skip_too_long=True,
        max_positions=max_positions,
    )
    if valid_sampler.num_batches == 0:
        raise UserError(
            f"validation split {cfg.data.valid_split!r} of {cfg.data.name} has no pair to "
            f"validate on: {_left_out(valid_sampler, len(valid_set), cfg)}")
    pin = device.type == "cuda"
    # Private generators: creating a loader iterator must not draw from the global torch RNG.
    packed_shape = sampler.shape if isinstance(sampler, PackedSampler) else None
    train_loader = build_dataloader(
        train_set, sampler, loader_workers(t_cfg.num_workers), pin,
        generator=torch.Generator().manual_seed(seed),
        pad_to_multiple=pad_to_multiple, max_length=_max_length(cfg),
        prefetch_factor=t_cfg.prefetch_factor,
        collate_fn=(None if packed_shape is None else
                    functools.partial(collate_packed, rows=packed_shape[0],
                                      length=packed_shape[1])))
    valid_loader = build_dataloader(valid_set, valid_sampler, 0, pin,
                                    generator=torch.Generator().manual_seed(seed))
    steps_per_epoch = math.ceil(len(sampler) / t_cfg.update_freq)
    log_data_report(cfg, sampler, train_set, valid_set, tokenizer.vocab_size, steps_per_epoch,
                    info.world_size)
    seed_everything(seed)
    model = Transformer(cfg.model, vocab_size=vocab_size)
    if t_cfg.init_from and ckpt_lib.latest_checkpoint(cfg.run_dir) is None:
        load_initial_weights(model, t_cfg.init_from, vocab_identity(tokenizer.model_path))
        check_init_architecture(cfg, t_cfg.init_from)
        log.info("weights from %s (trainer.init_from)", t_cfg.init_from)
    model = model.to(device)
    log.info("model %s: %s parameters", cfg.model.name, f"{model.num_parameters():,}")
    model.set_sdpa_backends(list(t_cfg.sdpa_backends))
    kernels = model.sdpa_kernels(device, _activation_dtype(precision))
    log.info("attention kernels (trainer.sdpa_backends=%s): masked encoder and cross "
             "attention %s, causal decoder self-attention %s", ",".join(t_cfg.sdpa_backends),
             kernels["masked"], kernels["causal"])
    check_whole_step(t_cfg, precision)
    # the whole step (trainer.cuda_graphs) is compiled as one function, not the model alone
    compiled = compile_enabled(t_cfg.compile, device) and not t_cfg.cuda_graphs
    if packed_shape is not None:
        model.set_packed_attention(packed_attention_kind(cfg, device, compiled))
        log.info("packed batches: %d rows x %d positions (trainer.pack_length), %.3f of the "
                 "positions real; attention by segment: %s", *packed_shape,
                 sampler.padding_efficiency, model.packed_attention)
    optimizer = build_optimizer(model, t_cfg)
    scheduler = build_scheduler(optimizer, cfg.model.d_model, t_cfg)
    scaler = grad_scaler(precision == "fp16")
    # the whole step sums the gradients over the ranks itself: no DDP (nor its buckets)
    ddp = info.distributed and not t_cfg.cuda_graphs
    train_model = model if t_cfg.cuda_graphs else wrap_model(
        model, info, compile=compiled,
        grad_compression=resolve_grad_compression(str(t_cfg.grad_compression), device),
        bucket_cap_mb=t_cfg.bucket_cap_mb)
    seed_everything(seed + info.rank)
    return Setup(
        device=device, precision=precision, model=model, train_model=train_model,
        optimizer=optimizer, scheduler=scheduler, scaler=scaler, sampler=sampler,
        train_loader=train_loader, valid_set=valid_set, valid_loader=valid_loader,
        tokenizer=tokenizer, vocab_size=vocab_size, vocab=vocab_identity(tokenizer.model_path),
        steps_per_epoch=steps_per_epoch, data=training_data_identity(cfg.data),
        params=[p for p in model.parameters() if p.requires_grad],
        pad_to_multiple=pad_to_multiple,
        grads_in_buckets=ddp,
        packed_shape=packed_shape,
    )


def check_whole_step(t_cfg: TrainerConfig, precision: str) -> None:
    """Refuse ``trainer.cuda_graphs`` where the whole step does not apply: fp16 (its loss
    scaler is not in the graph). (Packing off is refused when the configuration is composed.)

    Raises:
        ConfigError: one line naming the setting and what to change.
    """
    if not t_cfg.cuda_graphs:
        return
    if precision == "fp16":
        raise ConfigError("trainer.cuda_graphs=true does not take precision fp16 (its dynamic "
                          "loss scaler is not part of the graph): use trainer.precision=bf16 "
                          "or fp32, or trainer.cuda_graphs=false")


def resolve_pack_length(cfg: Config, train_set: ParallelDataset) -> int:
    """``trainer.pack_length``, or when it is None the longest training pair the run keeps
    (either side, eos or bos included; pairs beyond ``model.max_positions``, and with
    ``trainer.too_long=skip`` beyond ``max_tokens``, are left out by the sampler and do not
    count), from the prepared data's lengths."""
    if cfg.trainer.pack_length is not None:
        return int(cfg.trainer.pack_length)
    longer = np.maximum(train_set.src_sizes, train_set.tgt_sizes) + 1
    limit = int(cfg.model.max_positions)
    if cfg.trainer.too_long == "skip":
        limit = min(limit, int(cfg.trainer.max_tokens))
    kept = longer[longer <= limit]
    return max(int(kept.max(initial=1)), 1)


def packed_attention_kind(cfg: Config, device: torch.device, compiled: bool) -> str:
    """How packed batches attend (:meth:`Transformer.set_packed_attention`): ``flex`` when the
    model is compiled on CUDA without attention dropout (flex attention's block mask skips
    the blocks between sentences), else ``dense`` (a boolean mask with SDPA: torch 2.13 has
    no flex backward on a CPU, and flex attention has no dropout)."""
    if compiled and device.type == "cuda" and float(cfg.model.attention_dropout) == 0.0:
        return "flex"
    return "dense"


def _activation_dtype(precision: str) -> torch.dtype:
    """The dtype of attention inputs under the run's autocast precision."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(precision), torch.float32)


INIT_FROM_FREE_KEYS = ("name", "dropout", "attention_dropout", "activation_dropout", "init")
"""``model`` keys that may differ between a ``trainer.init_from`` model file and the run: the
preset's label, the dropout rates (training only) and the initialisation the file replaces."""


def check_init_architecture(cfg: Config, path: str) -> None:
    """Fail unless the model file ``path`` (``trainer.init_from``) was trained with the run's
    architecture: every ``model`` key but :data:`INIT_FROM_FREE_KEYS` equal, as a resume
    compares them (``model.heads``, ``norm``, ``positions``, ``share_embeddings``, ...: shapes
    alone do not tell 2 heads from 4, and the weights would be read as another model). Keys
    named in ``trainer.resume_changed`` (or ``[*]``) are a deliberate change. A file without a
    stored config is not compared.

    Raises:
        UserError: naming the file, each key with both values, and the override.
    """
    try:
        saved = read_checkpoint(path, mmap=True).get("config")
    except Exception:  # noqa: BLE001 - read and reported by load_initial_weights
        return
    theirs = (saved or {}).get("model") if isinstance(saved, dict) else None
    if not isinstance(theirs, dict):
        return
    ours = to_plain(cfg)["model"]
    allowed = set(cfg.trainer.resume_changed or [])
    if "*" in allowed:
        return
    diff = [f"model.{k}: {theirs[k]!r} != {ours.get(k)!r}" for k in sorted(theirs)
            if k not in INIT_FROM_FREE_KEYS and f"model.{k}" not in allowed
            and theirs[k] != ours.get(k)]
    if diff:
        keys = ",".join(d.split(":")[0] for d in diff)
        raise UserError(
            f"trainer.init_from={path} was trained with another architecture ("
            + "; ".join(diff) + "): its weights would be read as another model; use the model "
            f"settings it was trained with, or add trainer.resume_changed=[{keys}] to change "
            "them deliberately")


def _device_cap(cfg: Config, info: distributed.DistInfo,
                train_set: ParallelDataset) -> dict[str, int]:
    """``trainer.auto_max_tokens`` on a GPU: the estimated micro-batch budget of the smallest
    GPU of the run (:func:`transformer_nmt.train.batch_size.cuda_max_tokens`, a minimum over
    ranks) and the longest pair's length as the floor; ``{}`` otherwise (CPU: ``max_tokens``
    as given)."""
    if not cfg.trainer.auto_max_tokens or info.device.type != "cuda":
        if cfg.trainer.auto_max_tokens:
            log.info("trainer.auto_max_tokens: no GPU; max_tokens %d as given",
                     cfg.trainer.max_tokens)
        return {}
    cap, line = cuda_max_tokens(cfg.model, info.device)
    log.info("trainer.auto_max_tokens: %s", line)
    smallest = -int(distributed.all_reduce_max(
        torch.tensor([-cap], dtype=torch.int64, device=info.device)).item())
    longest = max(int(train_set.src_sizes.max(initial=0)),
                  int(train_set.tgt_sizes.max(initial=0))) + 1
    if smallest < longest:
        raise UserError(f"trainer.auto_max_tokens: the smallest GPU of the run holds an "
                        f"estimated {smallest} tokens per micro-batch, less than the longest "
                        f"training pair ({longest} with eos); set trainer.max_tokens and "
                        "trainer.auto_max_tokens=false")
    return {"device_cap": smallest, "min_tokens": longest}


def _left_out(sampler: LengthBucketSampler, pairs: int, cfg: Config) -> str:
    """Why a split gives no batch: its size and the pairs each limit left out."""
    if pairs == 0:
        return "it holds no pair; prepare it again (nmt-prepare) or choose another split"
    return (f"of its {pairs} pairs, {sampler.num_skipped} are longer than "
            f"trainer.max_tokens={cfg.trainer.max_tokens} and "
            f"{len(sampler.skipped_positions)} longer than "
            f"model.max_positions={cfg.model.max_positions} (tokens with eos, either "
            "side); raise these limits")


def _max_length(cfg: Config) -> int | None:
    """The longest row the model takes (learned positions: ``model.max_positions``; None for
    the sinusoidal table, which grows)."""
    return cfg.model.max_positions if cfg.model.positions == Positions.learned else None


def loader_workers(requested: int, cpus: int | None = None) -> int:
    """``trainer.num_workers``, capped at the CPUs this process may use minus one (the
    training thread's): more workers than cores only contend with it."""
    if cpus is None:
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    workers = min(requested, max(cpus - 1, 0))
    if workers < requested:
        log.info("DataLoader workers: %d (trainer.num_workers=%d, %d CPUs available)",
                 workers, requested, cpus)
    return workers


def resolve_pad_to_multiple(setting: int | None, device: torch.device) -> int:
    """``trainer.pad_to_multiple`` resolved: None (the default) means 8 on CUDA, 1 elsewhere."""
    return (8 if device.type == "cuda" else 1) if setting is None else int(setting)


def resolve_grad_compression(setting: str, device: torch.device,
                              env: dict[str, str] | None = None) -> str:
    """``trainer.grad_compression`` resolved to ``none`` or ``bf16``: ``auto`` is bf16 when
    the torchrun environment (``env``, default ``os.environ``) spans several nodes
    (``WORLD_SIZE > LOCAL_WORLD_SIZE``) on CUDA.

    Raises:
        ValueError: ``bf16`` asked for off CUDA (DDP's bf16 hook needs NCCL).
    """
    import os

    env = os.environ if env is None else env
    if setting == "auto":
        world = int(env.get("WORLD_SIZE") or 1)
        local = int(env.get("LOCAL_WORLD_SIZE") or world)
        return "bf16" if device.type == "cuda" and world > local else "none"
    if setting == "bf16" and device.type != "cuda":
        raise ValueError("trainer.grad_compression=bf16 needs CUDA (DDP's bf16 hook runs on "
                         f"NCCL); this run is on {device.type}: use none or auto")
    return setting


MIN_BUCKET_CAP_MB = 1.0
"""The smallest ``trainer.bucket_cap_mb`` accepted: below 1 MB compiled DDP's graph
splitting fails with an AssertionError (torch 2.13)."""


def check_bucket_cap_mb(value: float) -> None:
    """Refuse a ``trainer.bucket_cap_mb`` below :data:`MIN_BUCKET_CAP_MB` (checked on every
    run, single-GPU ones included, so the setting fails before a multi-GPU job does).

    Raises:
        UserError: naming the value and the smallest allowed.
    """
    if not value >= MIN_BUCKET_CAP_MB:
        raise UserError(f"trainer.bucket_cap_mb={value:g}: DDP gradient buckets must be at "
                        f"least {MIN_BUCKET_CAP_MB:g} MB (PyTorch's default is 25)")


def compile_enabled(setting: bool | None, device: torch.device) -> bool:
    """``trainer.compile`` resolved: None (the default) means on for CUDA, off elsewhere."""
    return device.type == "cuda" if setting is None else bool(setting)


def wrap_model(model: torch.nn.Module, info: distributed.DistInfo, *, compile: bool,
               backend: Any = "inductor", grad_compression: str = "none",
               bucket_cap_mb: float = 25.0) -> torch.nn.Module:
    """The module the training loop calls: ``model`` wrapped in DDP (several ranks), then
    compiled (``compile``, with ``torch.compile``'s ``backend``).

    DDP: gradient buckets of ``bucket_cap_mb`` MB, the gradients views of them
    (``gradient_as_bucket_view``: no copy in or out), and with ``grad_compression="bf16"``
    DDP's ``bf16_compress_hook`` (the buckets all-reduced in bf16, half the bytes).

    The training step marks the batch, length and target-token dimensions of its inputs
    dynamic (:func:`transformer_nmt.train.step.mark_dynamic_batch`), so one graph serves
    every batch shape (tests/unit/train/test_compile.py counts the recompilations over real
    batches); on CUDA the lengths are also multiples of 8 (``trainer.pad_to_multiple``).

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
            bucket_cap_mb=bucket_cap_mb,
            **no_buffer_sync,
        )
        if grad_compression == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
    if not compile:
        return wrapped
    limit_recompiles(model_device(model))
    return torch.compile(wrapped, backend=backend)


RECOMPILE_LIMIT = 8
"""Graphs ``torch.compile`` may trace for one frame (the model's forward, the loss) before
the run stops with an error instead of running that frame eagerly from then on (torch's
default is to fall back silently, which would halve the speed without a word)."""


def limit_recompiles(device: torch.device) -> None:
    """Make a recompilation beyond :data:`RECOMPILE_LIMIT` raise
    (``torch._dynamo.config.fail_on_recompile_limit_hit``), and on CUDA log every
    recompilation with its reason (what ``TORCH_LOGS=recompiles`` prints)."""
    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if device.type == "cuda":
        torch._logging.set_logs(recompiles=True)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))
