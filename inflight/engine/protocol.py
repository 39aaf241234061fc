"""``EngineClient`` (vLLM's name): the front the OpenAI server talks to, whether one
engine on a step thread (``AsyncLLMEngine``) or data-parallel replicas (``DPEngineClient``).
Each queues a request and hands back its output stream; ``generate`` on top of that is
the same for both."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, AsyncIterator, Optional

from inflight.engine.async_stream import RequestStream
from inflight.lora.request import LoRARequest
from inflight.outputs import RequestOutput
from inflight.sampling_params import SamplingParams


class EngineClient(ABC):
    """Queues requests and streams their outputs to an asyncio caller."""

    @abstractmethod
    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams, priority: int = 0,
                          arrival_time: Optional[float] = None, cache_salt: Optional[str] = None,
                          lora_request: Optional[LoRARequest] = None) -> RequestStream:
        """Queue a request; return its output stream once the engine accepted it (ValueError if not)."""

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str, priority: int = 0,
                       arrival_time: Optional[float] = None,
                       cache_salt: Optional[str] = None,
                       lora_request: Optional[LoRARequest] = None) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs until it finishes; leaving early aborts it."""
        stream = await self.add_request(request_id, prompt, params, priority, arrival_time, cache_salt, lora_request)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()
