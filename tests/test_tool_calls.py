"""Tool calling on chat completions: the hermes parser, the prompt, and the server
over a fake engine whose model writes a fixed tool call."""
from __future__ import annotations

import dataclasses
import json

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.core.outputs import ModelRunnerOutput
from inflight.entrypoints.openai.server_thread import ServerThread
from inflight.entrypoints.openai.tool_calling import ToolPlan
from inflight.entrypoints.openai.tool_parsers import (NamedToolCallStream, RequiredToolCallStream, ToolParserManager,
                                                      collect)
from inflight.entrypoints.openai.tool_render import prepare_messages
from test_async_engine import EOS, FakeRunner, make_fake_engine
from test_server import wait_until_idle

MODEL = "fake-model"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]


def hermes():
    return ToolParserManager.get_tool_parser("hermes")()


# ---------------------------------------------------------------- the parser
def test_plain_text_is_content_unchanged():
    r = hermes().extract_tool_calls("Hello there.\n")
    assert r.tool_calls == [] and r.content == "Hello there.\n"


def test_text_before_a_call_and_several_calls():
    text = f"Let me check.\n{CALL}\n<tool_call>{{\"name\": \"get_time\", \"arguments\": \"{{}}\"}}</tool_call>\n"
    r = hermes().extract_tool_calls(text)
    assert r.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {})]
    assert all(c.id.startswith("call_") for c in r.tool_calls) and r.tool_calls[0].id != r.tool_calls[1].id


def test_a_call_alone_has_no_content_and_a_list_in_one_tag_is_several_calls():
    r = hermes().extract_tool_calls('<tool_call>[{"name": "a"}, {"name": "b", "arguments": {"x": "é"}}]</tool_call>')
    assert r.content is None and [(c.name, c.arguments) for c in r.tool_calls] == [("a", "{}"), ("b", '{"x": "é"}')]


@pytest.mark.parametrize("inner", ['{"name": "f", "arguments": ', '{"arguments": {}}', '[]', '"f"',
                                   '{"name": "f", "arguments": [1]}', '{"name": "", "arguments": {}}'])
def test_malformed_json_inside_the_tag_is_returned_as_content(inner):
    text = f"Sure. <tool_call>{inner}</tool_call> done"
    r = hermes().extract_tool_calls(text)
    assert r.tool_calls == [] and r.content == text


def test_a_call_whose_arguments_began_stays_a_call():
    # Streamed, its name and arguments were already sent when the object turns out
    # unclosed; the non-streamed answer is the same call, arguments as written.
    r = hermes().extract_tool_calls('<tool_call>{"name": "f", "arguments": {"a": "}"}</tool_call>')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", '{"a": "}"}')] and r.content is None


def test_keys_in_another_order_or_arguments_as_a_string_are_read_once_the_tag_closes():
    r = hermes().extract_tool_calls('<tool_call>{"arguments": "{\\"a\\": 1}", "name": "f"}</tool_call>')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", '{"a": 1}')]


def test_an_unclosed_call_counts_only_if_its_json_is_whole():
    r = hermes().extract_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", '{"a": 1}')]
    cut = '<tool_call>\n{"name": "f", "argu'
    assert hermes().extract_tool_calls(cut).content == cut


PIECES = ["Sure", " ", "\n", "<tool_call>", "<tool_", "call>", "</tool_call>", '{"name": "f", "arguments": {}}',
          '{"name": "g", "arguments": {"q": "<tool_call>"}}', "{bad", "text", "</tool"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.data())
def test_streaming_in_any_split_equals_the_whole(pieces, data):
    text = "".join(pieces)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    s = hermes().stream()
    deltas = [s.feed(text[a:b]) for a, b in zip([0] + cuts, cuts + [len(text)])] + [s.finish()]
    streamed, whole = collect(deltas), hermes().extract_tool_calls(text)
    assert streamed.content == whole.content
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]


def test_a_forced_call_is_parsed_from_bare_json():
    s = NamedToolCallStream("get_weather")  # a named function: the output is its arguments, streamed as they come
    deltas = [s.feed('{"city": '), s.feed('"Paris"}'), s.finish()]
    assert deltas[0].tool_calls[0].name == "get_weather" and deltas[1].tool_calls[0].arguments == '"Paris"}'
    (call,) = collect(deltas).tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    s = RequiredToolCallStream()  # required: an array of calls; one cut short by the length limit is dropped
    out = collect([s.feed('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "argu'), s.finish()])
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_time", "{}")] and out.content is None
    s = RequiredToolCallStream()
    assert collect([s.feed('[{"na'), s.finish()]).content == '[{"na'


def test_the_required_schema_allows_only_calls_to_the_tools():
    plan = ToolPlan(mode="required", tools=TOOLS)
    items = plan.schema()["items"]["anyOf"]
    assert [i["properties"]["name"]["enum"] for i in items] == [["get_weather"], ["get_time"]]
    assert items[0]["properties"]["arguments"] == TOOLS[0]["function"]["parameters"]
    assert plan.schema()["minItems"] == 1 and "maxItems" not in plan.schema()
    assert ToolPlan(mode="required", tools=TOOLS, parallel_tool_calls=False).schema()["maxItems"] == 1
    named = ToolPlan(mode="named", tools=TOOLS, function="get_time").schema()
    assert named == {"type": "object", "properties": {}}


# ---------------------------------------------------------------- the prompt
def test_a_template_without_tools_gets_them_in_the_system_message_and_turns_as_text():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    dicts = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
             {"role": "tool", "content": "sunny", "tool_call_id": "call_2"}]
    out, kwargs = prepare_messages(dicts, TOOLS, "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert kwargs == {} and [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and json.dumps(TOOLS[0]) in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"


def test_a_template_that_takes_tools_gets_them_as_they_are():
    dicts = [{"role": "user", "content": "hi"}]
    template = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.tool_calls }}{% endfor %}"
    assert prepare_messages(dicts, TOOLS, template) == (dicts, {"tools": TOOLS})


# ---------------------------------------------------------------- the server
class ScriptRunner(FakeRunner):
    """Writes ``script`` one byte per token, then EOS."""

    script = CALL

    def execute(self, sched) -> ModelRunnerOutput:
        out = ModelRunnerOutput()
        data = self.script.encode()
        for s in self.batch(sched):
            if s.samples:
                n = len(s.state.output_token_ids)
                out.sampled_token_ids[s.req_id] = [data[n] if n < len(data) else EOS]
        return out


@pytest.fixture(scope="module")
def server():
    engine = make_fake_engine(num_blocks=1024, block_size=4, max_model_len=2048, max_num_seqs=16,
                              max_num_batched_tokens=2048)
    engine.runner = ScriptRunner()
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture
def client(server):
    server.engine.runner.script = CALL
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_a_call_is_parsed_into_tool_calls(server, client):
    server.engine.runner.script = "Checking.\n" + CALL
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=300)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    wait_until_idle(server)


def test_streamed_calls_concatenate_to_the_non_streamed_result(server, client):
    server.engine.runner.script = "Checking.\n" + CALL + '\n<tool_call>{"name": "get_time"}</tool_call>'
    kw = dict(model=MODEL, messages=USER, tools=TOOLS, max_tokens=300)
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == whole.message.content
    calls: dict[int, dict] = {}
    for d in deltas:
        for piece in d.tool_calls or []:
            if piece.id:  # the first piece of a call: id, type and name, no arguments yet
                assert piece.index not in calls and piece.type == "function" and piece.function.arguments == ""
                calls[piece.index] = {"name": piece.function.name, "arguments": ""}
            else:
                assert piece.function.name is None
                calls[piece.index]["arguments"] += piece.function.arguments
    assert [calls[i] for i in sorted(calls)] == [{"name": c.function.name, "arguments": c.function.arguments}
                                                 for c in whole.message.tool_calls]
    assert len(calls) == 2 and chunks[-1].choices[0].finish_reason == "tool_calls"
    # the arguments arrive as they are generated, not whole at the closing tag
    assert sum(1 for d in deltas for p in d.tool_calls or [] if p.index == 0 and not p.id) > 1
    wait_until_idle(server)


@pytest.mark.parametrize("parser, script", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("pythonic", '[get_weather(city="Paris")]'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                    "</tool_call>"),
])
def test_each_tool_call_parser_through_the_server(server, client, parser, script):
    server.engine.runner.script = script
    limits = server.state.limits
    server.state.limits = dataclasses.replace(limits, tool_call_parser=parser)  # --tool-call-parser
    try:
        kw = dict(model=MODEL, messages=USER, tools=TOOLS, max_tokens=300)
        whole = client.chat.completions.create(**kw).choices[0]
        chunks = list(client.chat.completions.create(**kw, stream=True))
    finally:
        server.state.limits = limits
    (call,) = whole.message.tool_calls
    assert whole.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert whole.message.content == ("Sure." if parser == "mistral" else None)
    assert (len(call.id) == 9 and call.id.isalnum()) if parser == "mistral" else call.id.startswith("call_")
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    wait_until_idle(server)


def test_parallel_tool_calls_false_keeps_the_first_call(server, client):
    server.engine.runner.script = CALL + '<tool_call>{"name": "get_time"}</tool_call>'
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=300,
                                       parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    assert r.choices[0].message.content is None


def test_tool_choice_none_parses_nothing(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="none", max_tokens=300)
    assert r.choices[0].message.content == CALL and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_tool_turns_go_back_through_the_template(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=300)
    # The fake template writes <role>content lines: what it was given is in the prompt's length.
    as_template_reads = [dict(m, content=m["content"] or "") for m in messages]
    as_template_reads[1]["tool_calls"] = [dict(call, function={"name": "get_weather", "arguments": {"city": "Paris"}})]
    dicts, _ = prepare_messages(as_template_reads, TOOLS, "fake")
    expected = "".join(f"<{m['role']}>{m['content']}\n" for m in dicts) + "<assistant>"
    assert "<tool_response>\n18C\n</tool_response>" in expected and '"arguments": {"city": "Paris"}' in expected
    assert r.usage.prompt_tokens == len(expected.encode())
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.parametrize("extra, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", "auto"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "pattern"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "function"),
    ({"tools": [{"type": "function"}]}, "tools.0.function", "required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools.0.function.parameters",
     "dict"),
    ({"tools": TOOLS + [TOOLS[0]]}, "tools", "unique"),
    ({"messages": [{"role": "tool", "content": "18C"}]}, "messages.0", "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages.0", "assistant"),
])
def test_bad_tool_requests_get_a_400_naming_the_field(server, extra, param, words):
    import httpx

    body = {"model": MODEL, "messages": USER, "tools": TOOLS, "max_tokens": 5, **extra}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"]
    assert err["param"] == param
