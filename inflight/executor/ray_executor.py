"""``ray``: one Ray actor per rank, on any machine of the Ray cluster (``pip install ray``).

``ray.init()`` joins the cluster named by ``RAY_ADDRESS`` or starts a local one. Each
step the scheduler output is put into Ray's object store once and every actor reads
that one object; only rank 0's output is fetched. A dead actor makes ``ray.get``
raise, which is reported as ``ExecutorDeadError``.
"""
from __future__ import annotations

import logging
from typing import Optional

from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.executor.abstract import Executor, ExecutorDeadError
from inflight.executor.worker import Worker, free_port, threads_per_rank

logger = logging.getLogger(__name__)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("distributed_executor_backend='ray' needs Ray: pip install 'inflight[ray]'") from None
    return ray


class _RankActor:
    """The body of a rank's actor: a Worker."""

    def __init__(self, config, rank: int, world_size: int, num_threads: int) -> None:
        self.worker = Worker(config, rank, world_size, "")
        self.num_threads = num_threads

    def rendezvous(self) -> str:
        """The process group's address: a free port on this actor's node."""
        import ray
        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def load(self, init_method: str):
        self.worker.init_method = init_method
        self.worker.init_device(self.num_threads)
        return self.worker.load_model()

    def execute_model(self, scheduler_output):
        return self.worker.execute_model(scheduler_output)


class RayExecutor(Executor):
    """Ray actors for ranks 0..N-1, the rendezvous at rank 0's node."""

    def _init_workers(self, hf_config: Optional[dict], weights) -> None:
        ray = self.ray = _import_ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        world = self.config.parallel_config.world_size
        actor_cls = ray.remote(num_cpus=0)(_RankActor)
        threads = threads_per_rank(world)
        self.actors = [actor_cls.remote(self.config, r, world, threads) for r in range(world)]
        self._dead: Optional[str] = None
        try:
            init_method = self._get(self.actors[0].rendezvous.remote())
            infos = self._get([a.load.remote(init_method) for a in self.actors])
        except BaseException:
            self.shutdown()
            raise
        self.built = infos[0]

    def _get(self, refs):
        try:
            return self.ray.get(refs)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.RayTaskError) as e:
            self._dead = f"{type(e).__name__}: {e}"
            self.shutdown()
            raise ExecutorDeadError(f"a worker of the engine failed: {str(e).splitlines()[0]}") from e

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.check_health()
        ref = self.ray.put(scheduler_output)  # one copy in the object store, read by every rank
        refs = [a.execute_model.remote(ref) for a in self.actors]
        # rank 0's result first; the others' (None) only to surface their failures
        return self._get(refs)[0]

    def check_health(self) -> None:
        if self._dead is not None:
            raise ExecutorDeadError(f"a worker of the engine failed: {self._dead.splitlines()[0]}")

    def shutdown(self) -> None:
        for actor in getattr(self, "actors", []):
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.actors = []
