"""The Gloo KV connector: a producer keeps a finished prefill's blocks until a consumer
pulls them; a consumer pulls a request's prompt KV on a background thread, then the
request joins the batch with every prompt token but the last already computed.

State lives on the step thread; the transport threads (gloo_pipe.py) only append to
the locked hand-off lists and set the event that ends :meth:`wait_for_work`.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import threading
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any, Optional

import torch

from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.request import Request, RequestStatus
from inflight.distributed.kv_transfer.base import BlockLoad, BlockSave, KVConnectorBase, KVConnectorMetadata
from inflight.distributed.kv_transfer.blocks import BlockCopier
from inflight.distributed.kv_transfer.config import KVTransferConfig
from inflight.distributed.kv_transfer.gloo_pipe import (ST_MISMATCH, ST_OK, ST_UNKNOWN, KVProducerServer,
                                                         KVPullClient, PullRequest, PullResult)

logger = logging.getLogger(__name__)


def prompt_digest(token_ids: list[int]) -> str:
    """Names a prompt across instances: a pull is served only for the same tokens."""
    return hashlib.sha256(array("q", token_ids).tobytes()).hexdigest()


def request_kv_params(request: Request) -> dict[str, Any]:
    """The request's ``kv_transfer_params`` (vLLM carries them in ``extra_args``)."""
    extra = getattr(request.sampling_params, "extra_args", None) or {}
    return extra.get("kv_transfer_params") or {}


def check_remote_params(params: dict) -> None:
    """The producer address and request id of a pull come from the client: ValueError naming the
    field unless the host is a short string, the port a TCP port and the id a short string."""
    host, port, rid = params["remote_host"], params["remote_port"], params["remote_request_id"]
    if not isinstance(host, str) or not 0 < len(host) <= 255:
        raise ValueError("kv_transfer_params.remote_host must be a host name or address of 1 to 255 characters")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"kv_transfer_params.remote_port must be an integer in [1, 65535], got {str(port)[:50]!r}")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or len(str(rid)) > 256:
        raise ValueError("kv_transfer_params.remote_request_id must be a string of at most 256 characters")


@dataclass
class _Remote:
    """A consumer's request whose prompt KV is being pulled."""

    request: Request
    job: Any
    started: float
    num_tokens: int  # prompt tokens the pull moves
    result: Optional[PullResult] = None


@dataclass
class _Held:
    request: Request
    deadline: float


class GlooConnector(KVConnectorBase):
    """:class:`KVConnectorBase` over torch.distributed gloo pairs (gloo_pipe.py)."""

    def __init__(self, config: KVTransferConfig, kv: KVCacheManager, kv_caches: list,
                 device: torch.device) -> None:
        self.config, self.kv, self.block_size = config, kv, kv.block_size
        self.copier = BlockCopier(kv_caches, device)
        self.engine_id = config.engine_id or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.held: dict[str, _Held] = {}  # producer: finished prefills waiting for their pull
        self._pulls: list[tuple[PullRequest, concurrent.futures.Future]] = []  # under _lock
        self._releases: list[str] = []  # under _lock
        self._saved: list[Request] = []  # gathered this step: their blocks go back now
        self.remote: dict[str, _Remote] = {}  # consumer: pulls in flight (under _lock)
        self._arrived: list[str] = []  # under _lock
        self.staged: dict[str, PullResult] = {}  # arrived, waiting for admission
        self._loads: list[BlockLoad] = []
        self.counters = {"kv_transfer_pulls": 0, "kv_transfer_failures": 0, "kv_transfer_tokens": 0,
                         "kv_transfer_seconds": 0.0, "kv_transfer_blocks_sent": 0}
        self.server = None
        if config.is_producer:
            self.server = KVProducerServer(config.kv_ip, config.kv_port, self._on_pull, self._on_release,
                                           config.transfer_timeout_s)
            logger.info("KV producer %s serving pulls on %s:%d", self.engine_id, config.kv_ip, self.server.port)
        self.client = KVPullClient(config.transfer_timeout_s) if config.is_consumer else None

    # --------------------------------------------------- transport callbacks
    def _on_pull(self, pull: PullRequest) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._pulls.append((pull, future))
        self._signal()
        return future

    def _on_release(self, request_id: str) -> None:
        with self._lock:
            self._releases.append(request_id)
        self._signal()

    def _on_pulled(self, request_id: str, result: PullResult) -> None:
        with self._lock:
            remote = self.remote.get(request_id)
            if remote is None:
                return  # aborted meanwhile
            remote.result = result
            self._arrived.append(request_id)
        self._signal()

    def _signal(self) -> None:
        self._event.set()
        if self.on_work is not None:
            self.on_work()

    # ------------------------------------------------------------- producer
    def request_finished(self, request: Request) -> bool:
        self.staged.pop(request.request_id, None)
        done = request.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
        if self.server is None or not done or not request_kv_params(request).get("do_remote_decode"):
            return False
        self.held[request.request_id] = _Held(request, time.monotonic() + self.config.abort_timeout_s)
        return True

    def kv_transfer_params(self, request_id: Any) -> Optional[dict[str, Any]]:
        if self.server is None:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_host": self.config.kv_ip, "remote_port": self.server.port,
                "remote_request_id": request_id}

    def _free_held(self, request_id: str) -> None:
        held = self.held.pop(request_id, None)
        if held is not None:
            self.kv.free(held.request)

    def _serve_pulls(self, meta: KVConnectorMetadata) -> None:
        with self._lock:
            pulls, self._pulls = self._pulls, []
            releases, self._releases = self._releases, []
        for rid in releases:
            self._free_held(rid)
        now = time.monotonic()
        for rid in [rid for rid, h in self.held.items() if h.deadline < now]:
            logger.warning("KV of request %s was never pulled: freeing its blocks", rid)
            self._free_held(rid)
        for pull, reply in pulls:
            held = self.held.pop(pull.request_id, None)
            if held is None:
                reply.set_result((ST_UNKNOWN, None, 0))
                continue
            req = held.request
            if (pull.prompt_digest != prompt_digest(req.prompt_token_ids) or pull.block_size != self.block_size
                    or pull.block_bytes != self.copier.block_bytes):
                logger.warning("KV pull of %s does not match its prompt or KV layout", pull.request_id)
                reply.set_result((ST_MISMATCH, None, 0))
                self.kv.free(req)
                continue
            end = self.kv.blocks_needed(req.num_prompt_tokens - 1)
            ids = self.kv.get_block_ids(req.request_id)[pull.start_block:end]
            meta.saves.append(BlockSave(req.request_id, ids, reply))
            self._saved.append(req)

    # ------------------------------------------------------------- consumer
    def add_remote_request(self, request: Request) -> bool:
        params = request_kv_params(request)
        if self.client is None or not params.get("do_remote_prefill"):
            return False
        missing = [k for k in ("remote_host", "remote_port", "remote_request_id") if params.get(k) is None]
        if missing:
            raise ValueError(f"kv_transfer_params with do_remote_prefill needs {', '.join(missing)}")
        check_remote_params(params)
        end = self.kv.blocks_needed(request.num_prompt_tokens - 1)
        start = self.kv.peek_cached_blocks(request)  # blocks this instance has already
        if start >= end or request.sampling_params.prompt_logprobs is not None:
            return False  # nothing worth pulling: the scheduler takes it as it is
        pull = PullRequest(str(params["remote_request_id"]), prompt_digest(request.prompt_token_ids), start,
                           request.num_prompt_tokens, self.block_size, self.copier.block_bytes)
        rid = request.request_id
        with self._lock:
            remote = self.remote[rid] = _Remote(request, None, time.monotonic(),
                                                request.num_prompt_tokens - 1 - start * self.block_size)
        try:
            remote.job = self.client.pull(params["remote_host"], params["remote_port"], pull,
                                          lambda result: self._on_pulled(rid, result))
        except ValueError:
            with self._lock:
                self.remote.pop(rid, None)
            raise
        return True

    def take_ready_requests(self) -> list[Request]:
        with self._lock:
            arrived, self._arrived = self._arrived, []
            ready = [r for r in (self.remote.pop(rid, None) for rid in arrived) if r is not None]
        out = []
        for remote in ready:
            req, result = remote.request, remote.result
            want = self.kv.blocks_needed(req.num_prompt_tokens - 1) - result.start_block
            if result.status == ST_OK and result.num_blocks == want:
                self.staged[req.request_id] = result
                self.counters["kv_transfer_pulls"] += 1
                self.counters["kv_transfer_tokens"] += remote.num_tokens
                self.counters["kv_transfer_seconds"] += time.monotonic() - remote.started
            else:
                self.counters["kv_transfer_failures"] += 1
                logger.warning("could not pull the KV of %s (%s): computing its prompt here", req.request_id,
                               result.error or f"{result.num_blocks} blocks, {want} expected")
            out.append(req)
        return out

    def abort(self, request_ids: list[str]) -> None:
        with self._lock:
            for rid in request_ids:
                remote = self.remote.pop(rid, None)
                if remote is not None and remote.job is not None:
                    remote.job.cancelled = True  # not sent yet: the producer gets a release instead
                self.staged.pop(rid, None)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        staged = self.staged.get(request.request_id)
        if staged is None:
            return 0
        if (request.num_output_tokens or request.needs_prompt_logprobs or num_computed_tokens % self.block_size
                or num_computed_tokens // self.block_size < staged.start_block):
            # e.g. the local blocks the pull skipped were evicted since: the prompt is computed here
            del self.staged[request.request_id]
            return 0
        return max(request.num_prompt_tokens - 1 - num_computed_tokens, 0)

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        staged = self.staged.pop(request.request_id, None)
        if staged is None or num_external_tokens <= 0:
            return
        first = num_computed_tokens // self.block_size
        end = self.kv.blocks_needed(num_computed_tokens + num_external_tokens)
        self._loads.append(BlockLoad(request.request_id, staged.buffer, first - staged.start_block,
                                     block_ids[first:end]))

    # ---------------------------------------------------------------- engine
    def build_connector_meta(self) -> KVConnectorMetadata:
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        if self.server is not None:
            self._serve_pulls(meta)
        return meta

    def apply(self, meta: KVConnectorMetadata) -> None:
        for load in meta.loads:
            self.copier.scatter(load.buffer, load.first, load.block_ids)
        for save in meta.saves:
            try:
                buffer = self.copier.gather(save.block_ids)
            except Exception as e:  # the consumer computes the prompt itself; this engine goes on
                save.reply.set_exception(e)
                continue
            save.reply.set_result((ST_OK, buffer, len(save.block_ids)))
            self.counters["kv_transfer_blocks_sent"] += len(save.block_ids)
        for req in self._saved:  # their KV is in the send buffers now
            self.kv.free(req)
        self._saved = []

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self.remote or self._arrived or self._pulls or self._releases or self.held)

    def wait_for_work(self, timeout_s: float) -> None:
        self._event.wait(timeout_s)
        self._event.clear()

    def wake(self) -> None:
        self._event.set()

    def stats(self) -> dict[str, float]:
        return {**self.counters, "kv_transfer_held_requests": len(self.held),
                "kv_transfer_in_flight": len(self.remote)}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
