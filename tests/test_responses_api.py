"""``POST /v1/responses`` over the fake engine, with the official openai client:
plain and streamed text, the event sequence, function calls, stateless limits."""
from __future__ import annotations

import json

import httpx
import pytest

from test_server import wait_until_idle
from test_tool_calls import CALL, MODEL, TOOLS, client, server  # noqa: F401  (fixtures)

FUNCTION_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
TEXT_EVENTS = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
               "response.output_text.done", "response.content_part.done", "response.output_item.done"]


def squeeze(kinds: list[str]) -> list[str]:
    """Event types with runs of the same delta type folded into one."""
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1] or not k.endswith(".delta")]


def test_plain_response_with_usage(server, client):
    server.engine.runner.script = "Hello there."
    r = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=50)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "Hello there." and [o.type for o in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    chat = client.chat.completions.create(model=MODEL, max_tokens=50, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    cut = client.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text",
                                                                                    "text": "Hi"}]}],
                                  max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == "Hel" and cut.usage.output_tokens == 3
    wait_until_idle(server)


def test_streamed_events_in_order_add_up_to_the_response(server, client):
    server.engine.runner.script = "Hello there."
    whole = client.responses.create(model=MODEL, input="Hi", max_output_tokens=50)
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=50, stream=True))
    kinds = [e.type for e in events]
    assert squeeze(kinds) == ["response.created", "response.in_progress", *TEXT_EVENTS, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[-1].response.status == "completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == done.text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    wait_until_idle(server)


def test_function_calls_are_output_items_streamed_and_not(server, client):
    server.engine.runner.script = "Checking.\n" + CALL
    kw = dict(model=MODEL, input="Weather in Paris?", tools=FUNCTION_TOOLS, max_output_tokens=300)
    r = client.responses.create(**kw)
    assert [o.type for o in r.output] == ["message", "function_call"] and r.output_text == "Checking."
    call = r.output[1]
    assert call.call_id.startswith("call_") and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    events = list(client.responses.create(**kw, stream=True))
    fc = ["response.output_item.added", "response.function_call_arguments.delta",
          "response.function_call_arguments.done", "response.output_item.done"]
    assert squeeze([e.type for e in events]) == ["response.created", "response.in_progress", *TEXT_EVENTS, *fc,
                                                 "response.completed"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output[1]
    assert args == final.arguments == call.arguments and final.name == call.name
    # The call and its result go back as input items.
    back = client.responses.create(model=MODEL, tools=FUNCTION_TOOLS, max_output_tokens=5, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}])
    assert back.status == "incomplete" and back.usage.input_tokens > r.usage.input_tokens
    wait_until_idle(server)


@pytest.mark.parametrize("extra, param, words", [
    ({"store": True}, "store", "not supported"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "not supported"),
    ({"background": True}, "background", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools", "function"),
    ({"tools": FUNCTION_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"input": []}, "input", "empty"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input", "web_search_call"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "text"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "schema is required"),
    ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    # the location as the client wrote it, without pydantic's union-member tags
    ({"input": [{"role": "user", "content": 5}]}, "input.0.content", "input.0.content: Input should be"),
])
def test_bad_responses_requests_get_a_400_naming_the_field(server, extra, param, words):
    body = {"model": MODEL, "input": "Hi", **extra}
    r = httpx.post(server.base_url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"], err
    assert err["param"] == param or err["message"].startswith(param), err
    assert "function-" not in err["message"] and "function-" not in (err["param"] or ""), err
