"""One data-parallel engine replica: a full LLMEngine in its own process, stepped on
the process's main thread, talking to the API server over a pipe.

The loop mirrors the async engine's step thread: commands (add, abort, shut down)
apply at step boundaries; with nothing to do it blocks on the pipe and burns no CPU.
After every iteration it sends one :class:`StepReport`. The module imports no torch
at the top: the core count must be set before torch (and OpenMP) start.
"""
from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any, Optional

from inflight.engine.dp.wire import (AbortCommand, AddCommand, CacheReporter, OutputEncoder, ReplicaInfo,
                                     ShutdownCommand, StepReport)

logger = logging.getLogger(__name__)


def replica_main(index: int, conn: Any, engine_kwargs: dict[str, Any], placement: dict[str, Any],
                 exit_process: bool = True) -> None:
    """Process entry: take this replica's cores (and devices), build the engine, serve the
    pipe until told to stop or the server goes away. ``placement`` is a ReplicaPlacement
    as a dict: unpickling the class would import the platforms, and torch, too early."""
    os.environ.update(placement["env"])  # before torch: CUDA reads its visible devices once
    os.environ["OMP_NUM_THREADS"] = str(placement["num_threads"])
    if exit_process:  # our own process (a Ray worker's signals are Ray's)
        # Ctrl-C reaches the whole process group: the server shuts replicas down in order
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s [dp{index}] %(name)s: %(message)s")
    if placement["cpus"]:
        os.sched_setaffinity(0, placement["cpus"])
    try:
        import torch

        torch.set_num_threads(placement["num_threads"])
        from inflight.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_kwargs(**engine_kwargs)
    except BaseException as e:
        conn.send(f"{type(e).__name__}: {e}")
        return
    cc = engine.config.cache_config
    conn.send(ReplicaInfo(engine.max_model_len, int(engine.arch.vocab_size), cc.block_size, engine.num_blocks,
                          engine.model_source, tuple(engine.eos_token_ids), os.getpid(), engine.pooler_config,
                          int(engine.arch.hidden_size), engine.max_sequence_tokens))
    ReplicaLoop(engine, conn).run()
    logger.info("replica %d stopped", index)
    trace = getattr(engine, "_trace", None)
    if trace is not None:
        trace.flush()
    if hasattr(engine, "shutdown"):
        engine.shutdown()  # its tensor-parallel workers, if any
    if exit_process:
        # NOTE: the interpreter's teardown (torch and OpenMP finalizers) can take seconds or hang in
        # native code with nothing left to save: leave at once. (A Ray actor's process is Ray's to end.)
        logging.shutdown()
        os._exit(0)


def _kv_pool(engine: Any) -> Any:
    """The block pool whose cached hashes the router mirrors."""
    return engine.scheduler.kv.pool


class ReplicaLoop:
    """Applies the server's commands and steps the engine (see the module docstring)."""

    def __init__(self, engine: Any, conn: Any) -> None:
        self.engine = engine
        self.conn = conn
        self.encoder = OutputEncoder()
        self.cache = CacheReporter()
        self.stopping = False

    def run(self) -> None:
        try:
            while not self.stopping:
                commands = self._receive(block=not self.engine.has_unfinished_requests())
                if commands is None:
                    return  # the server is gone
                self.conn.send(self._iterate(commands))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return
        except BaseException as e:
            logger.exception("the replica's engine loop crashed")
            try:
                self.conn.send(StepReport(crash=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
            except Exception:
                pass

    def _receive(self, block: bool) -> Optional[list[Any]]:
        try:
            commands = [self.conn.recv()] if block else []
            while self.conn.poll():
                commands.append(self.conn.recv())
        except EOFError:
            return None
        return commands

    def _iterate(self, commands: list[Any]) -> StepReport:
        report = StepReport()
        for command in commands:
            self._apply(command, report)
        if self.engine.has_unfinished_requests():
            t0 = time.perf_counter()
            outputs = self.engine.step()
            report.step_time = time.perf_counter() - t0
            report.num_scheduled_tokens = getattr(self.engine, "last_num_scheduled_tokens", 0)
            report.outputs = [self.encoder.encode(o) for o in outputs]
        report.stats = self.engine.stats()
        report.cache_added, report.cache_removed = self.cache.delta(_kv_pool(self.engine))
        return report

    def _apply(self, command: Any, report: StepReport) -> None:
        if isinstance(command, AddCommand):
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params,
                                        arrival_time=command.arrival_time, priority=command.priority,
                                        cache_salt=command.cache_salt, lora_request=command.lora_request)
                report.added.append((command.request_id, None))
            except Exception as e:  # the request's fault (or this engine's): the server answers for it
                report.added.append((command.request_id, (type(e).__name__, str(e))))
        elif isinstance(command, AbortCommand):
            outputs = self.engine.abort_request([command.request_id])
            report.aborts.append((command.request_id, [self.encoder.encode(o) for o in outputs]))
        elif isinstance(command, ShutdownCommand):
            ids = list(self.engine.output_processor.parents)
            for rid in ids:
                report.aborts.append((rid, [self.encoder.encode(o) for o in self.engine.abort_request([rid])]))
            self.stopping = True
