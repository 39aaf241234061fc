"""``POST /v1/chat/completions``: messages through the model's chat template."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inflight.engine.async_engine import RequestStream
from inflight.entrypoints.openai.chat_reasoning import gate_grammar, split_thinking
from inflight.entrypoints.openai.errors import bad_request, param_of
from inflight.entrypoints.openai.kv_transfer import add_kv_transfer_params, check_kv_transfer
from inflight.entrypoints.openai.protocol import ChatCompletionRequest
from inflight.entrypoints.openai.responses import (ChatChoice, ChatCompletionChunk, ChatCompletionResponse,
                                                   ChatLogProbs, ChatResponseMessage, ChatStreamChoice,
                                                   DeltaMessage, TokenLogprob, TopLogprob, UsageInfo, dump,
                                                   random_id)
from inflight.entrypoints.openai.serving_beam import beam_search
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        merge_streams, safe_logprob, unless_disconnected, usage_of)
from inflight.entrypoints.openai.serving_completion import prompt_logprobs_field
from inflight.entrypoints.openai.sse import SSE_DONE, sse_model, stream_response
from inflight.entrypoints.openai.tool_calling import (ToolPlan, compile_tool_grammar, constrain, delta_messages,
                                                      finish_reason, message_fields, plan_tools,
                                                      render_chat_with_tools)
from inflight.entrypoints.openai.tool_parsers import ToolCallStream
from inflight.errors import InvalidRequestError
from inflight.outputs import CompletionOutput, Logprob, RequestOutput
from inflight.reasoning import ReasoningStream


@dataclass
class _Cursor:
    text_sent: int = 0
    tokens_sent: int = 0
    done: bool = False
    tools: Optional[ToolCallStream] = None  # parsing state of the choice's tool calls
    thinking: Optional[ReasoningStream] = None  # split state of its reasoning and content (--reasoning-parser)


class ChatHandler:
    """Serves chat completions against the shared server state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        state = self.state
        params = state.admit(req)
        check_kv_transfer(req, 1)
        try:
            plan = plan_tools(req, state.limits, state.renderer)
            params = constrain(params, plan)
            if req.use_beam_search and params.structured_outputs is not None:  # a required or named tool
                raise InvalidRequestError("tool_choice: a required or named tool is not supported with "
                                          "use_beam_search")
        except InvalidRequestError as e:
            raise bad_request(str(e), param_of(str(e), type(req).model_fields)) from None
        await compile_tool_grammar(state, params, plan)
        prompt = state.truncated(await render_chat_with_tools(state, req, plan), req)
        prompt_text = prompt["prompt"] if prompt["prompt"] is not None else \
            state.tokenizer.decode(prompt["prompt_token_ids"], skip_special_tokens=False)
        params = gate_grammar(state, state.fit_default_max_tokens(req, params, len(prompt["prompt_token_ids"])),
                              prompt_text)
        request_id, created = random_id("chatcmpl"), int(time.time())
        if req.use_beam_search:
            outputs = await unless_disconnected(raw, beam_search(state, request_id, [prompt], params, req))
        else:
            streams = await add_requests(state, request_id, [prompt], params, req.priority, req.cache_salt,
                                         req.structured_outputs_field(), model=req.model)
            if req.stream:
                return stream_response(streams, self._events(req, request_id, created, streams, plan,
                                                             prompt["prompt_token_ids"], prompt_text))
            outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=CLIENT_CLOSED)
        out = outputs[0]
        choices = [self._choice(req, plan, c, prompt_text) for c in out.outputs]
        body = ChatCompletionResponse(id=request_id, created=created, model=state.answer_model(req.model),
                                      choices=choices, usage=usage_of(outputs))
        if req.prompt_logprobs is not None:
            body.prompt_logprobs = prompt_logprobs_field(out.prompt_logprobs)
        if req.return_token_ids:
            body.prompt_token_ids = out.prompt_token_ids
        return JSONResponse(add_kv_transfer_params(state, req, request_id, outputs, dump(body)))

    def _choice(self, req: ChatCompletionRequest, plan: ToolPlan, c: CompletionOutput,
                prompt_text: str) -> ChatChoice:
        thinking, text = None, c.text
        if self.state.reasoning is not None:  # vLLM: no content (null) when nothing follows the thinking
            thinking, text = self.state.reasoning.extract(c.text, prompt_text)
        extracted = plan.extract(text or "")
        fields = {"content": text} if extracted is None else message_fields(extracted)
        echo = req.echo_text(self.state.response_role)
        if echo:
            fields["content"] = echo + (fields["content"] or "")
        if thinking is not None and req.include_reasoning:
            fields["reasoning"] = fields["reasoning_content"] = thinking
        reason = c.finish_reason if extracted is None else finish_reason(extracted.tools_called, c.finish_reason)
        return ChatChoice(index=c.index, message=ChatResponseMessage(role=req.answer_role(self.state.response_role),
                                                                     **fields),
                          logprobs=self._logprobs(req, c.token_ids, c.logprobs),
                          finish_reason=reason, stop_reason=c.stop_reason,
                          token_ids=list(c.token_ids) if req.return_token_ids else None)

    def _logprobs(self, req: ChatCompletionRequest, token_ids: list[int],
                  logprobs: Optional[list[dict[int, Logprob]]]) -> Optional[ChatLogProbs]:
        if not req.logprobs:
            return None
        decode = self.state.tokenizer.decode
        top_n = req.top_logprobs or 0

        def text_of(tok: int, lp: Logprob) -> str:
            if req.return_tokens_as_token_ids:
                return f"token_id:{tok}"
            return lp.decoded_token if lp.decoded_token is not None else decode([tok])

        content = []
        for tok, entry in zip(token_ids, logprobs or []):
            sampled = entry.get(tok) or next(iter(entry.values()))
            ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:top_n]
            token = text_of(tok, sampled)
            content.append(TokenLogprob(
                token=token, logprob=safe_logprob(sampled.logprob), bytes=list(token.encode()),
                top_logprobs=[TopLogprob(token=text_of(t, lp), logprob=safe_logprob(lp.logprob),
                                         bytes=list(text_of(t, lp).encode())) for t, lp in ranked]))
        return ChatLogProbs(content=content)

    def _chunk(self, model: str, request_id: str, created: int, choices: list[ChatStreamChoice],
               usage=None, prompt_token_ids: Optional[list[int]] = None) -> str:
        return sse_model(ChatCompletionChunk(id=request_id, created=created, model=model,
                                             choices=choices, usage=usage, prompt_token_ids=prompt_token_ids))

    async def _events(self, req: ChatCompletionRequest, request_id: str, created: int,
                      streams: list[RequestStream], plan: ToolPlan, prompt_ids: list[int],
                      prompt_text: str) -> AsyncIterator[str]:
        """The role first (sent at once, before any token; the prompt's ids with it under
        return_token_ids), the echoed last message if asked, then one content delta per step
        that produced text, a finish chunk per choice, usage, [DONE]. Under
        continuous_usage_stats every chunk carries the counts so far."""

        def so_far(num_tokens: int) -> Optional[UsageInfo]:
            return UsageInfo.of(len(prompt_ids), num_tokens, 0) if req.continuous_usage else None

        model = self.state.answer_model(req.model)

        for index in range(req.n):
            yield self._chunk(model, request_id, created, [ChatStreamChoice(
                index=index, delta=DeltaMessage(role=req.answer_role(self.state.response_role), content=""))],
                so_far(0),
                prompt_ids if req.return_token_ids and index == 0 else None)
        echo = req.echo_text(self.state.response_role)
        for index in range(req.n if echo else 0):
            yield self._chunk(model, request_id, created,
                              [ChatStreamChoice(index=index, delta=DeltaMessage(content=echo))], so_far(0))
        reasoning = self.state.reasoning
        cursors = [_Cursor(tools=plan.stream(), thinking=reasoning.stream(prompt_text) if reasoning else None)
                   for _ in range(req.n)]
        final: Optional[RequestOutput] = None
        async for _, out in merge_streams(streams):
            for c in out.outputs:
                for choice in self._deltas(req, c, cursors[c.index]):
                    yield self._chunk(model, request_id, created, [choice], so_far(len(c.token_ids)))
            if out.finished:
                final = out
        if (req.include_usage or self.state.force_include_usage) and final is not None:
            yield self._chunk(model, request_id, created, [], usage_of([final]))
        yield SSE_DONE

    def _deltas(self, req: ChatCompletionRequest, c: CompletionOutput, cur: _Cursor) -> list[ChatStreamChoice]:
        """The unsent part of one choice (from cumulative fields: see serving_completion._delta):
        its thinking first, then content or, when tools are parsed, content and call pieces as
        separate chunks; logprobs and token ids on the first, finish on the last. Text held
        back (a tag or a call still open) waits, with its tokens, for a later chunk."""
        done = c.finish_reason is not None
        if cur.done or not (c.text[cur.text_sent:] or done):
            return []
        thinking, text = split_thinking(cur.thinking, c.text[cur.text_sent:], done)
        cur.text_sent = len(c.text)
        if cur.tools is None:
            deltas = [DeltaMessage(content=text)] if text else []
        else:
            parsed = cur.tools.feed(text)
            if done:
                parsed.extend(cur.tools.finish())
            deltas = delta_messages(parsed)
        if thinking and req.include_reasoning:
            deltas.insert(0, DeltaMessage(reasoning=thinking, reasoning_content=thinking))
        token_ids = list(c.token_ids[cur.tokens_sent:])
        logprobs = self._logprobs(req, token_ids, (c.logprobs or [])[cur.tokens_sent:])
        if not deltas:
            if not (logprobs or done or (req.return_token_ids and token_ids)):
                return []
            deltas = [DeltaMessage(content="") if cur.tools is None else DeltaMessage()]
        cur.tokens_sent, cur.done = len(c.token_ids), done
        choices = [ChatStreamChoice(index=c.index, delta=d) for d in deltas]
        choices[0].logprobs = logprobs
        choices[0].token_ids = token_ids if req.return_token_ids else None
        if done:
            reason = c.finish_reason if cur.tools is None else finish_reason(cur.tools.tools_called, c.finish_reason)
            choices[-1].finish_reason, choices[-1].stop_reason = reason, c.stop_reason
        return choices
