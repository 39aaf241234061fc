"""The executor: runs the model runner of every rank and hands the engine rank 0's output.

vLLM's ``distributed_executor_backend`` names the kinds: ``uni`` (the runner in the
engine's process), ``mp`` (a worker process per rank on this machine), ``ray`` (a Ray
actor per rank, on any machine of a Ray cluster). Each step the engine calls
``execute_model`` once; the executor sends the scheduler output to every rank once
and returns rank 0's sampled tokens. A rank that dies or fails is reported as
``ExecutorDeadError``: the engine loop stops, its requests fail, ``/health`` answers 503.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Optional

from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.engine.async_stream import EngineDeadError

if TYPE_CHECKING:
    from inflight.config import EngineConfig, ParallelConfig
    from inflight.worker.builder import BuiltRunner


class ExecutorDeadError(EngineDeadError):
    """A worker died or failed: no request can make progress."""


class Executor(abc.ABC):
    """Builds the model on every rank (``built``: rank 0's sizes) and runs its steps."""

    built: "BuiltRunner"  # runner is None where it lives in another process
    runner = None  # the in-process ModelRunner (uni only)

    @staticmethod
    def get_class(parallel_config: "ParallelConfig") -> type["Executor"]:
        """The executor class for the configured (or default) backend."""
        backend = parallel_config.executor_backend
        if backend == "uni":
            from inflight.executor.uniproc import UniProcExecutor
            return UniProcExecutor
        if backend == "mp":
            from inflight.executor.multiproc import MultiprocExecutor
            return MultiprocExecutor
        from inflight.executor.ray_executor import RayExecutor
        return RayExecutor

    def __init__(self, config: "EngineConfig", hf_config: Optional[dict] = None, weights=None) -> None:
        from inflight.platforms import current_platform

        # the engine's scheduler reads the settings left to the platform: fill them in here,
        # not only in the workers' copies of the config
        current_platform(config.device).check_and_update_config(config)
        world = config.parallel_config.world_size
        if hf_config is not None and world > 1:  # a clear error before any worker starts
            from inflight.distributed.sharding import local_arch
            from inflight.models.registry import ModelArchConfig, get_model_class

            arch = ModelArchConfig.from_hf(hf_config)
            if not vars(get_model_class(arch.architecture)).get("supports_tensor_parallel", False):
                raise ValueError(f"{arch.architecture} does not support tensor_parallel_size > 1 yet")
            local_arch(arch, world, 0)
        self.config = config
        self._init_workers(hf_config, weights)

    @abc.abstractmethod
    def _init_workers(self, hf_config: Optional[dict], weights) -> None:
        """Start the ranks, build their runners and set ``built``."""

    @abc.abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step on every rank; rank 0's output. Raises ExecutorDeadError when a rank is gone."""

    def check_health(self) -> None:
        """Raise ExecutorDeadError when a rank is gone."""

    def shutdown(self) -> None:
        """Stop the ranks (idempotent)."""
