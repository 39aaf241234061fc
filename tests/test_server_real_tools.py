"""The server on the real embedded SmolLM2-135M (test_server_real.py's engine and
client): tool calls, the Responses API, and /tokenize counting tools as chat does."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from test_server import wait_until_idle
from test_server_real import MODEL, USER, client, server  # noqa: F401 (the module's fixtures)

pytestmark = pytest.mark.slow

WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_choice_yields_a_valid_call_streamed_and_not(server, client, tool_choice):
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in WEATHER_TOOLS}
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=WEATHER_TOOLS, tool_choice=tool_choice, parallel_tool_calls=False, temperature=0, max_tokens=40)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    chunks = list(client.chat.completions.create(**kw, stream=True))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == call.function.name
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    wait_until_idle(server)


def test_responses_api_plain_and_streamed(server, client):
    r = client.responses.create(model=MODEL, input=USER[0]["content"], max_output_tokens=6, temperature=0)
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0)
    assert r.output_text == chat.choices[0].message.content and r.usage.input_tokens == chat.usage.prompt_tokens
    events = list(client.responses.create(model=MODEL, input=USER[0]["content"], max_output_tokens=6,
                                          temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].type == f"response.{r.status}" and events[-1].response.output_text == r.output_text
    wait_until_idle(server)


def test_responses_text_format_json_schema_and_an_unenforceable_tool_schema(server, client):
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Name a city and its country.", max_output_tokens=60,
                                temperature=0, text={"format": {"type": "json_schema", "name": "place",
                                                                "schema": schema}})
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), schema)
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, tools=bad, tool_choice="required", max_tokens=5)
    assert e.value.body["param"] == "tools"
    wait_until_idle(server)


def test_tokenize_counts_what_chat_completions_renders_with_tools(server, client):
    # clients count a conversation's tokens before sending it: tools must be rendered alike
    chat = client.chat.completions.create(model=MODEL, messages=USER, tools=WEATHER_TOOLS, max_tokens=1)
    with httpx.Client(base_url=server.base_url, timeout=60) as h:
        counted = h.post("/tokenize", json={"messages": USER, "tools": WEATHER_TOOLS}).json()["count"]
        bare = h.post("/tokenize", json={"messages": USER}).json()["count"]
    assert counted == chat.usage.prompt_tokens > bare
    wait_until_idle(server)
