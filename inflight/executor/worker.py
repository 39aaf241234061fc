"""One rank of a multi-process engine: joins the TP group, loads its shard, runs steps.

Used by the ``mp`` worker processes and the ``ray`` actors alike.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace
from typing import Optional

from inflight.config import EngineConfig
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.platforms.cpu_topology import physical_cores, split_cores

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port free on this machine now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def threads_per_rank(world_size: int) -> int:
    """Threads for each of ``world_size`` ranks on this machine: a thread a physical core of
    the rank's share (cpu_topology.split_cores), or ``OMP_NUM_THREADS`` (per rank) when set
    and smaller: a rank never runs more threads than the cores it is pinned to (a
    data-parallel replica's OMP_NUM_THREADS is the whole replica's)."""
    share = split_cores(world_size, physical_cores())[0][0]
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return min(int(env), share)
    return share


def pin_cores(rank: int, world_size: int) -> Optional[list[int]]:
    """Pin this process to its rank's share of the physical cores, SMT siblings included (none
    when there are fewer CPUs than ranks)."""
    mine = split_cores(world_size, physical_cores())[rank][1]
    if not mine:
        return None
    os.sched_setaffinity(0, mine)
    return mine


class Worker:
    """Rank ``rank`` of ``world_size``: its model shard, KV pool and runner."""

    def __init__(self, config: EngineConfig, rank: int, world_size: int, init_method: str) -> None:
        self.config, self.rank, self.world_size, self.init_method = config, rank, world_size, init_method
        self.runner = None

    def init_device(self, num_threads: int) -> None:
        """Threads and the process group (gloo on the CPU, NCCL on CUDA)."""
        import torch

        from inflight.distributed.parallel_state import init_distributed_environment
        from inflight.worker.builder import resolve_device

        torch.set_num_threads(num_threads)
        device = resolve_device(self.config.device)
        if device.type == "cuda":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
        init_distributed_environment(self.world_size, self.rank, self.init_method,
                                     "nccl" if device.type == "cuda" else "gloo")

    def load_model(self):
        """Build this rank's runner; returns its sizes (a BuiltRunner without the runner)."""
        from inflight.loader import load_model
        from inflight.worker.builder import build_runner

        loaded = load_model(self.config.model_config.model, quantization=self.config.model_config.quantization,
                            hf_overrides=self.config.model_config.hf_overrides)
        built = build_runner(self.config, loaded.hf_config, loaded.weights)
        self.runner = built.runner
        return replace(built, runner=None)

    def execute_model(self, scheduler_output: SchedulerOutput) -> Optional[ModelRunnerOutput]:
        """Every rank runs the step (the collectives need all of them); rank 0's output only."""
        out = self.runner.execute(scheduler_output)
        return out if self.rank == 0 else None

    def shutdown(self) -> None:
        from inflight.distributed.parallel_state import destroy_distributed_environment

        destroy_distributed_environment()
