"""Where each data-parallel engine replica runs: its cores, its thread count and, on a
device with several units, which of them it sees."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from inflight.platforms.cpu_topology import physical_cores, split_cores


@dataclass
class ReplicaPlacement:
    """Applied by a replica process before torch starts: ``env`` is merged into its
    environment, ``cpus`` (when set) pins it, ``num_threads`` sizes its OpenMP pool."""

    num_threads: int
    cpus: Optional[list[int]] = None
    env: dict[str, str] = field(default_factory=dict)


def split_host_cores(n: int) -> list[ReplicaPlacement]:
    """An equal share of the physical cores this process may use for each of ``n`` replicas,
    with their SMT siblings and a thread a core (cpu_topology.split_cores)."""
    return [ReplicaPlacement(threads, cpus or None) for threads, cpus in split_cores(n, physical_cores())]


def split_devices(visible: list[str], n: int) -> list[list[str]]:
    """An equal slice of the visible devices for each of ``n`` replicas. Raises ValueError
    with fewer devices than replicas: replicas sharing one would each size their KV pool
    from the whole device's memory."""
    if len(visible) < n:
        raise ValueError(f"data_parallel_size {n} needs a device per replica; {len(visible)} visible")
    per = len(visible) // n
    return [visible[i * per:(i + 1) * per] for i in range(n)]
