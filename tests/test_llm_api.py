"""The offline LLM API on the embedded model: input forms, validation, seeds, metrics."""
import pytest

from inflight import LLM, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", kv_cache_memory=32 * 2**20, max_model_len=256, max_num_batched_tokens=256)


def test_chat_answers_paris(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text
    m = out[0].metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_chat_continues_the_final_message(llm):
    tok = llm.get_tokenizer()
    msgs = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is"}]
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    out = llm.chat(msgs, sp, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    assert tok.decode(out[0].prompt_token_ids).endswith("assistant\nThe capital of France is")
    by_ids = llm.generate(prompt_token_ids=[out[0].prompt_token_ids], sampling_params=sp, use_tqdm=False)
    assert out[0].outputs[0].token_ids == by_ids[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(msgs, sp, use_tqdm=False, continue_final_message=True)


def test_chat_passes_tools_and_template_arguments(llm):
    tok = llm.get_tokenizer()
    template = "{{ greeting }} {{ tools | length }} tools{% for m in messages %} {{ m['content'] }}{% endfor %}"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    out = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=1),
                   use_tqdm=False, chat_template=template, tools=tools, chat_template_kwargs={"greeting": "Hello"})
    assert tok.decode(out[0].prompt_token_ids) == "Hello 1 tools Hi"


def test_input_forms_and_order(llm):
    tok = llm.get_tokenizer()
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    texts = ["Hello", "The sky is", "One two three"]
    by_text = llm.generate(texts, sp, use_tqdm=False)
    ids = [tok(t).input_ids for t in texts]
    by_ids = llm.generate(prompt_token_ids=ids, sampling_params=sp, use_tqdm=False)
    by_dict = llm.generate([{"prompt_token_ids": i} for i in ids], sp, use_tqdm=False)
    single = llm.generate("The sky is", sp, use_tqdm=False)
    assert [o.prompt for o in by_text] == texts
    assert [o.outputs[0].token_ids for o in by_text] == [o.outputs[0].token_ids for o in by_ids]
    assert [o.outputs[0].token_ids for o in by_ids] == [o.outputs[0].token_ids for o in by_dict]
    assert single[0].outputs[0].token_ids == by_text[1].outputs[0].token_ids
    per_prompt = llm.generate(texts, [SamplingParams(temperature=0.0, max_tokens=n) for n in (1, 2, 3)],
                              use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in per_prompt] == [1, 2, 3]
    assert all(o.outputs[0].finish_reason == "length" for o in per_prompt)


def test_seed_gives_same_tokens_alone_and_in_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=12)
    alone = llm.generate("Tell me about cats.", seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=n) for n in (5, 12, 9)]
    batch = llm.generate(["Write a poem.", "Tell me about cats.", "Numbers: 1, 2,", "Hi"],
                         [others[0], seeded, others[1], others[2]], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other_seed = llm.generate("Tell me about cats.", SamplingParams(temperature=1.0, top_p=0.95, seed=99,
                                                                    max_tokens=12), use_tqdm=False)
    assert other_seed[0].outputs[0].token_ids != alone


def test_stop_strings_and_stop_token_ids(llm):
    sp = SamplingParams(temperature=0.0, max_tokens=16)
    base = llm.generate("1, 2, 3, 4, 5,", sp, use_tqdm=False)[0].outputs[0]
    assert " 7" in base.text
    stopped = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0.0, max_tokens=16, stop=[" 7"]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == " 7"
    assert stopped.text == base.text[:base.text.index(" 7")]
    tok_stop = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0.0, max_tokens=16,
                                                             stop_token_ids=[base.token_ids[2]]),
                            use_tqdm=False)[0].outputs[0]
    assert tok_stop.token_ids == base.token_ids[:3] and tok_stop.stop_reason == base.token_ids[2]
    # as vLLM, the stop token is not part of the text, with special tokens kept or not
    text = llm.get_tokenizer().decode(base.token_ids[:2])
    assert tok_stop.text == text
    kept = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0.0, max_tokens=16, skip_special_tokens=False,
                                                         stop_token_ids=[base.token_ids[2]]), use_tqdm=False)
    assert kept[0].outputs[0].text == text


@pytest.mark.parametrize("make, match", [
    (lambda llm: llm.generate("", SamplingParams(max_tokens=4), use_tqdm=False), "empty"),
    (lambda llm: llm.generate("hi " * 300, SamplingParams(max_tokens=4), use_tqdm=False), "max_model_len"),
    (lambda llm: llm.generate("hi", SamplingParams(max_tokens=256), use_tqdm=False), "max_model_len"),
    (lambda llm: SamplingParams(max_tokens=0), "max_tokens"),
    (lambda llm: SamplingParams(temperature=-0.5), "temperature"),
    (lambda llm: SamplingParams(top_p=0.0), "top_p"),
    (lambda llm: SamplingParams(top_p=1.5), "top_p"),
])
def test_bad_input_raises_value_error_and_engine_keeps_serving(llm, make, match):
    with pytest.raises(ValueError, match=match):
        make(llm)
    eng = llm.llm_engine
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.kv.num_free_blocks == eng.num_blocks
    out = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_prompt_larger_than_kv_pool_is_rejected():
    small = LLM(dtype="float32", num_gpu_blocks_override=4, block_size=16, max_model_len=512)
    with pytest.raises(ValueError, match="4 blocks"):
        small.generate("word " * 100, SamplingParams(max_tokens=4), use_tqdm=False)
    out = small.generate("Hello", SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length"


def test_truncate_prompt_tokens_keeps_the_last_tokens_offline(llm):
    from inflight.errors import InvalidRequestError

    tok = llm.get_tokenizer()
    prompt = "one two three four five six seven eight"
    ids = tok(prompt).input_ids
    sp = SamplingParams(temperature=0.0, max_tokens=3, truncate_prompt_tokens=3)
    out = llm.generate(prompt, sp, use_tqdm=False)[0]
    assert out.prompt_token_ids == ids[-3:] and out.prompt is None
    ref = llm.generate(prompt_token_ids=[ids[-3:]], sampling_params=SamplingParams(temperature=0.0, max_tokens=3),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        llm.generate(prompt, SamplingParams(max_tokens=1, truncate_prompt_tokens=10_000), use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)
