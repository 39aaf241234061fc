"""The bad requests of test_bad_requests.py: (path, body, status, error type), each a
request meant to hurt the server, with the helpers that build them."""
from __future__ import annotations

MODEL = "fake-model"
C, CH, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
U = [{"role": "user", "content": "Hi"}]
INVALID, OVERLOADED = "invalid_request_error", "server_overloaded"
BIG = 2**64


def cmpl(**kw):
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **kw}


def chat(**kw):
    return {"model": MODEL, "messages": U, "max_tokens": 2, **kw}


def raw(text: str) -> bytes:
    return text.encode()


def msg(role, **kw):
    return chat(messages=[{"role": role, **kw}])


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}

# (path, body, status, error type): a dict is sent as JSON, bytes as they are.
CASES = [
    # seeds: int64, and seed + n - 1 too (the engine seeds sample i with seed + i)
    (C, cmpl(seed=BIG), 400, INVALID),
    (C, cmpl(seed=2**63), 400, INVALID),
    (C, cmpl(seed=-(2**63) - 1), 400, INVALID),
    (C, cmpl(seed=2**63 - 1, n=2), 400, INVALID),
    (CH, chat(seed=2**63 - 2, n=3), 400, INVALID),
    (CH, chat(seed=BIG), 400, INVALID),
    (C, cmpl(seed="abc"), 400, INVALID),
    (C, cmpl(seed=1.5), 400, INVALID),
    # floats must be finite (NaN compares false against every bound)
    (C, raw('{"prompt": "Hi", "temperature": NaN}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "temperature": Infinity}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "temperature": -Infinity}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "temperature": 1e999}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "top_p": NaN}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "min_p": NaN}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "repetition_penalty": NaN}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "presence_penalty": Infinity}'), 400, INVALID),
    # finite, but not as the sampler's float32: inf or 0 there would make the row NaN
    (C, cmpl(temperature=1e39), 400, INVALID),
    (C, cmpl(top_p=1e-46), 400, INVALID),
    (C, cmpl(repetition_penalty=1e-46), 400, INVALID),
    (CH, chat(repetition_penalty=1e39), 400, INVALID),
    (C, raw('{"prompt": "Hi", "frequency_penalty": NaN}'), 400, INVALID),
    (CH, raw('{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'), 400, INVALID),
    (CH, raw('{"messages": [{"role": "user", "content": "Hi"}], "repetition_penalty": Infinity}'), 400, INVALID),
    # n <= --max-n (16 by default)
    (C, cmpl(n=17), 400, INVALID),
    (C, cmpl(n=1000), 400, INVALID),
    (C, cmpl(n=10**9), 400, INVALID),
    (C, cmpl(n=BIG), 400, INVALID),
    (CH, chat(n=17), 400, INVALID),
    (C, cmpl(n=-1), 400, INVALID),
    (C, cmpl(n=0), 400, INVALID),
    # at most 256 prompts per completion request
    (C, cmpl(prompt=["Hi"] * 257), 400, INVALID),
    (C, cmpl(prompt=["Hi"] * 2500), 400, INVALID),
    (C, cmpl(prompt=[[72]] * 257), 400, INVALID),
    # stop strings: at most 16, each 1..256 characters
    (C, cmpl(stop=""), 400, INVALID),
    (C, cmpl(stop=[""]), 400, INVALID),
    (C, cmpl(stop=["a", ""]), 400, INVALID),
    (C, cmpl(stop=["a"] * 17), 400, INVALID),
    (C, cmpl(stop=["x" * 257]), 400, INVALID),
    (C, cmpl(stop=[f"s{i}" for i in range(10_000)]), 400, INVALID),
    (CH, chat(stop=""), 400, INVALID),
    (C, cmpl(stop=[None]), 400, INVALID),
    # stop_token_ids: at most 64, inside the vocabulary (257 ids)
    (C, cmpl(stop_token_ids=[257]), 400, INVALID),
    (C, cmpl(stop_token_ids=[-1]), 400, INVALID),
    (C, cmpl(stop_token_ids=list(range(65))), 400, INVALID),
    (C, cmpl(stop_token_ids=[1] * 100_000), 400, INVALID),
    (C, cmpl(stop_token_ids=[BIG]), 400, INVALID),
    (CH, chat(stop_token_ids=["a"]), 400, INVALID),
    # fields that would change the output, which this server does not implement
    # logit_bias: token ids inside the vocabulary (257 ids), values in [-100, 100], at most 300 entries
    (C, cmpl(logit_bias={"1": 101}), 400, INVALID),
    (CH, chat(logit_bias={"1": -100.5}), 400, INVALID),
    (C, cmpl(logit_bias={"257": 5}), 400, INVALID),
    (C, cmpl(logit_bias={"-1": 5}), 400, INVALID),
    (CH, chat(logit_bias={"x": 5}), 400, INVALID),
    # keys int() would take but that are not decimal token ids ("²" made int() raise where
    # isdigit() passed it: a 500)
    (C, cmpl(logit_bias={"²": 1}), 400, INVALID),
    (C, cmpl(logit_bias={"5_0": 1}), 400, INVALID),
    (CH, chat(logit_bias={"+5": 1}), 400, INVALID),
    (C, cmpl(logit_bias={"１": 1}), 400, INVALID),
    (C, raw('{"prompt": "Hi", "logit_bias": {"1": NaN}}'), 400, INVALID),
    (C, cmpl(logit_bias={str(i): 1 for i in range(301)}), 400, INVALID),
    (CH, chat(logit_bias="garbage"), 400, INVALID),
    (CH, chat(logit_bias={str(i): 1 for i in range(5000)}), 400, INVALID),
    # tools: well-formed function tools; a tool_choice needs tools, and a named one one of them
    (CH, chat(tools=[{"type": "function", "function": {"name": "bad name"}}]), 400, INVALID),
    (CH, chat(tools=[{"type": "code_interpreter"}]), 400, INVALID),
    (CH, chat(tools=[TOOL, TOOL]), 400, INVALID),
    (CH, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), 400, INVALID),
    (CH, chat(tools=[TOOL], tool_choice="sometimes"), 400, INVALID),
    (CH, chat(tool_choice="auto"), 400, INVALID),
    (CH, chat(tool_choice="required"), 400, INVALID),
    (CH, chat(tool_choice={"type": "function", "function": {"name": "f"}}), 400, INVALID),
    # structured output: one well-formed constraint (a schema that does not compile: test_structured_output_server.py)
    (CH, chat(response_format={"type": "xml"}), 400, INVALID),
    (CH, chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400, INVALID),
    (CH, chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a"}), 400, INVALID),
    (C, cmpl(structured_outputs={"regex": "a", "choice": ["a"]}), 400, INVALID),
    (C, cmpl(structured_outputs={"choice": []}), 400, INVALID),
    (C, cmpl(structured_outputs={"json": "{not json"}), 400, INVALID),
    (CH, chat(functions=[{"name": "f"}]), 400, INVALID),
    (CH, chat(function_call="auto"), 400, INVALID),
    (C, cmpl(guided_json={"type": "object"}), 400, INVALID),
    (CH, chat(guided_regex="a+"), 400, INVALID),
    (CH, chat(guided_decoding_backend="outlines"), 400, INVALID),
    (C, cmpl(suffix="x"), 400, INVALID),
    (C, cmpl(best_of=3), 400, INVALID),
    # vLLM's fields that change the output and are not implemented: a 400, never ignored
    # beam search ranks by raw logprobs: sampling fields it would ignore are a 400
    (C, cmpl(use_beam_search=True, stream=True), 400, INVALID),
    (CH, chat(use_beam_search=True, top_k=5), 400, INVALID),
    (CH, chat(use_beam_search=True, logit_bias={"1": 5}), 400, INVALID),
    (C, cmpl(use_beam_search=True, echo=True, logprobs=1), 400, INVALID),
    (C, cmpl(use_beam_search=True, n=11), 400, INVALID),
    (CH, chat(use_beam_search=True, length_penalty=float("nan")), 400, INVALID),
    (CH, chat(bad_words=["x"] * 17), 400, INVALID),
    (CH, chat(bad_words=["  "]), 400, INVALID),
    (C, cmpl(logits_processors=["my.module:Processor"]), 400, INVALID),
    (C, cmpl(vllm_xargs={"my_plugin": 1}), 400, INVALID),
    (CH, chat(add_special_tokens=True), 400, INVALID),
    (C, cmpl(spaces_between_special_tokens=False), 400, INVALID),
    (C, cmpl(prompt_embeds="AAAA"), 400, INVALID),
    # allowed_token_ids: a non-empty list inside the vocabulary
    (C, cmpl(allowed_token_ids=[]), 400, INVALID),
    (C, cmpl(allowed_token_ids=[257]), 400, INVALID),
    (C, cmpl(allowed_token_ids=[5] * 4097), 400, INVALID),
    (CH, chat(allowed_token_ids=[-1]), 400, INVALID),
    (CH, chat(allowed_token_ids="5"), 400, INVALID),
    # truncate_prompt_tokens: -1 or 1..max_model_len (128)
    (C, cmpl(truncate_prompt_tokens=0), 400, INVALID),
    (C, cmpl(truncate_prompt_tokens=-2), 400, INVALID),
    (CH, chat(truncate_prompt_tokens=129), 400, INVALID),
    # continue_final_message leaves the last turn open: no generation prompt after it
    (CH, chat(continue_final_message=True), 400, INVALID),
    (TOK, {"messages": U, "continue_final_message": True}, 400, INVALID),
    (C, cmpl(prompt_logprobs=21), 400, INVALID),
    (C, cmpl(prompt_logprobs=-1), 400, INVALID),
    (C, cmpl(prompt_logprobs=1, stream=True), 400, INVALID),
    (CH, chat(prompt_logprobs=1, stream=True), 400, INVALID),
    (C, cmpl(max_tokens=0), 400, INVALID),  # max_tokens=0 only with echo
    # messages: known roles; system, developer, user and tool turns need content
    (CH, msg("user"), 400, INVALID),
    (CH, msg("user", content=None), 400, INVALID),
    (CH, msg("system"), 400, INVALID),
    (CH, msg("developer"), 400, INVALID),
    (CH, msg("tool"), 400, INVALID),
    (CH, msg("wizard", content="Hi"), 400, INVALID),
    (CH, msg("function", content="Hi"), 400, INVALID),
    (CH, msg("", content="Hi"), 400, INVALID),
    (CH, msg(5, content="Hi"), 400, INVALID),
    (CH, chat(messages="Hi"), 400, INVALID),
    (CH, chat(messages=[]), 400, INVALID),
    (CH, msg("user", content=[{"type": "text", "text": 123}]), 400, INVALID),
    (CH, msg("user", content=[{"type": "image_url", "image_url": {"url": "http://x"}}]), 400, INVALID),
    (CH, msg("user", content="Hi", name="n" * 257), 400, INVALID),
    # no client code: the template is the operator's
    (CH, chat(chat_template_kwargs={"chat_template": "{% for i in range(10**9) %}x{% endfor %}"}), 400, INVALID),
    (CH, chat(chat_template="{{ 7 * 7 }}"), 400, INVALID),
    (CH, chat(chat_template_kwargs={"foo": 1}), 400, INVALID),
    (CH, chat(chat_template_kwargs={"add_generation_prompt": False}), 400, INVALID),
    (CH, chat(chat_template_kwargs={"enable_thinking": {"nested": [1, 2, 3]}}), 400, INVALID),
    (CH, chat(chat_template_kwargs={"reasoning_effort": "x" * 300}), 400, INVALID),
    (CH, chat(chat_template_kwargs="not a dict"), 400, INVALID),
    # model names: clipped in the 404, lone surrogates a clean 400
    (C, cmpl(model="m" * 200_000), 404, INVALID),
    (CH, chat(model="gpt-17"), 404, INVALID),
    (C, raw('{"prompt": "Hi", "model": "\\ud800"}'), 400, INVALID),
    (CH, raw('{"model": "\\udfff", "messages": [{"role": "user", "content": "Hi"}]}'), 400, INVALID),
    (C, raw('{"prompt": "Hi \\ud800 there"}'), 400, INVALID),
    (CH, raw('{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400, INVALID),
    (C, raw('{"prompt": "Hi", "user": "\\ud800"}'), 400, INVALID),
    (C, cmpl(model=123), 400, INVALID),
    # integers within int64
    (C, cmpl(max_tokens=BIG), 400, INVALID),
    (C, cmpl(top_k=BIG), 400, INVALID),
    (C, cmpl(priority=BIG), 400, INVALID),
    (C, cmpl(min_tokens=BIG), 400, INVALID),
    (CH, chat(max_completion_tokens=BIG), 400, INVALID),
    (C, cmpl(logprobs=21), 400, INVALID),
    (CH, chat(logprobs=True, top_logprobs=21), 400, INVALID),
    (C, cmpl(prompt=[72, BIG]), 400, INVALID),
    (C, cmpl(prompt=[72] * 200), 400, INVALID),  # over max_model_len (128)
    (C, cmpl(prompt=[[72]] * 3 + [[999]]), 400, INVALID),  # outside the vocabulary
    # malformed bodies
    (C, raw('{"prompt": '), 400, INVALID),
    (C, raw('[1, 2]'), 400, INVALID),
    (C, cmpl(stream_options={"include_usage": True}), 400, INVALID),
    # tokenizer routes: capped, validated
    (TOK, {"prompt": "x" * 1_000_001}, 400, INVALID),
    (TOK, {"messages": [{"role": "user"}]}, 400, INVALID),
    (TOK, {"prompt": "Hi", "messages": U}, 400, INVALID),
    (TOK, {"prompt": "Hi", "model": "nope"}, 404, INVALID),
    (TOK, raw('{"prompt": "\\ud800"}'), 400, INVALID),
    (DETOK, {"tokens": [1] * 131_073}, 400, INVALID),
    (DETOK, {"tokens": [BIG]}, 400, INVALID),
    (DETOK, {"tokens": [257]}, 400, INVALID),
]
