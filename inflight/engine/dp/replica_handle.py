"""The server's end of one replica: its process, the pipe, and the two threads that
move messages so the event loop never blocks on a pipe."""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable, Optional

from inflight.engine.dp.replica import replica_main
from inflight.engine.dp.wire import ReplicaInfo, ShutdownCommand, StepReport

if TYPE_CHECKING:  # the platforms import torch; a replica process must not, before its placement applies
    from inflight.platforms.placement import ReplicaPlacement

logger = logging.getLogger(__name__)

_STOP = object()  # outbox marker: the writer thread ends


class ReplicaHandle:
    """The server's end of replica ``index``: ``send`` queues a command for it, and every
    report it sends is handed to ``on_report`` on the reader thread."""

    def __init__(self, index: int, conn: Any, process: Any) -> None:
        self.index = index
        self.conn = conn
        self.process = process  # multiprocessing.Process, or anything with its is_alive/join/terminate/exitcode
        self.info: Optional[ReplicaInfo] = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @classmethod
    def spawn(cls, index: int, ctx: Any, engine_kwargs: dict[str, Any],
              placement: "ReplicaPlacement") -> "ReplicaHandle":
        """Replica ``index`` in a process of this machine started by ``ctx`` (spawn)."""
        conn, child_conn = ctx.Pipe()
        # not daemonic: a replica may start tensor-parallel workers of its own; it still ends with the
        # server, whose exit closes the pipe the replica reads
        process = ctx.Process(target=replica_main, name=f"inflight-dp{index}", daemon=False,
                              args=(index, child_conn, engine_kwargs, asdict(placement)))
        process.start()
        child_conn.close()  # only the child holds its end: its death reads as EOF here
        return cls(index, conn, process)

    def wait_ready(self, timeout: float) -> ReplicaInfo:
        """Block until the engine is built; RuntimeError with its reason when it is not."""
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.2):
            if not self.process.is_alive():
                raise RuntimeError(f"engine replica {self.index} exited while starting "
                                   f"(exit code {self.process.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine replica {self.index} did not start within {timeout:.0f} s")
        try:
            message = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"engine replica {self.index} exited while starting") from None
        if not isinstance(message, ReplicaInfo):
            raise RuntimeError(f"engine replica {self.index} failed to start: {message}")
        self.info = message
        return message

    def start(self, on_report: Callable[[int, StepReport], None], on_exit: Callable[[int, str], None]) -> None:
        """Start the reader and writer threads."""
        if self._threads:
            return
        self._threads = [threading.Thread(target=self._read, args=(on_report, on_exit), daemon=True,
                                          name=f"inflight-dp{self.index}-reader"),
                         threading.Thread(target=self._write, daemon=True, name=f"inflight-dp{self.index}-writer")]
        for t in self._threads:
            t.start()

    def send(self, command: Any) -> None:
        """Queue a command (any thread; never blocks)."""
        self._outbox.put(command)

    def _read(self, on_report: Callable[[int, StepReport], None], on_exit: Callable[[int, str], None]) -> None:
        while True:
            try:
                report = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(1.0)
                on_exit(self.index, f"its process exited (exit code {self.process.exitcode})")
                return
            on_report(self.index, report)

    def _write(self) -> None:
        while True:
            command = self._outbox.get()
            if command is _STOP:
                return
            try:
                self.conn.send(command)
            except (BrokenPipeError, OSError):
                return  # the reader sees the EOF and reports the death

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the replica to exit (after aborting what it holds); kill it if it does not."""
        self.send(ShutdownCommand())
        self.send(_STOP)
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("engine replica %d did not exit in %.0f s; terminating it", self.index, timeout)
            self.process.terminate()
            self.process.join(5.0)

    def kill(self) -> None:
        """Terminate the process at once (start-up failure of another replica, tests)."""
        self.send(_STOP)
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(5.0)
