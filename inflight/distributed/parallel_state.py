"""The tensor-parallel group of this process and its collectives.

As vLLM's ``vllm.distributed.parallel_state``: one process per rank, the group set
up once with ``init_distributed_environment`` (gloo on the CPU, NCCL on CUDA), and
the model's parallel layers asking for the rank and world size. A process that
never initialised the group is rank 0 of a world of one, and every collective is
the identity: the single-process engine runs the same model code.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    world_size: int = 1


_TP = TPGroup()


def init_distributed_environment(world_size: int, rank: int, init_method: str, backend: str = "gloo",
                                 timeout_s: float = 600.0) -> None:
    """Join the process group of ``world_size`` ranks (all of them one TP group)."""
    global _TP
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                                timeout=datetime.timedelta(seconds=timeout_s))
    _TP = TPGroup(rank, world_size)
    logger.debug("rank %d of %d joined (%s)", rank, world_size, backend)


def destroy_distributed_environment() -> None:
    """Leave the process group (a no-op for a world of one)."""
    global _TP
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = TPGroup()


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the TP ranks, in place; every rank gets the sum."""
    if _TP.world_size > 1:
        dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape on every rank) along ``dim``."""
    if _TP.world_size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_TP.world_size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=dim)


def broadcast_object(obj: Optional[object], src: int = 0) -> object:
    """``obj`` from rank ``src`` on every rank (pickled; for small control data)."""
    if _TP.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
