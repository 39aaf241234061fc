"""Data parallelism: the prefix-cache-aware router alone (fast), then one DP=2 server
on a tiny random model driven by the openai client: exact greedy streams, shared
prefixes on one replica, aborts freeing blocks, and a dead replica."""
from __future__ import annotations

import asyncio
import random
import time

import httpx
import openai
import pytest

from inflight.core.kv_cache_manager import hash_block_tokens
from inflight.engine.dp.router import PrefixAwareRouter
from test_server import metric

MODEL = "tiny-dp"
BS = 16


# ------------------------------------------------------------------ router
def test_router_hashes_are_the_kv_managers():
    router = PrefixAwareRouter(2, BS)
    ids = list(range(40))
    first = hash_block_tokens(None, ids[:16], "salt")
    assert router.prompt_hashes(ids, "salt") == [first, hash_block_tokens(first, ids[16:32])]
    assert router.prompt_hashes(ids) != router.prompt_hashes(ids, "salt")


def test_router_keeps_a_prefix_on_its_replica_before_any_report():
    router = PrefixAwareRouter(2, BS)
    prefix = list(range(100, 148))
    chosen = []
    for i in range(4):  # all in flight together: nothing reported yet
        hashes = router.prompt_hashes(prefix + [i, i])
        d = router.choose(hashes, 50)
        router.on_routed(f"a{i}", d.replica, hashes)
        chosen.append(d)
    assert {d.replica for d in chosen} == {chosen[0].replica}
    assert chosen[0].reason == "load" and all(d.reason == "prefix" and d.matched_blocks == 3 for d in chosen[1:])
    other = router.choose(router.prompt_hashes(list(range(300, 350))), 50)
    assert other.replica != chosen[0].replica and other.reason == "load"


def test_router_follows_reports_and_balances_load():
    router = PrefixAwareRouter(2, BS, balance_abs_threshold=2)
    hashes = router.prompt_hashes(list(range(64)))
    router.apply_cache_delta(1, hashes, [])
    assert router.choose(hashes, 64) == router.choose(hashes, 64)
    assert router.choose(hashes, 64).replica == 1 and router.choose(hashes, 64).matched_blocks == 3
    for i in range(3):  # replica 1 gets busy: past the threshold the idle replica takes the prefix
        router.on_routed(f"r{i}", 1, [])
    assert router.choose(hashes, 64).reason == "balance" and router.choose(hashes, 64).replica == 0
    router.on_finished("r0")
    assert router.choose(hashes, 64).replica == 1
    router.apply_cache_delta(1, [], hashes[1:])  # evicted: only the first block is left
    assert router.choose(hashes, 64).matched_blocks == 1
    assert router.mark_dead(1) == ["r1", "r2"]
    assert router.choose(hashes, 64).replica == 0


def _outputs_of_a_request() -> list:
    """Cumulative outputs of one n=2 request over four steps, as the engine makes them: sample 0
    stops on a stop string (its final text is cut, not the sum of its pieces), sample 1 runs on."""
    from inflight.outputs import CompletionOutput, Logprob, RequestOutput

    def lp(t):
        return {t: Logprob(-0.5, 1, chr(t))}

    steps = [([(65, "A")], [(66, "B")]), ([(67, "C")], [(68, "D")]), ([(69, "E!")], [(70, "F")]),
             ([], [(71, "G")])]
    acc = [CompletionOutput(0, logprobs=[]), CompletionOutput(1, logprobs=[])]
    outs = []
    for k, step in enumerate(steps):
        comps = []
        for c, new in zip(acc, step):
            if c.finish_reason is None:
                c.token_ids, c.logprobs = c.token_ids + [t for t, _ in new], c.logprobs + [lp(t) for t, _ in new]
                c.delta_token_ids, c.delta_text = [t for t, _ in new], "".join(x for _, x in new)
                c.delta_logprobs = [lp(t) for t, _ in new]
                c.text += c.delta_text
            else:
                c.delta_token_ids, c.delta_text, c.delta_logprobs = [], "", None
            if c.index == 0 and k == 2:
                c.text, c.finish_reason, c.stop_reason = "ACE", "stop", "!"
            if c.index == 1 and k == 3:
                c.finish_reason = "length"
            comps.append(CompletionOutput(c.index, c.text, list(c.token_ids), -0.5 * len(c.token_ids),
                                          list(c.logprobs), c.finish_reason, c.stop_reason, c.delta_text,
                                          list(c.delta_token_ids), c.delta_logprobs))
        outs.append(RequestOutput("r", "p", [5, 6, 7], comps, k == 3, prompt_logprobs=[None, lp(6), lp(7)]))
    return outs


def test_outputs_travel_small_and_arrive_whole():
    import pickle

    from inflight.engine.dp.wire import OutputDecoder, OutputEncoder

    encoder, decoder = OutputEncoder(), OutputDecoder()
    decoder.add("r", [5, 6, 7])
    for original in _outputs_of_a_request():
        sent = pickle.loads(pickle.dumps(encoder.encode(original)))
        assert sent.prompt_token_ids == []
        unfinished = [c for c in sent.outputs if c.finish_reason is None]
        assert all(len(c.token_ids) <= 1 for c in unfinished)  # only what the step added
        assert decoder.decode(sent) == original


def test_data_parallel_size_flag_and_limits():
    from inflight import LLM
    from inflight.config import EngineConfig
    from inflight.entrypoints.cli import build_parser

    assert build_parser().parse_args(["serve", "--data-parallel-size", "2"]).data_parallel_size == 2
    assert EngineConfig.from_kwargs(data_parallel_size=2).parallel_config.data_parallel_size == 2
    with pytest.raises(ValueError, match="data_parallel_size"):
        EngineConfig.from_kwargs(data_parallel_size=0)
    with pytest.raises(ValueError, match="inflight serve --data-parallel-size"):
        LLM(data_parallel_size=2)  # refused before any model loads


def test_replicas_get_their_own_cores_and_devices():
    import os

    from inflight.platforms.placement import split_devices, split_host_cores

    cores = sorted(os.sched_getaffinity(0))
    placements = split_host_cores(2)
    if len(cores) >= 2:
        assert [len(p.cpus) for p in placements] == [len(cores) // 2] * 2
        assert not set(placements[0].cpus) & set(placements[1].cpus)
    assert split_devices(["0", "1", "2", "3"], 2) == [["0", "1"], ["2", "3"]]
    assert split_devices(["4", "6"], 2) == [["4"], ["6"]]
    with pytest.raises(ValueError, match="a device per replica"):
        split_devices(["0"], 2)


# ------------------------------------------------------------------ server
def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randint(8, 40))] for _ in range(n)]


ENGINE_KWARGS = dict(dtype="float32", kv_cache_memory=4 * 2**20, max_num_seqs=64, max_model_len=4096)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from inflight.loader.testing import tiny_model, write_tiny_gguf

    path = str(tmp_path_factory.mktemp("dp") / "tiny.gguf")
    write_tiny_gguf(path, tiny_model("llama"))
    return path


@pytest.fixture(scope="module")
def server(tiny_gguf):
    from inflight.engine.dp import DPEngineClient
    from inflight.entrypoints.openai.server_thread import ServerThread

    dp = DPEngineClient(dict(ENGINE_KWARGS, model=tiny_gguf, served_model_name=MODEL), data_parallel_size=2)
    with ServerThread(dp, MODEL, log_stats=False) as srv:
        srv.dp = dp
        yield srv


def scrape(server) -> str:
    return httpx.get(server.base_url + "/metrics").text


def routed_to(before: str, after: str) -> dict[str, float]:
    """Requests the router sent to each replica between two scrapes."""
    return {e: metric(after, "inflight:router_requests_total", engine=e)
            - metric(before, "inflight:router_requests_total", engine=e) for e in ("0", "1")}


@pytest.mark.slow
def test_64_concurrent_streams_equal_one_engine(server, tiny_gguf):
    from inflight.engine.llm_engine import LLMEngine
    from inflight.sampling_params import SamplingParams

    prompts = _prompts(64)
    engine = LLMEngine.from_kwargs(**ENGINE_KWARGS, model=tiny_gguf)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=8))
    ref: dict[str, str] = {}
    while engine.has_unfinished_requests():
        ref.update({o.request_id: o.outputs[0].text for o in engine.step() if o.finished})
    del engine

    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)

    async def one(p):
        chunks = await client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in chunks if c.choices])

    async def all_of():
        return await asyncio.gather(*(one(p) for p in prompts))

    before = scrape(server)
    texts = asyncio.run(all_of())
    assert texts == [ref[str(i)] for i in range(64)]
    routed = routed_to(before, scrape(server))
    assert sum(routed.values()) == 64 and min(routed.values()) > 0  # both replicas served


@pytest.mark.slow
def test_shared_prefix_lands_on_one_replica_and_hits_its_cache(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    rng = random.Random(7)
    for group in range(2):
        prefix = [rng.randrange(3, 250) for _ in range(3 * BS)]
        suffixes = [[rng.randrange(3, 250) for _ in range(5)] for _ in range(6)]
        before = scrape(server)
        client.completions.create(model=MODEL, prompt=prefix + suffixes[0], max_tokens=2, temperature=0)
        with_prefix = scrape(server)

        async def rest():
            c = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
            await asyncio.gather(*(c.completions.create(model=MODEL, prompt=prefix + s, max_tokens=2, temperature=0)
                                   for s in suffixes[1:]))

        asyncio.run(rest())
        after = scrape(server)
        first = max(routed_to(before, with_prefix).items(), key=lambda kv: kv[1])[0]
        other = "1" if first == "0" else "0"
        assert routed_to(with_prefix, after) == {first: 5.0, other: 0.0}
        assert metric(after, "inflight:router_requests_total", engine=first, reason="prefix") \
            - metric(with_prefix, "inflight:router_requests_total", engine=first, reason="prefix") == 5
        hits = {e: metric(after, "inflight:prefix_cache_hits_total", engine=e)
                - metric(with_prefix, "inflight:prefix_cache_hits_total", engine=e) for e in (first, other)}
        assert hits == {first: 5 * 3 * BS, other: 0.0}  # every later request found the whole prefix there


def _wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _start_long_stream(server) -> tuple[httpx.Client, object, str]:
    """A long streaming request, read until its first tokens arrived; returns it and its replica."""
    before = scrape(server)
    http = httpx.Client(timeout=60)
    body = {"model": MODEL, "prompt": list(range(10, 50)), "max_tokens": 4000, "ignore_eos": True, "stream": True}
    response = http.send(http.build_request("POST", server.base_url + "/v1/completions", json=body), stream=True)
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data:"))
    replica = max(routed_to(before, scrape(server)).items(), key=lambda kv: kv[1])[0]
    return http, (response, lines), replica


@pytest.mark.slow
def test_disconnect_aborts_on_its_replica_and_frees_its_blocks(server):
    before = scrape(server)
    http, (response, _), replica = _start_long_stream(server)
    assert metric(scrape(server), "inflight:kv_cache_usage_perc", engine=replica) > 0
    response.close()
    http.close()

    def freed() -> bool:
        text = scrape(server)
        return metric(text, "inflight:kv_cache_usage_perc", engine=replica) == 0 \
            and metric(text, "inflight:num_requests_running", engine=replica) == 0

    _wait_for(freed)
    after = scrape(server)
    aborted = metric(after, "inflight:request_success_total", engine=replica, finished_reason="abort") \
        - metric(before, "inflight:request_success_total", engine=replica, finished_reason="abort")
    assert aborted == 1 and server.dp.num_unfinished == 0


@pytest.mark.slow
@pytest.mark.slow
def test_the_server_sees_what_the_replicas_kv_pools_hold(tiny_gguf):
    # a 2,048-token pool under a 4,096-token context: a chat request without max_tokens gets
    # what the pool holds, as on one engine (the replicas report it)
    from inflight.engine.dp import DPEngineClient
    from inflight.entrypoints.openai.server_thread import ServerThread

    kwargs = dict(ENGINE_KWARGS, kv_cache_memory=2**20, model=tiny_gguf, served_model_name=MODEL)
    dp = DPEngineClient(kwargs, data_parallel_size=2)
    with ServerThread(dp, MODEL, log_stats=False) as srv:
        assert srv.state.max_sequence_tokens == 2048 < srv.state.max_model_len
    assert not dp.is_alive


def test_replicas_as_ray_actors_serve_the_same_tokens(tiny_gguf):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'inflight[ray]')")
    from inflight.engine.dp import DPEngineClient
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread
    from inflight.sampling_params import SamplingParams

    prompts = _prompts(8, seed=1)
    engine = LLMEngine.from_kwargs(**ENGINE_KWARGS, model=tiny_gguf)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=6))
    ref: dict[str, str] = {}
    while engine.has_unfinished_requests():
        ref.update({o.request_id: o.outputs[0].text for o in engine.step() if o.finished})
    del engine

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        dp = DPEngineClient(dict(ENGINE_KWARGS, model=tiny_gguf, data_parallel_backend="ray"), data_parallel_size=2)
        with ServerThread(dp, MODEL, log_stats=False) as srv:
            client = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=120)

            async def all_of():
                return await asyncio.gather(*(client.completions.create(model=MODEL, prompt=p, max_tokens=6,
                                                                        temperature=0) for p in prompts))

            texts = [r.choices[0].text for r in asyncio.run(all_of())]
            routed = routed_to("", scrape(srv))
    finally:
        ray.shutdown()
    assert texts == [ref[str(i)] for i in range(8)]
    assert sum(routed.values()) == 8 and min(routed.values()) > 0


@pytest.mark.slow
def test_a_dead_replica_fails_its_requests_and_health(server):
    """Last in this module: it kills a replica (the server then exits, as after any engine crash)."""
    from fastapi.testclient import TestClient

    http, (response, lines), replica = _start_long_stream(server)
    server.dp.replicas[int(replica)].process.kill()
    rest = [line for line in lines if line.startswith("data:")]
    assert any('"engine_dead"' in line for line in rest)  # reported in-band, then [DONE]
    response.close()
    http.close()
    assert not server.dp.is_alive and server.dp.num_unfinished == 0
    health = TestClient(server.app).get("/health")  # no lifespan: the app's handler on the same state
    assert health.status_code == 503
