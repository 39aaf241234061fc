"""Reasoning outputs (--reasoning-parser): the split of <think>...</think> from the answer,
streamed in any pieces or whole, and the grammar gate that lets the thinking run free."""
from __future__ import annotations

import httpx
import pytest
import torch
from hypothesis import given, settings, strategies as st

from inflight.reasoning import get_reasoning_parser
from inflight.structured_output.reasoning_gate import ReasoningGate

R1, QWEN3 = get_reasoning_parser("deepseek_r1"), get_reasoning_parser("qwen3")
THINKING_PROMPT = "<|im_start|>assistant\n<think>\n"


@pytest.mark.parametrize("parser, output, prompt, expected", [
    (R1, "plan\n</think>\n\nAnswer", "", ("plan\n", "\n\nAnswer")),  # the template opened the thinking
    (R1, "<think>plan</think>Answer", "", ("plan", "Answer")),
    (R1, "  <think>plan</think>", "", ("plan", None)),  # nothing after the thinking: no content
    (R1, "cut off mid-thought", "", ("cut off mid-thought", None)),
    (QWEN3, "<think>\nplan\n</think>\n\nAnswer", "", ("\nplan\n", "\n\nAnswer")),
    (QWEN3, "Just the answer </think> as text", "", (None, "Just the answer </think> as text")),
    (QWEN3, "plan</think>Answer", THINKING_PROMPT, ("plan", "Answer")),
    (QWEN3, "Answer", "<think>\n\n</think>\n\n", (None, "Answer")),  # enable_thinking=False
    (QWEN3, "<thin", "", (None, "<thin")),  # a tag that never completed is text
    (R1, "plan </thi", "", ("plan </thi", None)),
    (R1, "", "", (None, None)),
])
def test_whole_outputs_split(parser, output, prompt, expected):
    assert parser.extract(output, prompt) == expected


def _stream(parser, pieces, prompt=""):
    s = parser.stream(prompt)
    out = [s.feed(p) for p in pieces] + [s.finish()]
    return "".join(d.reasoning for d in out), "".join(d.content for d in out)


@settings(max_examples=300, deadline=None)
@given(thinking=st.text(alphabet="ab<>/thinks \n", max_size=12), answer=st.text(alphabet="ab<>/ \n", max_size=12),
       opened=st.booleans(), closed=st.booleans(), cuts=st.lists(st.integers(0, 60), max_size=8),
       parser=st.sampled_from([R1, QWEN3]), prompt=st.sampled_from(["", THINKING_PROMPT]))
def test_streaming_in_any_pieces_equals_the_whole(thinking, answer, opened, closed, cuts, parser, prompt):
    output = ("<think>" if opened else "") + thinking + ("</think>" + answer if closed else "")
    bounds = sorted({min(c, len(output)) for c in cuts} | {0, len(output)})
    pieces = [output[a:b] for a, b in zip(bounds, bounds[1:])]
    reasoning, content = _stream(parser, pieces, prompt)
    whole = parser.extract(output, prompt)
    assert (reasoning or None, content or None) == whole
    # nothing is lost but the tags the split consumed
    assert len(reasoning) + len(content) <= len(output)
    if "<" not in thinking + answer:
        thinks = opened or parser is R1 or prompt == THINKING_PROMPT
        if thinks:
            untagged = output.replace("<think>", "", 1 if opened else 0).replace("</think>", "", 1)
        assert reasoning + content == (untagged if thinks else output) and (thinks or not reasoning)


class Inner:
    """A grammar state that records what reaches it."""

    def __init__(self):
        self.accepted, self.filled, self.terminated = [], [], False

    @property
    def is_terminated(self):
        return self.terminated

    def accept_tokens(self, tokens):
        self.accepted += list(tokens)
        return all(t < 100 for t in tokens)

    def validate_tokens(self, tokens):
        return len(tokens)

    def fill_rows(self, bitmask, row, drafts):
        self.filled.append(row)
        bitmask[row] = 0


def test_the_gate_frees_the_thinking_and_constrains_what_follows():
    inner, END = Inner(), 7
    gate = ReasoningGate(inner, END)
    rows = torch.full((1, 2), -1, dtype=torch.int32)
    gate.fill_rows(rows, 0, ())
    assert rows.tolist() == [[-1, -1]] and not gate.is_terminated  # closed: all allowed
    assert gate.validate_tokens([3, 4, END, 5]) == 2  # drafts stop before the end of thinking
    assert gate.accept_tokens([500, 3]) and inner.accepted == []  # thinking tokens the grammar would reject
    assert gate.accept_tokens([4, END, 5]) and inner.accepted == [5]
    gate.fill_rows(rows, 0, ())
    assert rows.tolist() == [[0, 0]] and inner.filled == [0]
    assert not gate.accept_tokens([500])  # open: the grammar decides
    inner.terminated = True
    assert gate.is_terminated


def test_an_optional_thinking_start_decides_on_the_first_token():
    START, END = 40, 7
    thinking = ReasoningGate(Inner(), END, START)
    rows = torch.full((1, 2), -1, dtype=torch.int32)
    thinking.fill_rows(rows, 0, ())
    assert rows.tolist() == [[0, 1 << (START - 32)]]  # the grammar's first mask, and the start of thinking
    assert thinking.validate_tokens([1, 2]) == 0
    assert thinking.accept_tokens([START, 500]) and thinking.inner.accepted == []
    assert thinking.accept_tokens([END, 9]) and thinking.inner.accepted == [9]
    direct = ReasoningGate(Inner(), END, START)
    assert direct.accept_tokens([9, 10]) and direct.inner.accepted == [9, 10]  # answered at once: constrained
    sign = ReasoningGate(Inner(), END, 31)
    sign.fill_rows(rows, 0, ())
    assert rows[0, 0].item() == -(1 << 31)  # bit 31 of an int32 word


# ---------------------------------------------------------------- through the server (a scripted fake model)
@pytest.fixture(scope="module")
def server():
    from inflight.entrypoints.openai.limits import ServerLimits
    from inflight.entrypoints.openai.server_thread import ServerThread
    from test_async_engine import make_fake_engine
    from test_tool_calls import ScriptRunner

    engine = make_fake_engine(num_blocks=2048, block_size=4, max_model_len=4096, max_num_seqs=8,
                              max_num_batched_tokens=4096)
    engine.runner = ScriptRunner()
    with ServerThread(engine, "m", log_stats=False, limits=ServerLimits(reasoning_parser="deepseek_r1")) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "Hi"}]


def test_chat_answers_carry_the_thinking_apart(server, client):
    server.engine.runner.script = "<think>Two and two.</think>\n\nIt is 4."
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=100)
    msg = r.choices[0].message
    assert (msg.reasoning, msg.content) == ("Two and two.", "\n\nIt is 4.")
    assert msg.model_extra["reasoning_content"] == "Two and two." and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=100, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning") or "" for d in deltas) == "Two and two."
    assert "".join(d.content or "" for d in deltas) == "\n\nIt is 4."
    assert not any("<think" in (d.content or "") + (d.model_extra.get("reasoning") or "") for d in deltas)
    hidden = client.chat.completions.create(model="m", messages=USER, max_tokens=100,
                                            extra_body={"include_reasoning": False})
    msg = hidden.choices[0].message
    assert "reasoning" not in msg.model_extra and msg.content == "\n\nIt is 4."
    cut = client.chat.completions.create(model="m", messages=USER, max_tokens=15)  # stopped mid-thought
    assert (cut.choices[0].message.reasoning, cut.choices[0].message.content) == ("Two and ", None)


def test_tool_calls_are_read_from_the_answer_after_the_thinking(server, client):
    from test_tool_calls import CALL, TOOLS

    server.engine.runner.script = "<think>I should look it up.</think>" + CALL
    r = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=300)
    msg = r.choices[0].message
    assert msg.reasoning == "I should look it up." and r.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls[0].function.name == "get_weather" and not msg.content
    chunks = list(client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=300, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning") or "" for d in deltas) == "I should look it up."
    assert [t.function.name for d in deltas for t in (d.tool_calls or []) if t.function.name] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ---------------------------------------------------------------- the gate in the real engine
@pytest.mark.slow
def test_the_grammar_starts_after_the_end_of_thinking_token_in_the_engine():
    """SmolLM2 has no think tokens: "." stands for the end of thinking, " Paris" for its
    start. Its greedy answer to the prompt is " Paris." and more."""
    import re

    from inflight import LLM, SamplingParams
    from inflight.structured_output.params import StructuredOutputsParams

    llm = LLM(dtype="float32", kv_cache_memory=32 * 2**20, max_model_len=256)
    tok = llm.get_tokenizer()
    dot, paris, banana = (tok(w, add_special_tokens=False).input_ids[0] for w in (".", " Paris", " banana"))
    prompt = "The capital of France is"

    def run(**gate) -> str:
        so = StructuredOutputsParams(regex="[0-9]{3}", **gate)
        return llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, structured_outputs=so),
                            use_tqdm=False)[0].outputs[0].text

    assert re.fullmatch(r" Paris\.[0-9]{3}", run(after_reasoning=dot))  # free until ".", then the regex
    assert re.fullmatch(r" Paris\.[0-9]{3}", run(after_reasoning=dot, optional_reasoning_start=paris))
    assert re.fullmatch(r"[0-9]{3}", run(after_reasoning=dot, optional_reasoning_start=banana))  # no thinking
    assert re.fullmatch(r"[0-9]{3}", run())


def test_the_server_gates_the_grammar_as_the_prompt_leaves_the_thinking():
    from types import SimpleNamespace

    from inflight.entrypoints.openai.chat_reasoning import gate_grammar
    from inflight.sampling_params import SamplingParams
    from inflight.structured_output.params import StructuredOutputsParams

    params = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))

    def gate(parser, prompt, tags=(5, 6), p=params):
        so = gate_grammar(SimpleNamespace(reasoning=parser, reasoning_tags=tags), p, prompt).structured_outputs
        return None if so is None else (so.after_reasoning, so.optional_reasoning_start)

    assert gate(R1, "user: hi\nassistant:") == (6, None)  # R1 thinks first
    assert gate(QWEN3, "user: hi\nassistant:") == (6, 5)  # Qwen3 thinks if it opens with <think>
    assert gate(QWEN3, THINKING_PROMPT) == (6, None)
    assert gate(QWEN3, "assistant:<think>\n\n</think>\n\n") == (None, None)  # thinking turned off
    assert gate(R1, "assistant:", tags=None) == (None, None)  # tags of several tokens: no gate
    assert gate(None, "assistant:") == (None, None)
    assert gate(R1, "assistant:", p=SamplingParams()) is None  # nothing to gate


def test_the_responses_api_puts_the_thinking_in_a_reasoning_item(server, client):
    server.engine.runner.script = "<think>Two and two.</think>It is 4."
    r = client.responses.create(model="m", input="2+2?", max_output_tokens=100)
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Two and two." and r.output_text == "It is 4."
    events = list(client.responses.create(model="m", input="2+2?", max_output_tokens=100, stream=True))
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Two and two."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "It is 4."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output[0].type == "reasoning"


def test_think_tags_gate_only_where_each_is_one_token():
    from inflight.loader import load_tokenizer

    try:
        tok = load_tokenizer(None)
    except Exception as e:  # the embedded model is an optional install
        pytest.skip(f"embedded SmolLM2 tokenizer unavailable: {e}")
    assert R1.tag_token_ids(tok) is None  # SmolLM2 spells <think> in several tokens
    tok.add_tokens(["<think>", "</think>"])  # as Qwen3's and DeepSeek-R1's vocabularies have them
    start, end = R1.tag_token_ids(tok)
    assert tok.convert_ids_to_tokens([start, end]) == ["<think>", "</think>"]


def test_responses_take_back_their_reasoning_items_and_an_effort(server, client):
    server.engine.runner.script = "<think>Again.</think>Still 4."
    first = client.responses.create(model="m", input="2+2?", max_output_tokens=100)
    follow_up = [{"role": "user", "content": "2+2?"}, *[item.model_dump(exclude_none=True) for item in first.output],
                 {"role": "user", "content": "Sure?"}]
    again = client.responses.create(model="m", input=follow_up, max_output_tokens=100, reasoning={"effort": "low"})
    assert again.output_text == "Still 4." and again.output[0].type == "reasoning"
    from inflight.entrypoints.openai.protocol_responses import ResponsesRequest

    as_chat = ResponsesRequest(input="hi", reasoning={"effort": "low"}).to_chat_request()
    assert as_chat.chat_template_kwargs == {"reasoning_effort": "low"}  # what the template is given
    with httpx.Client(base_url=server.base_url) as h:
        assert h.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "extreme"}}).status_code == 400
