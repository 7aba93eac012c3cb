"""The torchrun environment: rank / world size, process-group set-up and small collectives.

``torchrun`` (and SLURM launchers built on it) set ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (plus ``MASTER_ADDR`` / ``MASTER_PORT``) for every worker. With
``WORLD_SIZE`` unset or 1 no process group is created and every helper here is a no-op, so
the training loop is the same code for one process and for many.

Back-end: NCCL when the process owns a GPU, gloo on CPU.

Under ``torchrun`` (c10d rendezvous, torch >= 2.5) the workers' ``MASTER_PORT`` is a TCPStore
that the agent hosts for its whole life: a group restarted after a failed worker
(``--max-restarts``) finds in it every key the previous group wrote, and gloo (like NCCL's unique
id) would read the dead group's addresses. :func:`init_distributed` therefore sets the group up
under a key prefix that only the processes of this group know (:func:`group_namespace`).
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout


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
        store = _agent_store(rank, world_size, default_pg_timeout)
        if store is None:
            dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank,
                                    world_size=world_size)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


NAMESPACE_ROOT = "transformer_nmt/group"
"""Keys of :func:`group_namespace` in the store (under it: ``hello/``, ``token/``, ``ack/``)."""


def _agent_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store | None:
    """torchrun's shared store (``TORCHELASTIC_USE_AGENT_STORE=True``) under this group's own
    prefix (:func:`group_namespace`); None otherwise (``init_process_group``'s env:// set-up,
    whose store rank 0 creates afresh)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT", 0),
                          world_size=world_size, is_master=False, timeout=timeout)
    namespace = group_namespace(store, rank, world_size, timeout)
    return dist.PrefixStore(f"{NAMESPACE_ROOT}/{namespace}/", store)


def group_namespace(store: dist.Store, rank: int, world_size: int,
                    timeout: timedelta = default_pg_timeout, poll_s: float = 0.01) -> str:
    """A random token that every rank of this group returns, unknown to any earlier group.

    ``store`` may hold every key of earlier groups (processes that used the same store and
    are gone: a torchrun restart). Neither ``TORCHELASTIC_RESTART_COUNT`` (each agent counts
    its own restarts, so nodes disagree) nor a key's presence tells a fresh value from a stale
    one, so the ranks hand-shake with values only live processes can know: rank ``r`` > 0
    writes a fresh random nonce to ``hello/r`` and waits for ``token/<nonce>``; rank 0 draws
    the token, answers every ``hello/r`` it reads (a stale nonce gets an answer nobody waits
    for) until each rank ``r`` has written ``ack/<token>/r``. Collective: every rank of the
    group must call it.

    Args:
        store: the store every rank reaches (torchrun's TCPStore).
        rank, world_size: this process's place in the group.
        timeout: how long rank 0 waits for the others (the others wait as long in
            ``store.get``: the store's own timeout).
        poll_s: rank 0's pause between two reads of the keys it waits for, in seconds.

    Returns:
        A 16-character hexadecimal token, the same on every rank.

    Raises:
        TimeoutError: on rank 0 when some rank has not answered within ``timeout`` (names them).
        torch.distributed.DistStoreError: on the other ranks when rank 0 has not answered
            within the store's timeout.
    """
    root = NAMESPACE_ROOT
    if rank != 0:
        nonce = secrets.token_hex(8)
        store.set(f"{root}/hello/{rank}", nonce)
        token = store.get(f"{root}/token/{nonce}").decode()
        store.set(f"{root}/ack/{token}/{rank}", "1")
        return token
    token = secrets.token_hex(8)
    answered: dict[int, bytes] = {}
    waiting = set(range(1, world_size))
    deadline = time.monotonic() + timeout.total_seconds()
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{root}/ack/{token}/{r}"]):
                waiting.discard(r)
            elif store.check([f"{root}/hello/{r}"]):
                nonce = store.get(f"{root}/hello/{r}")
                if answered.get(r) != nonce:
                    store.set(f"{root}/token/{nonce.decode()}", token)
                    answered[r] = nonce
        if waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ranks {sorted(waiting)} of {world_size} did not join the process group "
                    f"within {timeout.total_seconds():g} s")
            time.sleep(poll_s)
    return token


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


def all_reduce_sum_traced(tensors: list[torch.Tensor], bucket_bytes: int = 25 * 2**20,
                          compress: torch.dtype | None = None) -> list[torch.Tensor]:
    """``tensors`` summed over the ranks as new tensors (the inputs are not written), with
    ``torch.distributed._functional_collectives``, which ``torch.compile`` traces into the
    graph (gloo on the CPU, NCCL on CUDA, captured into a CUDA graph). Consecutive tensors of
    one dtype are flattened into buckets of at most ``bucket_bytes`` bytes (a larger tensor
    is a bucket of its own), one all-reduce each; ``compress``: the buckets of floating
    tensors travel in this dtype (bf16: half the bytes, 8 bits of mantissa) and come back in
    their own. Without a process group the tensors are returned as they are.
    Collective: every rank calls it with tensors of the same shapes and dtypes."""
    if not is_initialized() or not tensors:
        return list(tensors)
    import torch.distributed._functional_collectives as funcol

    buckets: list[list[int]] = []
    size = 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if not buckets or t.dtype != tensors[buckets[-1][0]].dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    out: list[torch.Tensor] = list(tensors)
    for bucket in buckets:
        dtype = tensors[bucket[0]].dtype
        flat = torch.cat([tensors[i].reshape(-1) for i in bucket])
        if compress is not None and flat.is_floating_point():
            flat = flat.to(compress)
        flat = funcol.all_reduce(flat, "sum", dist.group.WORLD).to(dtype)
        for i, part in zip(bucket, flat.split([tensors[i].numel() for i in bucket]),
                           strict=True):
            out[i] = part.view(tensors[i].shape)
    return out


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


def export_submitit_environment() -> bool:
    """Under Hydra's submitit SLURM launcher (one task per GPU, no torchrun), set ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the SLURM job
    with submitit's own helper, so :func:`init_distributed` reads
    them as it reads torchrun's.

    A ``MASTER_ADDR`` / ``MASTER_PORT`` already set (by a job script, or a job started from
    another job) is kept, where submitit's ``export`` would refuse to run; the ranks and
    sizes always come from the SLURM job.

    Returns:
        True when the environment was set; False outside submitit or under torchrun.
    """
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "RANK" in os.environ:
        return False
    from submitit.helpers import TorchDistributedEnvironment

    kept = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT") if os.environ.get(k)}
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    os.environ.update(kept)
    return True
