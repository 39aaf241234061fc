"""``/metrics`` of a data-parallel server: every replica's engine metrics with an
``engine="<index>"`` label (as vLLM labels its DP ranks), and the router's decisions.

Each replica's metrics are recorded in the server process from the outputs and
stats the replica reports, by the same :class:`EngineMetrics` a single engine uses,
each in its own registry; one collector relabels and merges them on a scrape.
"""
from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import Metric

from inflight.engine.dp.router import RouteDecision
from inflight.metrics import PREFIX, EngineMetrics
from inflight.outputs import RequestOutput


class _ReportedStats:
    """Stands in for the engine an EngineMetrics reads after a step."""

    def __init__(self, stats: dict[str, float], num_scheduled_tokens: int) -> None:
        self._stats = stats
        self.last_num_scheduled_tokens = num_scheduled_tokens

    def stats(self) -> dict[str, float]:
        return self._stats


class _LabelledRegistries:
    """A collector yielding the metrics of several registries, each sample labelled
    with its registry's engine index; families of the same name are merged."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for index, registry in enumerate(self.registries):
            for family in registry.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                out.samples.extend(s._replace(labels={**s.labels, "engine": str(index)}) for s in family.samples)
        return list(merged.values())


class DPMetrics:
    """Per-replica engine metrics plus the router's; ``render()`` is the scrape."""

    def __init__(self, model_name: str, num_replicas: int, log_interval_s: float = 5.0) -> None:
        self.model_name = model_name
        self.replicas = [EngineMetrics(model_name, CollectorRegistry(), log_interval_s, log_label=f"engine {i}: ")
                         for i in range(num_replicas)]
        self.registry = CollectorRegistry()
        self.registry.register(_LabelledRegistries([m.registry for m in self.replicas]))
        self.router_requests = Counter(PREFIX + "router_requests", "Requests routed, by replica and reason "
                                       "(prefix: longest cached prefix; load: least loaded; balance: the "
                                       "prefix holder was too busy).", ["model_name", "engine", "reason"],
                                       registry=self.registry)
        self.router_matched_tokens = Counter(PREFIX + "router_prefix_matched_tokens",
                                             "Prompt tokens the chosen replica held in its prefix cache when routed.",
                                             ["model_name", "engine"], registry=self.registry)

    def on_route(self, decision: RouteDecision, block_size: int) -> None:
        engine = str(decision.replica)
        self.router_requests.labels(self.model_name, engine, decision.reason).inc()
        self.router_matched_tokens.labels(self.model_name, engine).inc(decision.matched_blocks * block_size)

    def on_step(self, replica: int, outputs: list[RequestOutput], step_time: float, stats: dict[str, float],
                num_scheduled_tokens: int) -> None:
        self.replicas[replica].on_step(_ReportedStats(stats, num_scheduled_tokens), outputs, step_time)

    def on_abort(self, replica: int, request_id: str, outputs: list[RequestOutput]) -> None:
        self.replicas[replica].on_abort(None, request_id, outputs)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
