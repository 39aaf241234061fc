"""What the completion and chat handlers share: server state, admission checks,
adding requests to the engine and disconnect handling (their Server-Sent Events: sse.py)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, fields, replace
from typing import Any, AsyncIterator, Awaitable, Optional, TypeVar

from fastapi import Request

from inflight.engine.async_engine import AsyncLLMEngine, RequestStream
from inflight.errors import InvalidRequestError
from inflight.entrypoints.openai.chat_render import ChatRenderer, TokenizerPool
from inflight.entrypoints.openai.errors import OpenAIError, bad_request, engine_error, param_of
from inflight.entrypoints.openai.http_options import log_request
from inflight.entrypoints.openai.limits import ServerLimits, clip
from inflight.entrypoints.openai.responses import UsageInfo
from inflight.entrypoints.openai.serving_lora import LoRAModels
from inflight.entrypoints.openai.validation import check_beam_search, check_server_limits, check_truncation, truncated
from inflight.metrics import EngineMetrics
from inflight.outputs import RequestOutput
from inflight.pooling.config import PoolerConfig
from inflight.pooling.truncation import cut_length, text_ids
from inflight.reasoning import get_reasoning_parser
from inflight.sampling_params import SamplingParams

# what an engine-side check may name first in its message (kv_transfer_params: disaggregation)
REQUEST_FIELDS = frozenset(f.name for f in fields(SamplingParams)) | {"kv_transfer_params"}

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class ServerState:
    """Everything a handler needs; stored on ``app.state.server``."""

    engine: AsyncLLMEngine
    tokenizer: Any
    model_name: str
    max_model_len: int
    metrics: EngineMetrics
    model_root: Optional[str] = None
    api_key: Optional[str] = None
    max_waiting_requests: Optional[int] = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    vocab_size: Optional[int] = None
    # the model's recommended sampling defaults (--generation-config), as SamplingParams keywords
    default_sampling: dict[str, Any] = field(default_factory=dict)
    model_aliases: list[str] = field(default_factory=list)  # more --served-model-name names clients may ask for
    max_logprobs: int = 20  # the engine's --max-logprobs
    force_include_usage: bool = False  # vLLM's --enable-force-include-usage: every stream ends with usage
    response_role: str = "assistant"  # vLLM's --response-role
    log_requests: bool = False  # vLLM's --enable-log-requests, prompts cut to max_log_len
    max_log_len: Optional[int] = None
    lora: LoRAModels = field(default_factory=LoRAModels)  # adapters clients name as models (--lora-modules)
    # a pooling model's pooler (--runner pooling): it serves /v1/embeddings and nothing that generates
    pooler_config: Optional[PoolerConfig] = None
    hidden_size: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()  # the engine's (a beam that reaches one finishes)
    # the most tokens one request can reach in the engine's KV pool (None: max_model_len)
    max_sequence_tokens: Optional[int] = None
    # Requests admitted whose adds are not yet queued: counted against max_waiting_requests.
    reserved: int = 0

    def __post_init__(self) -> None:
        self.renderer = ChatRenderer(self.tokenizer, self.limits.chat_template,
                                     self.limits.allow_special_tokens_in_content)
        self.pool = TokenizerPool(self.limits.tokenizer_timeout_s)
        name = self.limits.reasoning_parser
        self.reasoning = get_reasoning_parser(name) if name else None
        # <think> and </think> ids: structured output starts after the thinking only where each is one token
        self.reasoning_tags = self.reasoning.tag_token_ids(self.tokenizer) if self.reasoning else None
        if self.reasoning and self.reasoning_tags is None:
            logger.warning("--reasoning-parser %s: <think> and </think> are not single tokens of this tokenizer; "
                           "structured output will constrain the thinking too", name)

    def check_model(self, name: Optional[str]) -> None:
        """404 for a model this server does not serve (an absent name means ours)."""
        if name is not None and name != self.model_name and name not in self.model_aliases and name not in self.lora:
            raise OpenAIError(404, f"The model `{clip(name)}` does not exist. This server serves "
                                   f"`{self.model_name}`.", param="model", code="model_not_found")

    def answer_model(self, name: Optional[str]) -> str:
        """The model name an answer reports: the one asked for, where it is one of ours (vLLM's)."""
        return name if name is not None and (name in self.model_aliases or name in self.lora) else self.model_name

    def admit(self, req: Any, num_prompts: int = 1) -> SamplingParams:
        """Checks every request shares (model name, limits, capacity) and returns its
        SamplingParams; invalid values become a 400 naming the field."""
        self.check_model(req.model)
        if self.pooler_config is not None:
            raise OpenAIError(404, f"The model `{self.model_name}` is a pooling model (--runner pooling): it serves "
                                   "/v1/embeddings, not text generation.", param="model", code="model_not_supported")
        try:
            params = req.to_sampling_params(self.default_sampling)
            check_server_limits(req, params, self.limits.max_n, self.vocab_size, self.max_logprobs)
            if getattr(req, "use_beam_search", False):
                check_beam_search(req, params, self.max_logprobs)
            check_truncation(req.truncate_prompt_tokens, self.max_model_len)
        except InvalidRequestError as e:
            raise bad_request(str(e), param_of(str(e), type(req).model_fields)) from None
        self.check_capacity(num_prompts * params.n)
        return params

    def fit_default_max_tokens(self, req: Any, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """A chat request that set no max_tokens gets the generation config's, cut to the
        context the prompt leaves (the engine fills in the rest of the context without one)
        and to what the KV pool can hold with the prompt."""
        if req.requested_max_tokens is not None:
            return params
        longest = self.max_sequence_tokens or self.max_model_len  # never more than max_model_len
        room = max(1, longest - num_prompt_tokens)
        if params.max_tokens is None:  # the engine's own default is the context: right where the pool holds it
            return params if longest == self.max_model_len else replace(params, max_tokens=room)
        return replace(params, max_tokens=min(params.max_tokens, room))

    def truncated(self, prompt: dict[str, Any], req: Any) -> dict[str, Any]:
        """``prompt`` cut to the request's ``truncate_prompt_tokens`` on its ``truncation_side``;
        by default the side vLLM's tokenizer cuts: the left for a generating model (the prompt's
        end leads to the answer), the right for a pooling model (a BERT's [CLS] and a pair's
        query come first)."""
        side = req.truncation_side or ("left" if self.pooler_config is None else "right")
        return truncated(prompt, req.truncate_prompt_tokens, self.max_model_len, side)

    async def render_chat(self, req: Any, template_kwargs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """The engine prompt of ``req.messages`` (with the request's ``add_generation_prompt``
        and ``continue_final_message``), rendered and tokenized on the tokenizer pool."""
        try:
            dicts = [m.template_dict() for m in req.messages]
            return await self.pool.run(self.renderer.render, dicts, req.add_generation_prompt, template_kwargs,
                                       req.continue_final_message)
        except InvalidRequestError as e:
            raise bad_request(str(e), "messages") from None

    async def tokenize(self, text: str, add_special_tokens: bool = True, req: Any = None) -> list[int]:
        """Token ids of ``text`` (special-token text parsed: the prompt is the client's own), off the
        loop; a pooling model's cut by the tokenizer as ``req`` asks (``cut_by_tokenizer``)."""
        cut = None if req is None else self.cut_by_tokenizer(req)
        return await self.pool.run(text_ids, self.tokenizer, text, add_special_tokens, cut)

    def cut_by_tokenizer(self, req: Any) -> Optional[int]:
        """The ids the tokenizer keeps of a pooling model's text for ``req``'s ``truncate_prompt_tokens``
        (pooling/truncation.py); None where it cuts nothing, or ``truncation_side`` asks for a slice."""
        if self.pooler_config is None or req.truncation_side is not None:
            return None
        return cut_length(req.truncate_prompt_tokens, self.max_model_len)

    def check_capacity(self, new: int = 1) -> None:
        """503 + Retry-After while the waiting queue has no room for ``new`` more
        requests (a batch counts whole) or the engine is down."""
        if not self.engine.is_alive:
            raise OpenAIError(503, "the inference engine is not running", code="engine_unavailable",
                              headers={"Retry-After": "5"})
        if not self.engine.accepting:
            raise OpenAIError(503, "the server is shutting down", code="shutting_down",
                              headers={"Retry-After": "5"})
        limit = self.max_waiting_requests
        if limit is None:
            return
        if 0 < limit < new:
            raise bad_request(f"this request adds {new} requests (prompts x n), more than the server lets wait "
                              f"(--max-waiting-requests {limit})", "n")
        if self.engine.num_waiting_total + self.reserved + new > limit:
            raise OpenAIError(503, f"the server is overloaded: {limit} requests are already waiting",
                              code="server_overloaded", headers={"Retry-After": "1"})


async def add_requests(state: ServerState, base_id: str, prompts: list[Any], params: SamplingParams,
                       priority: int, cache_salt: Optional[str] = None,
                       grammar_field: str = "structured_outputs", model: Optional[str] = None) -> list[RequestStream]:
    """Add one engine request per prompt, all in the same step; all or none.

    Capacity is checked and reserved here, with no await in between, so concurrent
    batches cannot all pass the check. Raises OpenAIError (400 for input the engine
    rejects: its add_request raises ValueError only for that; a constraint that does
    not compile names ``grammar_field``, the field that set it). ``model``: the name the
    client asked for; an adapter's name runs the prompts with that LoRA adapter."""
    if getattr(params, "structured_outputs", None) is not None:
        await compile_grammar(state, params, grammar_field)
    new = len(prompts) * getattr(params, "n", 1)
    state.check_capacity(new)
    if state.log_requests:
        log_request(base_id, prompts, params, state.max_log_len)
    state.reserved += new
    ids = [base_id if len(prompts) == 1 else f"{base_id}-{i}" for i in range(len(prompts))]
    try:
        return await add_engine_requests(state, ids, prompts, params, priority, cache_salt, model)
    finally:
        state.reserved -= new


async def add_engine_requests(state: ServerState, ids: list[str], prompts: list[Any], params: Any, priority: int,
                              cache_salt: Optional[str] = None, model: Optional[str] = None) -> list[RequestStream]:
    """Add one engine request per prompt under ``ids``, all in the same step; all or none.
    No capacity check: the caller's (add_requests, or a beam search admitted whole)."""
    kw = {"lora_request": lora} if (lora := state.lora.get(model)) is not None else {}
    results = await asyncio.gather(*(state.engine.add_request(rid, p, params, priority, cache_salt=cache_salt, **kw)
                                     for rid, p in zip(ids, prompts)), return_exceptions=True)
    streams = [r for r in results if isinstance(r, RequestStream)]
    errors = [r for r in results if not isinstance(r, RequestStream)]
    if errors:
        for s in streams:
            s.close()
        if isinstance(errors[0], ValueError):  # a check against the prompt: its length, or min_tokens past what is left
            message = clip(str(errors[0]), 500)
            raise bad_request(message, param_of(message, REQUEST_FIELDS) or "prompt") from None
        raise engine_error(errors[0])
    return streams


async def compile_grammar(state: ServerState, params: SamplingParams, field: str = "structured_outputs") -> None:
    """Compile the request's structured-output grammar on the engine's compile thread
    (cached by constraint), so the step thread finds it ready; 400 naming ``field``
    (the request field that set the constraint) and the problem."""
    manager = getattr(getattr(state.engine, "engine", None), "structured_output", None)
    if manager is None:
        raise bad_request(f"{field}: structured output is not supported by this engine", field)
    try:
        await manager.compile_async(params.structured_outputs)
    except InvalidRequestError as e:
        raise bad_request(clip(f"{field}: {e}", 500), field) from None


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several request streams as outputs arrive: yields (stream index, output)."""
    if len(streams) == 1:
        # NOTE: the common case (one prompt, n=1) reads its queue directly: a task and an
        # asyncio.wait per token cost more than the rest of the chunk's serving. A cancelled
        # read still aborts the request (RequestStream.__anext__ closes the stream).
        async for out in streams[0]:
            yield 0, out
        return
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    out = task.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for task in pending:
            task.cancel()  # a cancelled __anext__ closes (aborts) its stream
        for s in streams:
            s.close()


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    """Wait for every stream's finished output, in prompt order."""
    last: dict[int, RequestOutput] = {}
    async for i, out in merge_streams(streams):
        last[i] = out
    return [last[i] for i in range(len(streams))]


async def _wait_for_disconnect(request: Request) -> None:
    # The body was already read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# nginx's status for a client that left before the answer (unless_disconnected returned None)
CLIENT_CLOSED = 499


async def unless_disconnected(request: Request, work: Awaitable[T]) -> Optional[T]:
    """Run ``work``; if the client goes away first, cancel it (aborting its
    requests through their streams) and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    # NOTE: a task cancelled just now is not done yet (it ends at its next await): asking
    # for its result would raise InvalidStateError, and the gone client would "get" a 500.
    if not task.done() or task.cancelled():
        logger.info("client disconnected; request aborted")
        return None
    return task.result()


def usage_of(outputs: list[RequestOutput]) -> UsageInfo:
    """Usage of finished outputs: prompts counted once each, every sample's tokens."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return UsageInfo.of(prompt, completion, cached)


def safe_logprob(value: float) -> float:
    """JSON has no -inf: clamp as vLLM does."""
    return max(value, -9999.0)
