"""Physical cores from sysfs, and the shares of them that data-parallel replicas and
tensor-parallel ranks get: whole cores with their SMT siblings, a thread a core."""
import os

import torch

from inflight.executor import worker
from inflight.platforms import cpu_topology, placement
from inflight.platforms.cpu import CpuPlatform
from inflight.platforms.cpu_topology import parse_cpu_list, physical_cores, split_cores


def fake_sysfs(root, siblings: dict[int, str]) -> str:
    """A sysfs CPU folder whose CPUs have the given thread_siblings_list."""
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return str(root)


def intel_style(root, cores: int) -> str:
    """Siblings a core count apart (cpu i and i + cores), as Linux numbers most SMT hosts."""
    return fake_sysfs(root, {c: f"{c % cores},{c % cores + cores}" for c in range(2 * cores)})


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("") == []


def test_siblings_a_core_count_apart_are_one_core(tmp_path):
    sysfs = intel_style(tmp_path, 4)
    assert physical_cores(range(8), sysfs) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_siblings_side_by_side_are_one_core(tmp_path):
    sysfs = fake_sysfs(tmp_path, {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(6)})
    assert physical_cores(range(6), sysfs) == [(0, 1), (2, 3), (4, 5)]


def test_only_the_allowed_cpus_count(tmp_path):
    sysfs = intel_style(tmp_path, 4)
    assert physical_cores([0, 1, 4], sysfs) == [(0, 4), (1,)]


def test_unreadable_topology_is_a_core_a_cpu(tmp_path):
    assert physical_cores([0, 1, 2], str(tmp_path / "absent")) == [(0,), (1,), (2,)]
    bad = fake_sysfs(tmp_path / "bad", {0: "zero", 1: "1"})
    assert physical_cores([0, 1], bad) == [(0,), (1,)]


def test_replicas_never_share_a_core(tmp_path):
    cores = physical_cores(range(8), intel_style(tmp_path, 4))
    shares = split_cores(2, cores)
    assert shares == [(2, [0, 4, 1, 5]), (2, [2, 6, 3, 7])]
    # three shares of four cores: a core each is left out rather than split
    assert [t for t, _ in split_cores(3, cores)] == [1, 1, 1]
    assert split_cores(3, cores)[2][1] == [2, 6]


def test_fewer_cores_than_shares_splits_cpus_then_gives_up_pinning():
    one_core_two_threads = [(0, 1)]
    assert split_cores(2, one_core_two_threads) == [(1, [0]), (1, [1])]
    assert split_cores(3, one_core_two_threads) == [(1, []), (1, []), (1, [])]


def with_nodes(sysfs: str, node_of: dict[int, int]) -> str:
    """Add the ``cpuN/nodeM`` links sysfs shows on a NUMA host (folders do as well here)."""
    for cpu, node in node_of.items():
        os.makedirs(os.path.join(sysfs, f"cpu{cpu}", f"node{node}"))
    return sysfs


def test_cores_go_node_by_node_so_shares_stay_inside_a_node(tmp_path):
    # two nodes numbered alternately (node 0 the even CPUs), no SMT
    alternating = with_nodes(fake_sysfs(tmp_path / "alt", {c: str(c) for c in range(8)}), {c: c % 2 for c in range(8)})
    cores = physical_cores(range(8), alternating)
    assert cores == [(0,), (2,), (4,), (6,), (1,), (3,), (5,), (7,)]
    assert split_cores(2, cores) == [(4, [0, 2, 4, 6]), (4, [1, 3, 5, 7])]
    assert [cpus for _, cpus in split_cores(4, cores)] == [[0, 2], [4, 6], [1, 3], [5, 7]]
    # two sockets of two cores with SMT siblings a CPU count apart: already in node order
    two_sockets = with_nodes(intel_style(tmp_path / "smt", 4), {c: c % 4 // 2 for c in range(8)})
    assert physical_cores(range(8), two_sockets) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert split_cores(2, physical_cores(range(8), two_sockets)) == [(2, [0, 4, 1, 5]), (2, [2, 6, 3, 7])]
    assert cpu_topology.numa_node(5, two_sockets) == 0 and cpu_topology.numa_node(3, two_sockets) == 1
    assert cpu_topology.numa_node(0, str(tmp_path / "absent")) == -1


def test_placements_and_rank_threads_follow_the_cores(tmp_path, monkeypatch):
    sysfs = intel_style(tmp_path, 4)
    fake = lambda: physical_cores(range(8), sysfs)  # noqa: E731
    monkeypatch.setattr(placement, "physical_cores", fake)
    monkeypatch.setattr(worker, "physical_cores", fake)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    replicas = placement.split_host_cores(2)
    assert [(p.num_threads, p.cpus) for p in replicas] == [(2, [0, 4, 1, 5]), (2, [2, 6, 3, 7])]
    assert worker.threads_per_rank(2) == 2 and worker.threads_per_rank(1) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert worker.threads_per_rank(2) == 1


def test_this_machine_has_a_core_for_every_cpu_group():
    cores = physical_cores()
    cpus = sorted(c for core in cores for c in core)
    assert cpus == cpu_topology.allowed_cpus() and len(cores) >= 1


def test_the_cpu_platform_runs_no_more_threads_than_cores(monkeypatch):
    import inflight.platforms.cpu as cpu_platform

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(cpu_platform, "physical_cores", lambda: [(0, 1)])
        CpuPlatform().prepare_process()
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(cpu_platform, "physical_cores", lambda: [(0,), (1,), (2,)])
        CpuPlatform().prepare_process()  # fewer threads than cores: the user's choice stands
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
