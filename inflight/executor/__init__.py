"""Executors: run the model runner of every rank (uni / mp / ray, vLLM's backend names)."""
from inflight.executor.abstract import Executor, ExecutorDeadError

__all__ = ["Executor", "ExecutorDeadError"]
