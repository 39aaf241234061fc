"""The KV transport: torch.distributed point-to-point over gloo, one 2-rank group per
(producer, consumer) pair.

A producer hosts a ``TCPStore`` at its ``kv_ip:kv_port``. A consumer connects to it,
takes the next pair number from a counter in the store and announces itself; both
sides then build a 2-rank ``ProcessGroupGloo`` on a prefix of that store (the
producer rank 0). The groups are made directly, not with ``init_process_group``: any
number of them live side by side in one process, next to whatever default group
tensor parallelism set up.

On a pair, a consumer sends a pull (a fixed header, then its JSON) and the producer
answers with a status header and, when it has the request, every asked-for block of
every layer in one message. A consumer that no longer wants a request sends a release
instead, so the producer frees its blocks at once. Everything here runs on
background threads; the step threads only fill and read the buffers.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import json
import logging
import queue
import threading
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

logger = logging.getLogger(__name__)

OP_PULL, OP_RELEASE = 1, 2
ST_OK, ST_UNKNOWN, ST_MISMATCH, ST_ERROR = 0, 1, 2, 3
_HEADER = 4  # int64 words of every header
# An idle pair waits for its next pull indefinitely; a dead peer closes the socket instead.
_FOREVER = datetime.timedelta(days=365)
CONNECT_TIMEOUT_S = 10.0
# producer addresses one consumer pulls from at once (each a channel with its own thread)
MAX_PRODUCERS = 64


@dataclass
class PullRequest:
    """What a consumer asks of a producer: blocks ``start_block`` .. the one holding
    prompt token ``num_prompt_tokens - 2`` of request ``request_id`` (the last prompt
    token is computed by the consumer), whose prompt hashes to ``prompt_digest``."""

    request_id: str
    prompt_digest: str
    start_block: int
    num_prompt_tokens: int
    block_size: int
    block_bytes: int


@dataclass
class PullResult:
    """The answer to a pull: ``buffer`` holds ``num_blocks`` blocks from ``start_block``."""

    status: int
    start_block: int = 0
    num_blocks: int = 0
    buffer: Optional[torch.Tensor] = None
    error: str = ""


# The producer's answer, computed on its step thread: (status, blocks buffer or None, number of blocks).
Served = tuple[int, Optional[torch.Tensor], int]


def _header(*words: int) -> torch.Tensor:
    return torch.tensor(list(words) + [0] * (_HEADER - len(words)), dtype=torch.int64)


class KVProducerServer:
    """Serves pulls: ``serve(pull)`` returns a future the producer's step thread resolves
    with the blocks; ``release(request_id)`` frees a request nobody will pull."""

    def __init__(self, host: str, port: int, serve: Callable[[PullRequest], concurrent.futures.Future],
                 release: Callable[[str], None], timeout_s: float) -> None:
        self.store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        self.port = self.store.port
        self._host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._serve, self._release, self._timeout_s = serve, release, timeout_s
        self._closed = False
        threading.Thread(target=self._accept, name="kv-producer-accept", daemon=True).start()

    def close(self) -> None:
        self._closed = True

    def _client(self) -> TCPStore:
        # NOTE: one client connection per thread: a store's requests share its socket, so a
        # blocking wait on one would hold up every other thread's.
        return TCPStore(self._host, self.port, is_master=False, timeout=datetime.timedelta(seconds=self._timeout_s))

    def _accept(self) -> None:
        watcher = self._client()
        k = 0
        while not self._closed:
            try:  # NOTE: a long wait: a short one makes c10d log a warning each time it expires
                watcher.wait([f"consumer/{k}"], _FOREVER)
            except Exception:
                continue
            threading.Thread(target=self._pair, args=(k,), name=f"kv-producer-pair-{k}", daemon=True).start()
            k += 1

    def _pair(self, k: int) -> None:
        try:
            pg = ProcessGroupGloo(PrefixStore(f"pair/{k}", self._client()), 0, 2, _FOREVER)
            while not self._closed:
                self._answer(pg)
        except Exception as e:  # the consumer went away: its pair ends here
            logger.info("KV consumer %d disconnected (%s)", k, e)

    def _answer(self, pg: ProcessGroupGloo) -> None:
        header = torch.empty(_HEADER, dtype=torch.int64)
        pg.recv([header], 1, 0).wait()
        op, length = int(header[0]), int(header[1])
        payload = torch.empty(length, dtype=torch.uint8)
        pg.recv([payload], 1, 0).wait()
        pull = PullRequest(**json.loads(bytes(payload.tolist()).decode()))
        if op == OP_RELEASE:
            self._release(pull.request_id)
            return
        try:
            status, buffer, num_blocks = self._serve(pull).result(self._timeout_s)
        except Exception as e:
            logger.warning("KV pull of %s failed on the producer: %s", pull.request_id, e)
            status, buffer, num_blocks = ST_ERROR, None, 0
        nbytes = buffer.numel() if buffer is not None and status == ST_OK else 0
        pg.send([_header(status, num_blocks, nbytes)], 1, 0).wait()
        if nbytes:
            pg.send([buffer], 1, 0).wait()  # every block of every layer: one message


@dataclass
class _Job:
    op: int
    pull: PullRequest
    done: Callable[[PullResult], None]
    cancelled: bool = False


class _Channel:
    """One consumer's pair with one producer: a queue of pulls served in order by one thread."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.jobs: "queue.Queue[_Job]" = queue.Queue()
        self._pg: Optional[ProcessGroupGloo] = None
        self._store: Optional[TCPStore] = None
        self.failed = False  # the last exchange raised (a producer that is gone, or never was)
        threading.Thread(target=self._run, name=f"kv-consumer-{host}:{port}", daemon=True).start()

    def _connect(self) -> ProcessGroupGloo:
        if self._pg is None:
            timeout = datetime.timedelta(seconds=self.timeout_s)
            # a producer that is gone should fail the pull soon, not after the transfer timeout
            connect = datetime.timedelta(seconds=min(self.timeout_s, CONNECT_TIMEOUT_S))
            self._store = TCPStore(self.host, self.port, is_master=False, timeout=connect)
            k = self._store.add("num_consumers", 1) - 1
            self._store.set(f"consumer/{k}", b"1")
            self._pg = ProcessGroupGloo(PrefixStore(f"pair/{k}", self._store), 1, 2, timeout)
        return self._pg

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:  # None: the client dropped this channel
            op = OP_RELEASE if job.cancelled else job.op
            try:
                result = self._exchange(op, job.pull)
                self.failed = False
            except Exception as e:
                # the pair's state is unknown now (a late answer may still come): start a new one next time
                self._pg = self._store = None
                self.failed = True
                result = PullResult(ST_ERROR, error=f"{type(e).__name__}: {e}")
            if op == OP_PULL:
                job.done(result)

    def _exchange(self, op: int, pull: PullRequest) -> PullResult:
        pg = self._connect()
        payload = torch.tensor(list(json.dumps(asdict(pull)).encode()), dtype=torch.uint8)
        pg.send([_header(op, payload.numel())], 0, 0).wait()
        pg.send([payload], 0, 0).wait()
        if op == OP_RELEASE:
            return PullResult(ST_OK)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        header = torch.empty(_HEADER, dtype=torch.int64)
        pg.recv([header], 0, 0).wait(timeout)
        status, num_blocks, nbytes = (int(x) for x in header[:3])
        if status != ST_OK:
            return PullResult(status, error=f"the producer answered status {status}")
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            pg.recv([buffer], 0, 0).wait(timeout)
        return PullResult(ST_OK, pull.start_block, num_blocks, buffer)


class KVPullClient:
    """Pulls blocks from producers on background threads (one per producer address)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._channels: dict[tuple[str, int], _Channel] = {}
        self._lock = threading.Lock()

    def _channel(self, host: str, port: int) -> _Channel:
        with self._lock:
            ch = self._channels.get((host, port))
            if ch is None:
                # NOTE: the addresses come from requests: a channel (and its thread) per address
                # must not grow without bound, so idle ones whose producer failed make room
                if len(self._channels) >= MAX_PRODUCERS:
                    for key, old in list(self._channels.items()):
                        if old.failed and old.jobs.empty():
                            old.jobs.put(None)
                            del self._channels[key]
                if len(self._channels) >= MAX_PRODUCERS:
                    raise ValueError(f"kv_transfer_params.remote_host: this instance already pulls from "
                                     f"{MAX_PRODUCERS} producers")
                ch = self._channels[(host, port)] = _Channel(host, port, self.timeout_s)
            return ch

    def pull(self, host: str, port: int, pull: PullRequest, done: Callable[[PullResult], None]) -> _Job:
        """Queue a pull; ``done`` runs on the channel's thread. Cancelling the returned job
        before it is sent turns it into a release (``done`` is then never called)."""
        job = _Job(OP_PULL, pull, done)
        self._channel(host, port).jobs.put(job)
        return job
