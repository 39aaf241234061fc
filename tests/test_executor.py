"""Executors: a killed worker process fails the in-flight requests with an error within
seconds and ``/health`` answers 503 (the engine never hangs on the dead rank); the
Ray backend gives the mp backend's tokens on a local Ray instance."""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time

import httpx
import pytest

from inflight import LLM, SamplingParams
from inflight.entrypoints.openai.server_thread import ServerThread
from inflight.executor import Executor, ExecutorDeadError
from inflight.executor.multiproc import MultiprocExecutor
from inflight.executor.uniproc import UniProcExecutor
from test_tensor_parallel import tiny_folder

pytestmark = pytest.mark.slow

PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(3)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory, tie=True)  # tied: logits through the vocab-parallel embedding


@pytest.fixture(scope="module")
def reference(folder) -> list[list[int]]:
    llm = LLM(folder, dtype="float32")
    assert isinstance(llm.llm_engine.executor, UniProcExecutor)  # one rank: in process by default
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY,
                                                          use_tqdm=False)]


async def _health(app) -> int:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        return (await client.get("/health")).status_code


def test_the_backend_defaults_to_uni_for_one_rank_and_mp_for_more():
    from inflight.config import ParallelConfig

    assert Executor.get_class(ParallelConfig()) is UniProcExecutor
    assert Executor.get_class(ParallelConfig(tensor_parallel_size=2)) is MultiprocExecutor
    with pytest.raises(ValueError, match="'uni' runs one rank"):
        ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="uni").validate()


def test_a_killed_worker_fails_in_flight_requests_and_health_turns_503(folder, reference):
    llm = LLM(folder, dtype="float32", tensor_parallel_size=2)
    engine, executor = llm.llm_engine, llm.llm_engine.executor
    procs = list(executor.procs)
    got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY,
                                                         use_tqdm=False)]
    assert got == reference  # tied embeddings over two ranks
    real, calls, killed = executor.execute_model, itertools.count(), []

    def execute_model(sched):
        if next(calls) == 3:  # the request is in flight: prefill and two decodes done
            victim = executor.procs[1]
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
            killed.append(time.monotonic())
        return real(sched)

    executor.execute_model = execute_model
    try:
        with ServerThread(engine, "tiny", log_stats=False) as srv:
            assert httpx.get(srv.base_url + "/health").status_code == 200
            body = {"prompt": PROMPTS[0], "max_tokens": 60, "ignore_eos": True, "temperature": 0}
            r = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60)
            answered = time.monotonic()
            assert killed, "the worker was not killed while the request ran"
            assert r.status_code == 500 and r.json()["error"]["code"] == "engine_dead"
            assert answered - killed[0] < 10
            # the server drains and exits after a crash (a supervisor restarts it): ask its app directly
            assert asyncio.run(_health(srv.app)) == 503
            assert isinstance(srv.state.engine.crash, ExecutorDeadError)
    finally:
        executor.shutdown()
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)


def test_ray_backend_on_a_local_instance(folder, reference):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'inflight[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        llm = LLM(folder, dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")
        got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY,
                                                             use_tqdm=False)]
        llm.llm_engine.shutdown()
    finally:
        ray.shutdown()
    assert got == reference
