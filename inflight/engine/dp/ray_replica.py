"""Data-parallel replicas as Ray actors (``data_parallel_backend="ray"``), on any node
of the cluster ``ray.init()`` joins (``RAY_ADDRESS``) or a local one.

Each actor listens on a TCP port of its node and runs the same replica loop as a
spawned process; the server connects to it with a random key (multiprocessing's
authenticated connection: the pickles it carries come only from this server), so
everything above the connection is the same for both backends. The model path must
exist on every node.
"""
from __future__ import annotations

import secrets
from multiprocessing.connection import Client, Listener
from typing import TYPE_CHECKING, Any, Optional

from inflight.engine.dp.replica import replica_main
from inflight.engine.dp.replica_handle import ReplicaHandle

if TYPE_CHECKING:
    from inflight.platforms.placement import ReplicaPlacement


class ReplicaActor:
    """The Ray actor: ``listen()`` opens its port, ``run()`` serves one connection."""

    def __init__(self, authkey: bytes) -> None:
        self._authkey = authkey
        self._listener: Optional[Listener] = None

    def listen(self) -> tuple[str, int]:
        import ray

        self._listener = Listener(("0.0.0.0", 0), authkey=self._authkey)
        return ray.util.get_node_ip_address(), self._listener.address[1]

    def run(self, index: int, engine_kwargs: dict[str, Any], placement: dict[str, Any]) -> None:
        conn = self._listener.accept()
        self._listener.close()
        replica_main(index, conn, engine_kwargs, placement, exit_process=False)


class ActorProcess:
    """A Ray actor behind the few ``multiprocessing.Process`` methods a ReplicaHandle uses."""

    def __init__(self, actor: Any, done: Any) -> None:
        self.actor, self.done = actor, done
        self.exitcode: Optional[int] = None

    # NOTE: once Ray is shut down (at exit, or by the caller) every actor is gone, and
    # any ray call would start a fresh local instance just to say so.
    def is_alive(self) -> bool:
        import ray

        return ray.is_initialized() and not ray.wait([self.done], timeout=0)[0]

    def join(self, timeout: Optional[float] = None) -> None:
        import ray

        if not ray.is_initialized() or ray.wait([self.done], timeout=timeout)[0]:
            self.exitcode = 0

    def terminate(self) -> None:
        import ray

        if ray.is_initialized():
            ray.kill(self.actor)

    kill = terminate


def start_ray_replicas(engine_kwargs: list[dict[str, Any]],
                       placements: list["ReplicaPlacement"]) -> list[ReplicaHandle]:
    """One actor per replica, each asking Ray for its share of CPUs (and GPUs); returns
    their handles, connected, the engines still building."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    handles = []
    for i, (kwargs, placement) in enumerate(zip(engine_kwargs, placements)):
        authkey = secrets.token_bytes(32)
        gpus = len(placement.env["CUDA_VISIBLE_DEVICES"].split(",")) if "CUDA_VISIBLE_DEVICES" in placement.env else 0
        # Ray places the actor and sets its visible GPUs; pinning to this machine's cores means nothing there
        actor = ray.remote(num_cpus=placement.num_threads, num_gpus=gpus)(ReplicaActor).remote(authkey)
        address = tuple(ray.get(actor.listen.remote()))
        done = actor.run.remote(i, kwargs, {"num_threads": placement.num_threads, "cpus": None, "env": {}})
        handles.append(ReplicaHandle(i, Client(address, authkey=authkey), ActorProcess(actor, done)))
    return handles
