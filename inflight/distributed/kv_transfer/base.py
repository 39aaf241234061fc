"""The KV connector interface (after vLLM's ``KVConnectorBase_V1``), torch-free so the
scheduler can call it.

Scheduler side, on the step thread: when a request is admitted the scheduler asks
:meth:`get_num_new_matched_tokens` how many prompt tokens past its local prefix hits
are available from elsewhere, allocates blocks for them like computed tokens and
reports them with :meth:`update_state_after_alloc`; when a request finishes,
:meth:`request_finished` may keep its blocks (a producer holds them until pulled).
Engine side: :meth:`add_remote_request` takes a request whose KV comes from a
producer until it has arrived, :meth:`take_ready_requests` hands it to the
scheduler then. Worker side: :meth:`apply` loads and saves the step's blocks
(:meth:`build_connector_meta`) just before the forward pass.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from inflight.core.request import Request


@dataclass
class BlockLoad:
    """Copy blocks ``first`` .. of a staged buffer into ``block_ids`` of the pool."""

    request_id: str
    buffer: Any
    first: int
    block_ids: list[int]


@dataclass
class BlockSave:
    """Gather ``block_ids`` of a held request for a waiting pull (``reply`` gets the buffer)."""

    request_id: str
    block_ids: list[int]
    reply: Any


@dataclass
class KVConnectorMetadata:
    """The block copies of one step, built by the scheduler side, run by the worker side."""

    loads: list[BlockLoad] = field(default_factory=list)
    saves: list[BlockSave] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.loads or self.saves)


class KVConnectorBase(ABC):
    """Moves prompt KV between instances; see the module docstring for who calls what."""

    # Called from transfer threads when the step thread has work (the async engine wakes its
    # loop with it: a pull may arrive while the engine holds nothing).
    on_work: Optional[Callable[[], None]] = None

    # ---------------------------------------------------------- scheduler side
    @abstractmethod
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Prompt tokens past ``num_computed_tokens`` (the local prefix hit) whose KV the
        connector can load into the request's blocks before its next forward pass."""

    @abstractmethod
    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        """Blocks are allocated: load ``num_external_tokens`` tokens after the local hit into them."""

    @abstractmethod
    def request_finished(self, request: Request) -> bool:
        """A request left the scheduler; True means the connector frees its blocks later."""

    @abstractmethod
    def build_connector_meta(self) -> KVConnectorMetadata:
        """This step's loads and saves (called once per step, after scheduling)."""

    # ------------------------------------------------------------- engine side
    @abstractmethod
    def add_remote_request(self, request: Request) -> bool:
        """Take a request whose prompt KV lives on a producer; False: not such a request."""

    @abstractmethod
    def take_ready_requests(self) -> list[Request]:
        """Remote requests whose KV has arrived (or failed to: they compute the prompt)."""

    @abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Drop requests the connector still holds before the scheduler has them."""

    @abstractmethod
    def has_pending(self) -> bool:
        """Requests in flight or blocks held: the engine must keep stepping."""

    @abstractmethod
    def wait_for_work(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` until a transfer thread has something for the step thread."""

    def wake(self) -> None:
        """End a :meth:`wait_for_work` early (new commands arrived)."""

    def kv_transfer_params(self, request: Any) -> Optional[dict[str, Any]]:
        """What a producer returns to the client for a finished prefill, else None."""
        return None

    def stats(self) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------- worker side
    @abstractmethod
    def apply(self, meta: KVConnectorMetadata) -> None:
        """Run the step's loads (into the pool) and saves (out of it), before the forward pass."""
