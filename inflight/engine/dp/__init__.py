"""Data parallelism: engine replicas in their own processes behind one server, with a
prefix-cache-aware router (``data_parallel_size``)."""
from inflight.engine.dp.client import DPEngineClient
from inflight.engine.dp.router import PrefixAwareRouter, RouteDecision

__all__ = ["DPEngineClient", "PrefixAwareRouter", "RouteDecision"]
