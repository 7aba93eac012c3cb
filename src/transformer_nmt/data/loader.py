"""The training and validation ``DataLoader``:
:class:`~transformer_nmt.data.batching.LengthBucketSampler`
batches collated by :func:`~transformer_nmt.data.batching.collate`, optionally in worker
processes that prefetch and leave the stop signals to the training process."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from transformer_nmt.data.batching import LengthBucketSampler, ParallelDataset, collate


def build_dataloader(
    dataset: ParallelDataset,
    sampler: LengthBucketSampler,
    num_workers: int = 0,
    pin_memory: bool = False,
    generator: torch.Generator | None = None,
    pad_to_multiple: int = 1,
    max_length: int | None = None,
    prefetch_factor: int | None = None,
    collate_fn: Callable[..., Any] | None = None,
) -> DataLoader:
    """A ``DataLoader`` over ``dataset`` with ``sampler`` as its batch sampler.

    ``pad_to_multiple`` and ``max_length`` go to :func:`collate`; ``collate_fn`` replaces
    it (packed batches: :func:`~transformer_nmt.data.packing.collate_packed` with the
    sampler's shape); ``prefetch_factor``:
    batches each worker prepares ahead (``num_workers > 0`` only; None = PyTorch's 2). The
    workers persist across epochs (``persistent_workers``): they are forked once, before the
    compile and TensorBoard threads exist, not again at every epoch; the batch sampler runs
    in the main process, so each epoch's ``set_epoch`` and resume position still apply.

    ``generator``: a private RNG for the loader (worker seeds). The training loop passes one
    so that creating a loader iterator never draws from the global torch RNG: dropout after
    a resume then matches an uninterrupted run.

    It yields :class:`Batch` objects, or None for the ``[]`` padding batches of a rank
    with no data left (the training loop treats None as "no data on this rank in this
    micro-step" and still joins the gradient all-reduce).

    The loader draws batch indices from the sampler ahead of consumption (prefetching
    with ``num_workers > 0``), so the sampler's own ``state_dict()["position"]`` can run
    ahead; the training loop counts consumed batches itself and saves that count as the
    position (see the module docstring). Call ``sampler.set_epoch(e)`` before
    iterating the loader for epoch ``e``.
    """
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=(collate_fn if collate_fn is not None else
                    collate if pad_to_multiple <= 1 and max_length is None else
                    functools.partial(collate, pad_to_multiple=pad_to_multiple,
                                      max_length=max_length)),
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=generator,
        worker_init_fn=ignore_stop_signals if num_workers > 0 else None,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
    )


WORKER_IGNORED_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
"""Signals a DataLoader worker ignores: SLURM and Ctrl-C signal every process of the job or
terminal, and a worker that died of them would fail the main process before it checkpoints."""


def ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn``: leave the stop signals to the training process (it checkpoints and
    exits; the workers end with it)."""
    for name in WORKER_IGNORED_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
