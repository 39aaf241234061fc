"""The CPUs this process may run on, grouped into physical cores.

A core with SMT (Hyper-Threading) shows as two or more logical CPUs that share its vector
units: a GEMM thread on each sibling runs no faster than one, and two engines placed on the
siblings of the same cores halve each other. Linux numbers siblings either side by side
(0,1 | 2,3) or a core count apart (0,4 | 1,5), so slicing the CPU list by number is no
split by core; sysfs says which CPUs are siblings.

On a host of several NUMA nodes (sockets, or chiplet groups) a share that spans two
reads half its memory across the link, and some hosts number their CPUs alternating
between nodes (node 0 the even ones), so cores are ordered by node first. A process
pinned before it allocates (the replicas and ranks are) gets its pages on its own node
from Linux's first-touch policy.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

SYSFS_CPU = "/sys/devices/system/cpu"


def parse_cpu_list(text: str) -> list[int]:
    """Linux's CPU list format ("0-3,8,10-11") as the CPUs it names."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask), in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def numa_node(cpu: int, sysfs: str = SYSFS_CPU) -> int:
    """The NUMA node of ``cpu`` (sysfs links ``cpuN/nodeM``), or -1 where none is shown."""
    try:
        names = os.listdir(os.path.join(sysfs, f"cpu{cpu}"))
    except OSError:
        return -1
    nodes = [int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()]
    return min(nodes, default=-1)


def physical_cores(cpus: Optional[Iterable[int]] = None, sysfs: str = SYSFS_CPU) -> list[tuple[int, ...]]:
    """``cpus`` (default: the allowed ones) grouped by physical core, each core's CPUs in order
    and the cores in the order of their NUMA node, then of their first CPU. A CPU whose
    siblings cannot be read counts as a core of its own (no sysfs: macOS, some containers)."""
    cpus = allowed_cpus() if cpus is None else sorted(set(cpus))
    allowed, seen, cores = set(cpus), set(), []
    for cpu in cpus:
        if cpu in seen:
            continue
        try:
            with open(os.path.join(sysfs, f"cpu{cpu}", "topology", "thread_siblings_list")) as f:
                siblings = parse_cpu_list(f.read())
        except (OSError, ValueError):
            siblings = []
        core = tuple(sorted((set(siblings) & allowed) | {cpu}))
        seen.update(core)
        cores.append(core)
    return sorted(cores, key=lambda core: (numa_node(core[0], sysfs), core[0]))


def split_cores(n: int, cores: list[tuple[int, ...]]) -> list[tuple[int, list[int]]]:
    """``n`` equal shares of ``cores``, each as (threads, CPUs): whole cores with every sibling
    CPU of theirs and a thread a core; with fewer cores than shares, the logical CPUs split
    instead, a thread a CPU; with fewer CPUs than shares, one thread each and no CPUs (no
    pinning). NOTE: shares are cut in the order of ``cores``, which physical_cores sorts by
    NUMA node: with as many shares as nodes or a multiple (equal nodes), none spans two."""
    if len(cores) >= n:
        per = len(cores) // n
        return [(per, [c for core in cores[i * per:(i + 1) * per] for c in core]) for i in range(n)]
    cpus = sorted(c for core in cores for c in core)
    if len(cpus) >= n:
        per = len(cpus) // n
        return [(per, cpus[i * per:(i + 1) * per]) for i in range(n)]
    return [(1, []) for _ in range(n)]
