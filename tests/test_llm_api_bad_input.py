"""The offline LLM API with no schema in front of it: wrong types and shapes are a
ValueError naming the argument (not an error from deep inside, nor a request that fails
later or stops a whole step), and every KV block is back in the pool afterwards."""
import numpy as np
import pytest

from inflight import LLM, SamplingParams
from inflight.sampling_params import BeamSearchParams

SP = SamplingParams(temperature=0.0, max_tokens=2)


@pytest.fixture(scope="module")
def llm():
    # a 2,048-token pool under the model's 8,192-token context
    return LLM(dtype="float32", kv_cache_memory=2048 * 45 * 1024, max_num_batched_tokens=256,
               scheduling_policy="priority")


def pool_is_free(llm) -> bool:
    s = llm.llm_engine.scheduler
    return s.kv.num_free_blocks == s.kv.num_blocks and not s.requests


@pytest.mark.parametrize("call, words", [
    (lambda llm: llm.generate({"prompt_token_ids": [1.5, 2.0, 3.7]}, SP), "integers"),
    (lambda llm: llm.generate({"prompt_token_ids": "abc"}, SP), "integers"),
    (lambda llm: llm.generate({"text": "hi"}, SP), '"prompt"'),
    (lambda llm: llm.generate(["a", "b"], SP, priority=[0, "x"]), "priority must be an integer"),
    (lambda llm: llm.generate(["a", "b"], SP, priority=[0, None]), "priority must be an integer"),
    (lambda llm: llm.generate(["a", "b"], SP, priority=[0]), "priority has 1 values for 2 prompts"),
    (lambda llm: llm.beam_search(["a"], BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=-1),
     "concurrency_limit"),
    (lambda llm: llm.beam_search(["a"], SamplingParams()), "BeamSearchParams"),
    (lambda llm: llm.generate(["a", "b"], [None, SP]), "sampling_params"),
    (lambda llm: llm.generate(["a", "b"], {"max_tokens": 3}), "SamplingParams"),
    (lambda llm: llm.generate(["a"], SP, lora_request="x"), "LoRARequest"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], SP, chat_template_kwargs={"tokenize": True}),
     "may not set tokenize"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi \ud800"}], SP), "surrogate"),
    (lambda llm: llm.score(None, "a"), "data_1 must be a text"),
    (lambda llm: llm.score("a", [1, 2]), "data_2 must be a text"),
])
def test_wrong_types_are_value_errors_naming_the_argument(llm, call, words):
    with pytest.raises(ValueError, match=words):
        call(llm)
    assert pool_is_free(llm)


def test_integer_arrays_are_token_ids_and_an_empty_beam_search_is_empty(llm):
    ids = np.array(llm.llm_engine.tokenizer("Hello").input_ids, dtype=np.int64)
    assert llm.generate({"prompt_token_ids": ids}, SP)[0].outputs[0].token_ids == \
        llm.generate({"prompt_token_ids": ids.tolist()}, SP)[0].outputs[0].token_ids
    assert llm.beam_search([], BeamSearchParams(beam_width=2, max_tokens=2)) == []
    assert pool_is_free(llm)


def test_max_tokens_none_is_what_the_pool_holds(llm):
    # the rest of the context would be 8,192 - 5 tokens, which this pool can never hold: refused
    # before; now the request may grow to what the pool holds
    engine = llm.llm_engine
    assert engine.max_sequence_tokens == engine.num_blocks * 16 < engine.max_model_len
    rid = engine.add_request(None, {"prompt_token_ids": [1, 2, 3, 4, 5]}, SamplingParams(max_tokens=None))
    req = engine.scheduler.requests[rid]
    assert req.sampling_params.max_tokens == engine.max_sequence_tokens - 5
    engine.abort_request([rid])
    assert pool_is_free(llm)
