"""Structured output on the embedded SmolLM2-135M (float32, in-process LLM API),
in an engine made to preempt (swap, and recompute when the small host pool is full),
prefill in tiny chunks and speculate with n-gram drafts."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from inflight import LLM, SamplingParams
from inflight.sampling_params import StructuredOutputsParams as SO

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "pet": {"enum": ["cat", "dog", "none"]},
    "ok": {"type": "boolean"}},
    "required": ["name", "age", "pet", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    # ~270 KV tokens (45 KB a token in float32): a few requests at a time, the rest preempt;
    # 16-token prefill chunks; a 4-block host pool, so some preemptions swap and some recompute
    return LLM(dtype="float32", kv_cache_memory=12 * 2**20, max_model_len=256, max_num_batched_tokens=64,
               long_prefill_token_threshold=16, preemption_mode="swap", num_cpu_blocks_override=4,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4})


def chats(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Invent person number {i} and their pet, as JSON."}] for i in range(n)]


def test_json_schema_outputs_parse_and_validate_at_temperature_1(llm):
    sched = llm.llm_engine.scheduler
    before = sched.num_preemptions
    params = SamplingParams(temperature=1.0, max_tokens=48, seed=7, structured_outputs=SO(json=SCHEMA))
    outs = llm.chat(chats(6), params, use_tqdm=False)
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert sched.num_preemptions > before
    assert sched.num_swap_outs > 0
    assert sched.kv.num_free_blocks == sched.kv.num_blocks and not sched.requests


def test_drafts_are_checked_against_the_grammar(llm):
    # the prompt holds JSON that breaks the schema ("age" a string): n-gram drafts copy it,
    # and the grammar must cut them; the output equals the same request decoded without
    # drafts (a request asking for logprobs does not speculate)
    example = '{"name": "Bob", "age": "forty", "pet": "cat", "ok": true}'
    prompt = [{"role": "user", "content": f"Fix this JSON so age is a number: {example}"}]
    sched = llm.llm_engine.scheduler
    drafted = sched.num_draft_tokens
    so = SO(json=SCHEMA)
    spec = llm.chat([prompt], SamplingParams(temperature=0, max_tokens=48, structured_outputs=so), use_tqdm=False)
    plain = llm.chat([prompt], SamplingParams(temperature=0, max_tokens=48, logprobs=0, structured_outputs=so),
                     use_tqdm=False)
    assert sched.num_draft_tokens > drafted
    text = spec[0].outputs[0].text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert spec[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_choice_grammar_and_json_object(llm, temperature):
    cases = [
        (SO(regex=r"[A-Z][a-z]{2,6} [0-9]{2}"), lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", t)),
        (SO(choice=["red", "green", "blue"]), lambda t: t in ("red", "green", "blue")),
        (SO(grammar='root ::= ("yes" | "no") ", because " [a-z]{1,8} "."'),
         lambda t: re.fullmatch(r"(yes|no), because [a-z]{1,8}\.", t)),
        (SO(grammar='start: ANSWER "!"\nANSWER: "up" | "down"'), lambda t: t in ("up!", "down!")),
        (SO(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    ]
    prompts = [[{"role": "user", "content": "Answer briefly: what colour is the sky?"}]] * len(cases)
    params = [SamplingParams(temperature=temperature, max_tokens=40, seed=3, structured_outputs=so)
              for so, _ in cases]
    outs = llm.chat(prompts, params, use_tqdm=False)
    for (so, check), o in zip(cases, outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop" and check(c.text), (so, c.text)


def test_each_sample_has_its_own_matcher_and_abort_frees_it(llm):
    engine = llm.llm_engine
    outs = llm.generate(["My favourite number:"], SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=1,
                                                                   structured_outputs=SO(regex=r"[0-9]{3}")),
                        use_tqdm=False)
    assert len(outs[0].outputs) == 3
    assert all(re.fullmatch(r"[0-9]{3}", c.text) for c in outs[0].outputs)
    engine.add_request("gone", "Some JSON:", SamplingParams(max_tokens=40, structured_outputs=SO(json=SCHEMA)))
    engine.step()
    req = engine.scheduler.requests["gone"]
    assert req.structured_output is not None
    engine.abort_request("gone")
    assert req.structured_output is None and not engine.has_unfinished_requests()
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_blocks


def test_min_tokens_yields_to_a_grammar_that_has_ended(llm):
    # the choice ends long before min_tokens; as in vLLM the request stops there, cleanly
    params = SamplingParams(temperature=0, min_tokens=20, max_tokens=30, structured_outputs=SO(choice=["red", "blue"]))
    (out,) = llm.generate(["My favourite colour is"], params, use_tqdm=False)[0].outputs
    assert out.finish_reason == "stop" and out.text in ("red", "blue")


def test_greedy_json_schema_output_is_the_same_with_the_fused_argmax_off(llm, monkeypatch):
    # greedy rows with a grammar take the argmax inside the packed lm_head GEMM over the
    # tokens their mask allows; with that path off, the logits are written, masked and argmax'ed
    model = llm.llm_engine.runner.model
    fused, masked_steps = model.greedy_tokens, []

    def spy(h, vocab_size, grammar=None):
        tokens = fused(h, vocab_size, grammar)
        if grammar is not None and tokens is not None:
            masked_steps.append(len(grammar.rows))
        return tokens

    params = [SamplingParams(temperature=0, max_tokens=16, structured_outputs=SO(json=SCHEMA)),
              SamplingParams(temperature=0, max_tokens=16)]  # an unconstrained row beside it
    monkeypatch.setattr(model, "greedy_tokens", spy)
    on = llm.chat(chats(2), params, use_tqdm=False)
    assert masked_steps
    monkeypatch.setattr(model, "greedy_tokens", lambda *args: None)
    off = llm.chat(chats(2), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off]
    assert on[0].outputs[0].text.startswith("{")
