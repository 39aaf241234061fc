"""Every ``--tool-call-parser``: what it reads as calls and as content, arguments
streamed as they are generated, and streamed pieces that always add up to the
non-streamed result, however the output is split."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.entrypoints.openai.tool_parsers import ToolParserManager, collect
from inflight.sampling_params import SamplingParams


def extract(name, text):
    r = ToolParserManager.get_tool_parser(name)().extract_tool_calls(text)
    return [(c.name, json.loads(c.arguments)) for c in r.tool_calls], r.content


@pytest.mark.parametrize("name, text, calls, content", [
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {}}',
     [("f", {"a": 1}), ("g", {})], None),
    ("llama3_json", '<|python_tag|>{"type": "function", "name": "f", "parameters": {"a": "x;"}}',
     [("f", {"a": "x;"})], None),
    ("llama3_json", '{"parameters": {"a": 1}, "name": "f"}', [("f", {"a": 1})], None),  # read whole at the end
    ("llama3_json", 'It is {"name": "f"}', [], 'It is {"name": "f"}'),  # calls only at the start
    ("llama3_json", '{"a": 1} is JSON', [], '{"a": 1} is JSON'),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
     [("f", {"a": 1}), ("g", {})], "Sure."),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": {"b": "}"}}[TOOL_CALLS]g{}', [("f", {"a": {"b": "}"}}), ("g", {})], None),
    ("mistral", "[TOOL_CALLS] no call", [], "[TOOL_CALLS] no call"),
    ("mistral", "Just text.", [], "Just text."),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
     [("f", {"a": 1}), ("g", {})], None),
    ("granite", ' <tool_call> [{"name": "f", "arguments": {}}]', [("f", {})], None),
    ("granite", "Sure: [1, 2]", [], "Sure: [1, 2]"),
    ("granite", "[1, 2]", [], "[1, 2]"),
    ("pythonic", '[get_weather(city="Paris", days=[1, 2]), get_time()]',
     [("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {})], None),
    ("pythonic", '<|python_start|>[f(a={"k": None, "t": True})] done', [("f", {"a": {"k": None, "t": True}})],
     "done"),
    ("pythonic", "[Note] this is text", [], "[Note] this is text"),
    ("pythonic", "[f(1)]", [], "[f(1)]"),  # positional arguments: no call
    ("pythonic", "[f(a=__import__('os').getcwd())]", [], "[f(a=__import__('os').getcwd())]"),  # never evaluated
    ("pythonic", "Text [f(a=1)]", [], "Text [f(a=1)]"),
])
def test_calls_and_content(name, text, calls, content):
    assert extract(name, text) == (calls, content)


@pytest.mark.parametrize("name, text", [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"city": "Paris", "note": "a \\"q\\" }"}}</tool_call>'),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"city": "Paris", "note": "a \\"q\\" }"}}]'),
    ("llama3_json", '{"name": "f", "parameters": {"city": "Paris", "note": "a \\"q\\" }"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"city": "Paris", "note": "a \\"q\\" }"}}]'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"city": "Paris", "note": "a \\"q\\" }"}'),
])
def test_arguments_stream_as_they_are_generated(name, text):
    s = ToolParserManager.get_tool_parser(name)().stream()
    deltas = [s.feed(ch) for ch in text] + [s.finish()]
    pieces = [p for d in deltas for p in d.tool_calls]
    assert pieces[0].name == "f" and pieces[0].id and all(p.name is None for p in pieces[1:])
    # the name goes out when the arguments begin, each argument character as it arrives
    assert len(pieces) == 1 + len('{"city": "Paris", "note": "a \\"q\\" }"}')
    assert json.loads(collect(deltas).tool_calls[0].arguments) == {"city": "Paris", "note": 'a "q" }'}


QWEN_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}, "hot": {"type": "boolean"}}}}}]


def test_qwen3_coder_values_are_typed_by_the_schema_and_stream_per_parameter():
    parser = ToolParserManager.get_tool_parser("qwen3_coder")(tools=QWEN_TOOLS)
    text = ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n12\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n"
            "<parameter=hot>\nfalse\n</parameter>\n<parameter=note>\n7\n</parameter>\n</function>\n</tool_call>")
    s = parser.stream()
    deltas = [s.feed(ch) for ch in text] + [s.finish()]
    args = [p.arguments for d in deltas for p in d.tool_calls if p.id is None]
    assert args == ['{', '"city": "12"', ', "days": 3', ', "opts": {"unit": "C"}', ', "hot": false', ', "note": "7"',
                    "}"]
    (call,) = collect(deltas).tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "12", "days": 3, "opts": {"unit": "C"}, "hot": False, "note": "7"}
    assert collect(deltas).content == "Checking."
    r = parser.extract_tool_calls("<tool_call>no function</tool_call>")
    assert r.tool_calls == [] and r.content == "<tool_call>no function</tool_call>"


def test_mistral_keeps_special_tokens_and_makes_its_own_ids():
    parser = ToolParserManager.get_tool_parser("mistral")()
    assert parser.adjust_request(SamplingParams()).skip_special_tokens is False
    (call,) = parser.extract_tool_calls("[TOOL_CALLS]f{}").tool_calls
    assert len(call.id) == 9 and call.id.isalnum()


PIECES = {
    "hermes": ["Sure", " ", "\n", "<tool_call>", "<tool_", "call>", "</tool_call>", '{"name": "f", "arguments": {}}',
               '{"name": "g", "arguments": {"q": "<tool_call>"}}', "{bad", "text", "</tool", "[", "]", ",", '"',
               '{"arguments": {}, "name": "h"}', '{"name": "e", "arguments": {"a": "\\"}\\\\"}}'],
    "llama3_json": ["<|python_tag|>", "<|python", "_tag|>", " ", "\n", '{"name": "f", "parameters": {"a": "x;}"}}',
                    "; ", '{"name": "g"', ', "arguments": {}}', "{bad", "text", '{"parameters": {}, "name": "h"}',
                    "}", '"', "\\", '{"name": "e", "arguments": {"a": "\\"}\\\\"}}'],
    "mistral": ["[TOOL_CALLS]", "[TOOL_", "CALLS]", "f[ARGS]", "g", '{"a": "[TOOL_CALLS]"}', "{}", "[", "]", ", ",
                '{"name": "f", "arguments": {"q": 1}}', "text", " ", "\\", '"', "{", 'e{"a": "\\"}\\\\"}'],
    "granite": ["<|tool_call|>", "<tool_call>", "<|tool", "_call|>", " ", "[", "]", ", ", "text",
                '{"name": "f", "arguments": {"a": "]"}}', '{"arguments": {}, "name": "h"}', "{", '"', "\\"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<tool_", "\n", "<function=f>", "<function=", "g>", "</function>",
                    "<parameter=a>", "1", "</parameter>", "</param", "<parameter=b>\nx\ny\n</parameter>", "text"],
    "pythonic": ["[", "]", "f(", ")", "a=1", ", ", 'b="x)]"', "g()", "text", " ", "<|python_start|>", "2", "(",
                 '"', "h(c=[1, {'k': None}])"],
}


@pytest.mark.parametrize("name", sorted(PIECES))
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_streaming_in_any_split_equals_the_whole(name, data):
    text = "".join(data.draw(st.lists(st.sampled_from(PIECES[name]), max_size=12)))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    parser = ToolParserManager.get_tool_parser(name)()
    whole = parser.extract_tool_calls(text)
    for pieces in ([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])], list(text)):  # and every cut at once
        s = parser.stream()
        deltas = [s.feed(piece) for piece in pieces] + [s.finish()]
        streamed = collect(deltas)
        assert streamed.content == whole.content
        assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(c.name, c.arguments)
                                                                         for c in whole.tool_calls]
        assert s.tools_called == whole.tools_called
        # calls are numbered in order, each announced once
        assert [p.index for d in deltas for p in d.tool_calls if p.id] == list(range(len(whole.tool_calls)))
