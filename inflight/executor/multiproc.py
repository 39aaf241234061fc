"""``mp``: one worker process per rank on this machine (multiprocessing spawn).

Each step the scheduler output is pickled once and the same bytes go down a pipe to
every worker; only rank 0 answers with its output. The engine waits on rank 0's
pipe and on every worker's process sentinel and pipe together, so a worker that
dies or fails ends the wait at once (``ExecutorDeadError``) instead of leaving the
engine blocked on a collective that will never finish.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import traceback
from multiprocessing.connection import Connection, wait
from typing import Optional

from inflight.config import EngineConfig
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.executor.abstract import Executor, ExecutorDeadError
from inflight.executor.worker import Worker, free_port, pin_cores, threads_per_rank

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # loading a large checkpoint on every rank


def _worker_main(config: EngineConfig, rank: int, world_size: int, init_method: str, conn: Connection,
                 num_threads: int) -> None:
    """A worker process: build the rank, then run every step the engine sends until told to stop."""
    worker = Worker(config, rank, world_size, init_method)
    try:
        cores = pin_cores(rank, world_size)
        worker.init_device(num_threads)
        conn.send(("ready", worker.load_model()))
        logger.info("rank %d ready (%d threads, cores %s)", rank, num_threads, cores)
        while True:
            msg = conn.recv_bytes()
            if not msg:
                break
            out = worker.execute_model(pickle.loads(msg))
            if rank == 0:
                conn.send(("ok", out))
    except (EOFError, KeyboardInterrupt):
        pass  # the engine went away
    except BaseException as e:  # reported to the engine, which fails the in-flight requests
        try:
            conn.send(("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except (OSError, EOFError):
            pass
    finally:
        worker.shutdown()


class MultiprocExecutor(Executor):
    """Worker processes for ranks 0..N-1; the engine process only schedules."""

    def _init_workers(self, hf_config: Optional[dict], weights) -> None:
        world = self.config.parallel_config.world_size
        ctx = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        num_threads = threads_per_rank(world)
        self.procs: list = []
        self.conns: list[Connection] = []
        self._dead: Optional[str] = None
        # OpenMP reads OMP_NUM_THREADS when torch loads, before any worker code runs
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
        try:
            for rank in range(world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker_main, name=f"inflight-tp{rank}", daemon=True,
                                args=(self.config, rank, world, init_method, child, num_threads))
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        try:
            infos = self._receive(set(range(world)), "ready", STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.built = infos[0]

    def _receive(self, ranks: set[int], kind: str, timeout: Optional[float]) -> dict[int, object]:
        """The next ``kind`` message of each of ``ranks``; ExecutorDeadError as soon as any
        worker reports an error or dies (the other ranks send nothing but errors)."""
        got: dict[int, object] = {}
        while len(got) < len(ranks):
            ready = wait([*self.conns, *(p.sentinel for p in self.procs)], timeout)
            if not ready:
                self._fail(f"ranks {sorted(ranks - set(got))} sent nothing for {timeout:.0f} s")
            for rank, conn in enumerate(self.conns):
                if conn not in ready:
                    continue
                try:
                    tag, payload = conn.recv()
                except (EOFError, OSError):
                    continue  # its process exited: reported below through its sentinel
                if tag == "error":
                    self._fail(payload)
                if rank in ranks and tag == kind:
                    got[rank] = payload
            if len(got) < len(ranks) and any(not p.is_alive() for p in self.procs):
                dead = [f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.procs) if not p.is_alive()]
                self._fail(f"worker process died: {', '.join(dead)}")
        return got

    def _fail(self, reason: str):
        self._dead = self._dead or reason
        logger.error("executor failed: %s", reason)
        self.shutdown()
        raise ExecutorDeadError(f"a worker of the engine failed: {reason.splitlines()[0]}")

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.check_health()
        data = pickle.dumps(scheduler_output, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except (OSError, EOFError):
            self._fail("a worker's pipe is closed")
        return self._receive({0}, "ok", None)[0]

    def check_health(self) -> None:
        if self._dead is not None:
            raise ExecutorDeadError(f"a worker of the engine failed: {self._dead.splitlines()[0]}")
        dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
        if dead:
            self._fail(f"worker process died: rank {dead[0]} (exit code {self.procs[dead[0]].exitcode})")

    def shutdown(self) -> None:
        for conn in getattr(self, "conns", []):
            try:
                conn.send_bytes(b"")
            except (OSError, EOFError, ValueError):
                pass
        for p in getattr(self, "procs", []):
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        for conn in getattr(self, "conns", []):
            conn.close()
        self.conns, self.procs = [], []
