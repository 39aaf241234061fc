"""Builds the engine's KV connector from ``kv_transfer_config`` and drives its engine side."""
from __future__ import annotations

from typing import Any, Optional

from inflight.distributed.kv_transfer.base import KVConnectorBase

# While the scheduler has nothing to run, the step thread waits this long for a transfer
# thread's news (a pull to serve, KV that arrived) before it looks again.
IDLE_WAIT_S = 0.05


def make_kv_connector(config: Any, scheduler: Any, runner: Any, arch: Any) -> Optional[KVConnectorBase]:
    """The connector ``config.kv_transfer_config`` asks for, attached to the scheduler; None without one."""
    kv_config = getattr(config, "kv_transfer_config", None)
    if kv_config is None:
        return None
    if runner is None:
        raise ValueError("kv_transfer_config needs the KV pool in this process (tensor_parallel_size 1)")
    if getattr(arch, "sliding_window", None) or getattr(arch, "kv_sliding_window", None):
        raise ValueError("kv_transfer_config does not support sliding-window models")
    from inflight.distributed.kv_transfer.gloo_connector import GlooConnector

    connector = GlooConnector(kv_config, scheduler.kv, runner.kv_caches, runner.device)
    scheduler.kv_connector = connector
    return connector


def start_step(connector: KVConnectorBase, scheduler: Any) -> None:
    """Before scheduling: wait briefly when idle, then queue the requests whose KV arrived."""
    if not scheduler.has_unfinished_requests():
        connector.wait_for_work(IDLE_WAIT_S)
    for request in connector.take_ready_requests():
        scheduler.add_request(request)
