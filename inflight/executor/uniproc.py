"""``uni``: the model runner in the engine's own process (one rank)."""
from __future__ import annotations

from typing import Optional

from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.executor.abstract import Executor


class UniProcExecutor(Executor):
    """Today's in-process runner behind the executor interface: no copies, no processes."""

    def _init_workers(self, hf_config: Optional[dict], weights) -> None:
        from inflight.worker.builder import build_runner

        self.built = build_runner(self.config, hf_config, weights)
        self.runner = self.built.runner

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(scheduler_output)
