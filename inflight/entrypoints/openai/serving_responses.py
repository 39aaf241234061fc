"""``POST /v1/responses`` (stateless): one chat turn, answered in the Responses shape.

The request becomes a chat request (protocol_responses.py) and runs through the
chat path's admission, template, tools and structured output. One builder turns
the output into output items (``reasoning`` under --reasoning-parser, ``message`` with
``output_text``, ``function_call``)
and, when streaming, into the Responses events, each with its
``sequence_number``; the non-streamed body is what the same builder ends with.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inflight.entrypoints.openai.chat_reasoning import gate_grammar, split_thinking
from inflight.entrypoints.openai.errors import OpenAIError, bad_request, param_of
from inflight.entrypoints.openai.protocol_responses import ResponsesRequest
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        merge_streams, unless_disconnected)
from inflight.entrypoints.openai.sse import stream_response
from inflight.entrypoints.openai.tool_calling import (ToolPlan, compile_tool_grammar, constrain, plan_tools,
                                                      render_chat_with_tools)
from inflight.entrypoints.openai.tool_parsers import ParsedDelta, ToolCallStream
from inflight.errors import InvalidRequestError
from inflight.outputs import RequestOutput
from inflight.reasoning import ReasoningStream


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """Output items and stream events of one response, built from parsed output pieces."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.response = dict(base, output=[], status="in_progress", usage=None)
        self.seq = 0
        self._open: Optional[dict[str, Any]] = None  # the item still receiving text or arguments
        self._text, self._index = "", 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _snapshot(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.response))

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self._snapshot()),
                self._event("response.in_progress", response=self._snapshot())]

    def add(self, parsed: ParsedDelta) -> list[dict[str, Any]]:
        """The events of a piece of output: items open as their first piece arrives."""
        events: list[dict[str, Any]] = []
        for part in parsed.parts:
            if isinstance(part, str):
                if self._open is None or self._open["type"] != "message":
                    events += self._close() + self._open_item({
                        "type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant",
                        "content": []})
                    part_obj = {"type": "output_text", "text": "", "annotations": []}
                    events.append(self._event("response.content_part.added", item_id=self._open["id"],
                                              output_index=self._index, content_index=0, part=part_obj))
                self._text += part
                events.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                          output_index=self._index, content_index=0, delta=part, logprobs=[]))
            elif part.id is not None:
                events += self._close() + self._open_item({
                    "type": "function_call", "id": _id("fc"), "call_id": part.id, "name": part.name,
                    "arguments": "", "status": "in_progress"})
                events += self._arguments(part.arguments)
            else:
                events += self._arguments(part.arguments)
        return events

    def reason(self, text: str) -> list[dict[str, Any]]:
        """The events of a piece of thinking (--reasoning-parser): a ``reasoning`` item."""
        if not text:
            return []
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close() + self._open_item({"type": "reasoning", "id": _id("rs"), "summary": [],
                                                       "content": [], "status": "in_progress"})
        self._text += text
        return events + [self._event("response.reasoning_text.delta", item_id=self._open["id"],
                                     output_index=self._index, content_index=0, delta=text)]

    def _open_item(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self._open, self._text = item, ""
        self._index = len(self.response["output"])
        return [self._event("response.output_item.added", output_index=self._index, item=dict(item))]

    def _arguments(self, fragment: str) -> list[dict[str, Any]]:
        if not fragment:
            return []
        self._open["arguments"] += fragment
        return [self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                            output_index=self._index, delta=fragment)]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        common = {"item_id": item["id"], "output_index": self._index}
        if item["type"] == "message":
            part = {"type": "output_text", "text": self._text, "annotations": []}
            item["content"] = [part]
            events = [self._event("response.output_text.done", **common, content_index=0, text=self._text,
                                  logprobs=[]),
                      self._event("response.content_part.done", **common, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": self._text}]
            events = [self._event("response.reasoning_text.done", **common, content_index=0, text=self._text)]
        else:
            events = [self._event("response.function_call_arguments.done", **common, name=item["name"],
                                  arguments=item["arguments"])]
        self.response["output"].append(item)
        return events + [self._event("response.output_item.done", output_index=self._index, item=item)]

    def finish(self, out: RequestOutput, reasoning_tokens: int = 0) -> list[dict[str, Any]]:
        """Close the last item; ``response.completed`` (or ``response.incomplete`` at the token limit)."""
        c = out.outputs[0]
        incomplete = c.finish_reason == "length"
        events = self._close("incomplete" if incomplete else "completed")
        prompt, completion = len(out.prompt_token_ids), len(c.token_ids)
        self.response.update(
            status="incomplete" if incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            usage={"input_tokens": prompt, "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
                   "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                   "total_tokens": prompt + completion})
        kind = "response.incomplete" if incomplete else "response.completed"
        return events + [self._event(kind, response=self._snapshot())]


    def fail(self, error: OpenAIError) -> list[dict[str, Any]]:
        """A stream that failed after its headers: OpenAI's ``error`` event, then
        ``response.failed`` with the response's ``error`` set."""
        code = "invalid_prompt" if error.status < 500 else "server_error"
        self.response.update(status="failed", error={"code": code, "message": error.message})
        return [self._event("error", code=error.code or code, message=error.message, param=error.param),
                self._event("response.failed", response=self._snapshot())]


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'), ensure_ascii=False)}\n\n"


class ResponsesHandler:
    """Serves ``/v1/responses`` against the shared server state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        state = self.state
        try:
            chat = req.to_chat_request()
            params = state.admit(chat)
            plan = plan_tools(chat, state.limits, state.renderer)
            params = constrain(params, plan)
        except InvalidRequestError as e:
            raise _renamed(str(e)) from None
        except OpenAIError as e:  # admit's 400s name chat fields: give the Responses names
            if e.status == 400:
                raise _renamed(e.message) from None
            raise
        await compile_tool_grammar(state, params, plan)
        prompt = await render_chat_with_tools(state, chat, plan)
        params = gate_grammar(state, state.fit_default_max_tokens(chat, params, len(prompt["prompt_token_ids"])),
                              prompt["prompt"])
        builder = ResponseBuilder(self._base(req, chat))
        field = chat.structured_outputs_field().replace("response_format", "text.format")
        streams = await add_requests(state, builder.response["id"], [prompt], params, req.priority,
                                     grammar_field=field, model=req.model)
        thinking = state.reasoning.stream(prompt["prompt"]) if state.reasoning else None
        if req.stream:
            return stream_response(streams, self._events(builder, plan, streams, thinking),
                                   on_error=lambda error: [_sse(e) for e in builder.fail(error)])
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=CLIENT_CLOSED)
        out = outputs[0]
        reasoning, content = split_thinking(thinking, out.outputs[0].text, True)
        builder.reason(reasoning)
        builder.add(_parse(plan.stream(), content, True))
        builder.finish(out, self._reasoning_tokens(out, bool(reasoning)))
        return JSONResponse(builder.response)

    async def _events(self, builder: ResponseBuilder, plan: ToolPlan, streams: list,
                      thinking: Optional[ReasoningStream]) -> AsyncIterator[str]:
        for event in builder.start():
            yield _sse(event)
        tools, sent, thought = plan.stream(), 0, False
        async for _, out in merge_streams(streams):
            c = out.outputs[0]
            reasoning, content = split_thinking(thinking, c.text[sent:], out.finished)
            thought = thought or bool(reasoning)
            for event in builder.reason(reasoning) + builder.add(_parse(tools, content, out.finished)):
                yield _sse(event)
            sent = len(c.text)
            if out.finished:
                for event in builder.finish(out, self._reasoning_tokens(out, thought)):
                    yield _sse(event)

    def _reasoning_tokens(self, out: RequestOutput, thought: bool) -> int:
        """The output tokens up to the end of the thinking (all of them if it never ended)."""
        ids, tags = list(out.outputs[0].token_ids), self.state.reasoning_tags
        if not thought:
            return 0
        if tags is None or tags[1] not in ids:
            return len(ids) if tags is not None else 0
        return ids.index(tags[1]) + 1

    def _base(self, req: ResponsesRequest, chat: Any) -> dict[str, Any]:
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
        return {"id": _id("resp"), "object": "response", "created_at": int(time.time()),
                "model": self.state.answer_model(req.model),
                "error": None, "incomplete_details": None, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
                "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": None,
                "store": False, "temperature": chat.temperature if chat.temperature is not None else 1.0,
                "top_p": chat.top_p if chat.top_p is not None else 1.0, "text": {"format": fmt or {"type": "text"}},
                "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
                else req.tool_choice.model_dump(), "tools": req.tools or [], "truncation": "disabled",
                "user": req.user}


def _parse(tools: Optional[ToolCallStream], text: str, finished: bool) -> ParsedDelta:
    if tools is None:
        parsed = ParsedDelta()
        parsed.add_text(text)
        return parsed
    parsed = tools.feed(text)
    if finished:
        parsed.extend(tools.finish())
    return parsed


def _renamed(message: str) -> OpenAIError:
    """A 400 in the Responses API's names (``response_format`` is ``text.format`` there)."""
    for chat_name, name in (("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"),
                            ("max_tokens", "max_output_tokens"), ("messages", "input")):
        message = message.replace(chat_name, name)
    return bad_request(message, param_of(message, ResponsesRequest.model_fields))
