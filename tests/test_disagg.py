"""Prefill/decode disaggregation: a producer engine computes the prompt and the first
token, a consumer engine pulls the prompt's KV over gloo and decodes; greedy float32
output equals one plain engine's, the consumer computes only the last prompt token,
and every block returns to both pools (aborts and never-pulled requests included).

Engines here run in this process on a tiny random model; the servers and the proxy
end to end are in test_disagg_e2e.py."""
from __future__ import annotations

import time

import pytest
import transformers

from inflight.engine.llm_engine import LLMEngine
from inflight.loader.testing import tiny_model, write_tiny_gguf
from inflight.sampling_params import SamplingParams

BLOCK = 4
MAX_TOKENS = 6
SHARED = [7 + (5 * j) % 240 for j in range(22)]  # five full blocks and a part
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(30 + 9 * i)] for i in range(2)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201, 202, 203, 204, 205, 206]]


def tiny_checkpoint(folder: str) -> str:
    """A 2-layer random Llama with a byte-level tokenizer, long enough for many-block prompts."""
    model = tiny_model("llama", seed=5)
    model.config.max_position_embeddings = 1024
    model.save_pretrained(folder)
    write_tiny_gguf(f"{folder}/tok.gguf", None)
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def engines(folder):
    kw = dict(model=folder, dtype="float32", kv_cache_memory=4 * 2**20, block_size=BLOCK)
    plain = LLMEngine.from_kwargs(**kw)
    producer = LLMEngine.from_kwargs(**kw, kv_transfer_config={
        "kv_role": "kv_producer", "kv_port": 0, "kv_connector_extra_config": {"abort_timeout_s": 1.0}})
    consumer = LLMEngine.from_kwargs(**kw, kv_transfer_config={"kv_role": "kv_consumer"})
    return plain, producer, consumer


def greedy(max_tokens: int, kv: dict | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens,
                          extra_args={"kv_transfer_params": kv} if kv is not None else None)


def finish(engine: LLMEngine, rid: str, prompt: list[int], params: SamplingParams):
    engine.add_request(rid, prompt, params)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return out


def prefill(producer: LLMEngine, rid: str, prompt: list[int]) -> dict:
    out = finish(producer, rid, prompt, greedy(1, {"do_remote_decode": True}))
    assert len(out.outputs[0].token_ids) == 1
    return producer.kv_connector.kv_transfer_params(rid)


def decode(producer: LLMEngine, consumer: LLMEngine, rid: str, prompt: list[int], kv: dict):
    """Step both engines (the producer serves the pull) until the consumer's request ends;
    returns its output and the tokens the consumer computed meanwhile."""
    consumer.add_request(rid, prompt, greedy(MAX_TOKENS, kv))
    computed, result = 0, None
    while result is None:
        if producer is not consumer and producer.has_unfinished_requests():
            producer.step()
        for out in consumer.step():
            if out.finished:
                result = out
        computed += consumer.last_num_scheduled_tokens
    return result, computed


def assert_all_free(*engines: LLMEngine) -> None:
    for e in engines:
        e.scheduler.check_integrity()
        assert e.scheduler.kv.num_free_blocks == e.scheduler.kv.num_blocks
        assert not e.has_unfinished_requests()


def test_disaggregated_greedy_equals_plain_and_decode_computes_only_the_last_prompt_token(engines):
    plain, producer, consumer = engines
    for i, prompt in enumerate(PROMPTS):
        ref = finish(plain, f"plain-{i}", prompt, greedy(MAX_TOKENS)).outputs[0].token_ids
        moved = consumer.stats()["kv_transfer_tokens"]
        kv = prefill(producer, f"p-{i}", prompt)
        out, computed = decode(producer, consumer, f"d-{i}", prompt, kv)
        assert out.outputs[0].token_ids == ref
        assert computed == MAX_TOKENS  # the last prompt token, then one token per step
        moved = consumer.stats()["kv_transfer_tokens"] - moved
        # the second prompt of a shared prefix pulls only the blocks the consumer lacks
        expect = len(prompt) - 1 - (20 if i == 3 else 0)
        assert moved == expect
    assert consumer.stats()["kv_transfer_failures"] == 0
    assert producer.stats()["kv_transfer_blocks_sent"] > 0
    assert_all_free(producer, consumer)


def test_pull_of_an_unknown_request_falls_back_to_computing_the_prompt(engines):
    plain, producer, consumer = engines
    prompt = [3 + (17 * j) % 240 for j in range(37)]
    ref = finish(plain, "plain-unknown", prompt, greedy(MAX_TOKENS)).outputs[0].token_ids
    kv = {**producer.kv_connector.kv_transfer_params("never-prefilled")}
    out, computed = decode(producer, consumer, "d-unknown", prompt, kv)
    assert out.outputs[0].token_ids == ref
    assert computed == len(prompt) + MAX_TOKENS - 1  # the whole prompt computed here
    assert consumer.stats()["kv_transfer_failures"] == 1
    assert_all_free(producer, consumer)


def test_consumer_abort_releases_the_producers_blocks(engines):
    _, producer, consumer = engines
    prompt = [9 + (11 * j) % 230 for j in range(41)]
    kv = prefill(producer, "p-abort", prompt)
    assert producer.scheduler.kv.num_free_blocks < producer.scheduler.kv.num_blocks  # held for the pull
    # whether the pull went out before the abort (the producer frees after sending) or not
    # (it becomes a release), the producer's blocks come back
    consumer.add_request("d-abort", prompt, greedy(MAX_TOKENS, kv))
    consumer.abort_request("d-abort")
    deadline = time.monotonic() + 30
    while producer.has_unfinished_requests() and time.monotonic() < deadline:
        producer.step()
        if consumer.has_unfinished_requests():
            consumer.step()
    assert_all_free(producer, consumer)


def test_producer_frees_blocks_never_pulled_after_the_timeout(engines):
    _, producer, consumer = engines
    prefill(producer, "p-orphan", PROMPTS[0])
    assert producer.kv_connector.stats()["kv_transfer_held_requests"] == 1
    deadline = time.monotonic() + 30
    while producer.has_unfinished_requests() and time.monotonic() < deadline:
        producer.step()  # abort_timeout_s is 1 s here
    assert_all_free(producer)


def test_kv_transfer_config_is_checked():
    from inflight.config import EngineConfig

    cfg = EngineConfig.from_kwargs(kv_transfer_config='{"kv_role": "kv_consumer", "kv_port": 0}')
    assert cfg.kv_transfer_config.is_consumer and not cfg.kv_transfer_config.is_producer
    with pytest.raises(ValueError, match="kv_role"):
        EngineConfig.from_kwargs(kv_transfer_config='{"kv_role": "prefill"}')
    with pytest.raises(ValueError, match="unknown kv_transfer_config keys"):
        EngineConfig.from_kwargs(kv_transfer_config={"role": "kv_producer"})
    with pytest.raises(ValueError, match="not valid JSON"):
        EngineConfig.from_kwargs(kv_transfer_config="{kv_role: kv_producer}")


def test_a_kv_both_instance_pulls_from_itself(engines, folder):
    plain = engines[0]
    both = LLMEngine.from_kwargs(model=folder, dtype="float32", kv_cache_memory=4 * 2**20, block_size=BLOCK,
                                 enable_prefix_caching=False,  # else the prompt is all local prefix hits
                                 kv_transfer_config={"kv_role": "kv_both", "kv_port": 0})
    prompt = PROMPTS[1]
    ref = finish(plain, "plain-both", prompt, greedy(MAX_TOKENS)).outputs[0].token_ids
    kv = prefill(both, "p-both", prompt)
    out, computed = decode(both, both, "d-both", prompt, kv)
    assert out.outputs[0].token_ids == ref and computed == MAX_TOKENS
    assert both.stats()["kv_transfer_pulls"] == 1
    assert_all_free(both)


@pytest.mark.parametrize("bad, words", [
    ({"remote_port": [1]}, "remote_port"), ({"remote_port": "abc"}, "remote_port"),
    ({"remote_port": True}, "remote_port"), ({"remote_port": 70000}, "remote_port"),
    ({"remote_host": ""}, "remote_host"), ({"remote_host": 5}, "remote_host"),
    ({"remote_request_id": "x" * 300}, "remote_request_id"),
])
def test_a_pulls_address_from_the_client_is_checked(bad, words):
    # the decode side connects where a request says: a wrong type was a 500 from int()
    from inflight.distributed.kv_transfer.gloo_connector import check_remote_params

    good = {"remote_host": "10.0.0.2", "remote_port": 14579, "remote_request_id": "cmpl-1"}
    check_remote_params(good)
    with pytest.raises(ValueError, match=f"kv_transfer_params.{words}"):
        check_remote_params({**good, **bad})


def test_producer_channels_are_bounded_and_failed_ones_make_room():
    # each address a request names gets a channel and a thread: bogus ones must not pile up
    from inflight.distributed.kv_transfer.gloo_pipe import MAX_PRODUCERS, KVPullClient

    client = KVPullClient(timeout_s=1.0)
    channels = [client._channel("127.0.0.1", 1 + i) for i in range(MAX_PRODUCERS)]
    with pytest.raises(ValueError, match="producers"):
        client._channel("127.0.0.1", 9999)
    for ch in channels[:3]:
        ch.failed = True
    client._channel("127.0.0.1", 9999)
    assert len(client._channels) == MAX_PRODUCERS - 2
    for ch in client._channels.values():  # let the idle threads end
        ch.jobs.put(None)
