"""``POST /v1/completions``: one engine request per prompt, streamed or not."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inflight.engine.async_engine import RequestStream
from inflight.entrypoints.openai.errors import bad_request
from inflight.entrypoints.openai.kv_transfer import add_kv_transfer_params, check_kv_transfer
from inflight.entrypoints.openai.protocol import CompletionRequest
from inflight.entrypoints.openai.responses import (CompletionChoice, CompletionLogProbs, CompletionResponse,
                                                   CompletionResponseChoice, CompletionStreamResponse,
                                                   PromptTokenLogprob, UsageInfo, dump, random_id)
from inflight.entrypoints.openai.serving_beam import beam_search
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        merge_streams, safe_logprob, unless_disconnected, usage_of)
from inflight.entrypoints.openai.sse import SSE_DONE, sse_model, stream_response
from inflight.entrypoints.openai.validation import check_token_prompt
from inflight.errors import InvalidRequestError
from inflight.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput


@dataclass
class _Cursor:
    """How much of one choice a stream has already sent."""

    text_sent: int = 0  # characters of the choice's generated text
    tokens_sent: int = 0
    chars_sent: int = 0  # characters sent, echoed prompt included (for text_offset)
    started: bool = False
    done: bool = False


class CompletionHandler:
    """Serves completions against the shared server state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        """Validate, add every prompt to the engine, then answer (SSE or JSON)."""
        state = self.state
        raw_prompts = req.prompts()
        params = state.admit(req, len(raw_prompts))
        check_kv_transfer(req, len(raw_prompts))
        prompts = [await self._engine_prompt(p, req) for p in raw_prompts]
        request_id, created = random_id("cmpl"), int(time.time())
        if req.use_beam_search:
            outputs = await unless_disconnected(raw, beam_search(state, request_id, prompts, params, req))
        else:
            streams = await add_requests(state, request_id, prompts, params, req.priority, req.cache_salt,
                                         req.structured_outputs_field(), model=req.model)
            if req.stream:
                return stream_response(streams, self._events(req, request_id, created, streams))
            outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=CLIENT_CLOSED)
        if req.echo_only:
            outputs = [without_generation(o) for o in outputs]
        choices = [self._choice(req, i * req.n + c.index, out, c) for i, out in enumerate(outputs)
                   for c in out.outputs]
        body = CompletionResponse(id=request_id, created=created, model=state.answer_model(req.model), choices=choices,
                                  usage=usage_of(outputs))
        return JSONResponse(add_kv_transfer_params(state, req, request_id, outputs, dump(body)))

    async def _engine_prompt(self, prompt: Union[str, list[int]], req: CompletionRequest) -> dict[str, Any]:
        """Text and token ids, tokenized here (on the tokenizer pool) rather than on the step
        thread; cut to ``truncate_prompt_tokens`` when set."""
        state = self.state
        if isinstance(prompt, str):
            ids = await state.tokenize(prompt, req.add_special_tokens)
            text: Optional[str] = prompt
        else:
            ids, text = prompt, None
        engine_prompt = state.truncated({"prompt": text, "prompt_token_ids": ids}, req)
        try:
            check_token_prompt(engine_prompt["prompt_token_ids"], state.max_model_len, state.vocab_size)
        except InvalidRequestError as e:
            raise bad_request(str(e), "prompt") from None
        return engine_prompt

    def _prompt_text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        return self.state.tokenizer.decode(out.prompt_token_ids)

    def _choice(self, req: CompletionRequest, index: int, out: RequestOutput,
                c: CompletionOutput) -> CompletionResponseChoice:
        prefix = self._prompt_text(out) if req.echo else ""
        logprobs = None
        if req.logprobs is not None:
            echo_ids = out.prompt_token_ids if req.echo else []
            logprobs = self._logprobs(echo_ids, _echo_entries(echo_ids, out.prompt_logprobs),
                                      c.token_ids, c.logprobs or [], 0, req.return_tokens_as_token_ids)
        plp = prompt_logprobs_field(out.prompt_logprobs) if req.prompt_logprobs is not None else None
        ids = req.return_token_ids
        return CompletionResponseChoice(index=index, text=prefix + c.text, logprobs=logprobs,
                                        finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                        prompt_logprobs=plp, prompt_token_ids=out.prompt_token_ids if ids else None,
                                        token_ids=list(c.token_ids) if ids else None)

    def _logprobs(self, echo_ids: list[int], echo_logprobs: PromptLogprobs, token_ids: list[int],
                  logprobs: list[dict[int, Logprob]], offset: int, as_ids: bool = False) -> CompletionLogProbs:
        """Legacy logprobs: the echoed prompt's (None for its first token, which
        nothing predicts), then the generated tokens'. ``as_ids`` (vLLM's
        return_tokens_as_token_ids) names tokens "token_id:N"; offsets stay the text's."""
        result = CompletionLogProbs()
        decode = self.state.tokenizer.decode

        def text_of(tok: int, lp: Optional[Logprob] = None) -> str:
            return lp.decoded_token if lp is not None and lp.decoded_token is not None else decode([tok])

        def shown(tok: int, text: str) -> str:
            return f"token_id:{tok}" if as_ids else text

        for tok, entry in zip(list(echo_ids) + list(token_ids), list(echo_logprobs) + list(logprobs)):
            if entry is None:
                text = text_of(tok)
                result.tokens.append(shown(tok, text))
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                result.text_offset.append(offset)
                offset += len(text)
                continue
            sampled = entry.get(tok) or next(iter(entry.values()))
            text = text_of(tok, sampled)
            result.tokens.append(shown(tok, text))
            result.token_logprobs.append(safe_logprob(sampled.logprob))
            top: dict[str, float] = {}
            for t, lp in entry.items():
                key = shown(t, text_of(t, lp))
                top[key] = max(top.get(key, -9999.0), safe_logprob(lp.logprob))
            result.top_logprobs.append(top)
            result.text_offset.append(offset)
            offset += len(text)
        return result

    async def _events(self, req: CompletionRequest, request_id: str, created: int,
                      streams: list[RequestStream]) -> AsyncIterator[str]:
        """One SSE chunk per step in which a choice produced text (with the counts so far
        under continuous_usage_stats), its final chunk carrying finish_reason, then usage
        if asked, then [DONE]."""
        cursors: dict[int, _Cursor] = {}
        finals: dict[int, RequestOutput] = {}
        model = self.state.answer_model(req.model)
        async for i, out in merge_streams(streams):
            if req.echo_only:
                out = without_generation(out)
            for c in out.outputs:
                index = i * req.n + c.index
                choice = self._delta(req, index, out, c, cursors.setdefault(index, _Cursor()))
                if choice is not None:
                    usage = UsageInfo.of(len(out.prompt_token_ids), len(c.token_ids), out.num_cached_tokens) \
                        if req.continuous_usage else None
                    chunk = CompletionStreamResponse(id=request_id, created=created, model=model,
                                                     choices=[choice], usage=usage)
                    yield sse_model(chunk)
            if out.finished:
                finals[i] = out
        if req.include_usage or self.state.force_include_usage:
            usage = usage_of([finals[i] for i in sorted(finals)])
            chunk = CompletionStreamResponse(id=request_id, created=created, model=model,
                                             choices=[], usage=usage)
            yield sse_model(chunk)
        yield SSE_DONE

    def _delta(self, req: CompletionRequest, index: int, out: RequestOutput, c: CompletionOutput,
               cur: _Cursor) -> Optional[CompletionChoice]:
        """The unsent part of a choice, from its cumulative text and tokens.

        NOTE: cumulative fields, not ``delta_*``: a sample not touched in a step
        (finished earlier, or preempted) still carries its old delta text.
        """
        if cur.done:
            return None
        text = c.text[cur.text_sent:]
        token_ids = c.token_ids[cur.tokens_sent:]
        prefix, echo_ids = "", []
        if req.echo and not cur.started:
            prefix, echo_ids = self._prompt_text(out), out.prompt_token_ids
        if not (text or prefix or c.finish_reason):
            return None  # tokens without text yet (partial UTF-8, held stop text): send with the next text
        logprobs: Any = None
        if req.logprobs is not None:
            logprobs = self._logprobs(echo_ids, _echo_entries(echo_ids, out.prompt_logprobs), token_ids,
                                      (c.logprobs or [])[cur.tokens_sent:], cur.chars_sent,
                                      req.return_tokens_as_token_ids)
        cur.text_sent, cur.tokens_sent = len(c.text), len(c.token_ids)
        cur.chars_sent += len(prefix) + len(text)
        first, cur.started, cur.done = not cur.started, True, c.finish_reason is not None
        ids = req.return_token_ids
        return CompletionChoice(index=index, text=prefix + text, logprobs=logprobs,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                prompt_token_ids=out.prompt_token_ids if ids and first else None,
                                token_ids=list(token_ids) if ids else None)


def _echo_entries(echo_ids: list[int], prompt_logprobs: PromptLogprobs | None) -> PromptLogprobs:
    """The echoed tokens' logprob entries; None each where the engine has none."""
    if not echo_ids:
        return []
    return list(prompt_logprobs) if prompt_logprobs is not None else [None] * len(echo_ids)


def prompt_logprobs_field(prompt_logprobs: PromptLogprobs | None) -> list | None:
    """vLLM's ``prompt_logprobs`` response field: None for the first token, then
    token id -> {logprob, rank, decoded_token}."""
    if prompt_logprobs is None:
        return None
    return [None if entry is None else
            {tok: PromptTokenLogprob(logprob=safe_logprob(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
             for tok, lp in entry.items()} for entry in prompt_logprobs]


def without_generation(out: RequestOutput) -> RequestOutput:
    """``echo`` with ``max_tokens=0``: the one token the engine ran is not the client's."""
    comps = [replace(c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None,
                     cumulative_logprob=0.0 if c.cumulative_logprob is not None else None,
                     delta_text="", delta_token_ids=[], delta_logprobs=None) for c in out.outputs]
    return replace(out, outputs=comps)
