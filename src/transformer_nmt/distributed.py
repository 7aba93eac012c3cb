"""The torchrun environment: rank / world size, process-group set-up and small collectives.

``torchrun`` (and SLURM launchers built on it) set ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (plus ``MASTER_ADDR`` / ``MASTER_PORT``) for every worker. With
``WORLD_SIZE`` unset or 1 no process group is created and every helper here is a no-op, so
the training loop is the same code for one process and for many.

Back-end: NCCL when the process owns a GPU, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    Attributes:
        rank: global rank in [0, world_size).
        world_size: number of processes (1 = no process group).
        local_rank: rank on this node (selects the GPU).
        device: ``cuda:<local_rank>`` when a GPU is available, else ``cpu``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the only rank that writes logs and checkpoints)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group is in use (world_size > 1)."""
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from e


def init_distributed(device: str | None = None) -> DistInfo:
    """Read the torchrun environment and create the process group when world_size > 1.

    Args:
        device: ``"cpu"`` to force CPU (gloo) even when GPUs exist; ``None`` = GPU if available.

    Returns:
        The :class:`DistInfo` of this process. On GPU, ``torch.cuda.set_device(local_rank)``
        has been called.

    Raises:
        ValueError: when RANK / WORLD_SIZE / LOCAL_RANK are inconsistent (names the values).
    """
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world_size}")
    use_cuda = torch.cuda.is_available() and device != "cpu"
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are visible"
            )
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def is_initialized() -> bool:
    """True when a process group exists."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    """World size (1 without a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single-process run)."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place and return it (unchanged without a process group)."""
    if is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over ranks in place (unchanged without a process group)."""
    if is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable objects; identity without a group)."""
    if not is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank (``[obj]`` without a process group)."""
    if not is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def cleanup() -> None:
    """Destroy the process group if one was created."""
    if is_initialized():
        dist.destroy_process_group()
