"""The worked examples of the continuous-batching explainers, by name.

``inflight simulate --example NAME`` runs one, so a reader can put the
explainer's tables next to ours. The explainers call the requests A, B, C, ...;
the simulator calls them r0, r1, r2, ... in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

from inflight.sim.simulator import Workload


@dataclass(frozen=True)
class Example:
    """A named workload and the sentence that introduces it."""

    name: str
    description: str
    workload: Workload


EXAMPLES: dict[str, Example] = {e.name: e for e in (
    Example(
        "2-slots",
        "2 slots; A, B, C, D (r0..r3) need 6, 2, 1, 3 tokens and all arrive at 0",
        Workload.make([6, 2, 1, 3], slots=2)),
    Example(
        "16-requests",
        "16 requests on 4 slots, all arriving at 0; the lengths reproduce the explainer's "
        "totals (216 vs 152 steps), they are not its per-request list",
        Workload.make([31, 33, 46, 57, 6, 12, 50, 57, 18, 22, 52, 28, 20, 50, 19, 27],
                      slots=4)),
    Example(
        "arrivals",
        "2 slots; A..D as in 2-slots, then E and F (4 and 2 tokens: ours, the explainer's "
        "waits do not depend on them); arrivals 0, 0, 1, 2, 3, 4",
        Workload.make([6, 2, 1, 3, 4, 2], [0, 0, 1, 2, 3, 4], slots=2)),
)}
