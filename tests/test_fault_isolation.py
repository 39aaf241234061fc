"""Per-request fault isolation: a fault that belongs to one request (its seed, its
sampling settings, its detokenization, its stop strings) fails that request alone;
the others finish with the right tokens and every KV block comes back. A forward
pass failure fails everyone and marks the engine crashed.

The engine is real (scheduler, KV manager, output processor, ModelRunner and
Sampler) around a tiny torch model whose next token is the input token + 1.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from inflight.engine.async_engine import AsyncLLMEngine, EngineDeadError
from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.errors import InvalidRequestError, RequestError
from inflight.sampling_params import SamplingParams
from inflight.worker import sampler as sampler_mod
from inflight.worker.model_runner import ModelRunner
from test_async_engine import assert_blocks_all_free, make_fake_engine, run

V = 257
PROMPT = "abcdefgh"  # bytes 97..104: the tiny model continues i, j, k, ...


class NextTokenModel(torch.nn.Module):
    """Logits put all the mass on input + 1 (greedy and sampled alike); can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def forward(self, input_ids, positions, kv_caches, md):
        if self.fail:
            raise RuntimeError("simulated device failure")
        return torch.nn.functional.one_hot((input_ids + 1) % 256, V).float()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * 50.0


def make_engine():
    eng = make_fake_engine(num_blocks=64, block_size=4, max_num_seqs=16, max_num_batched_tokens=512)
    eng.runner = ModelRunner(NextTokenModel(), [], block_size=4, vocab_size=V, device=torch.device("cpu"))
    return eng


def expected(n: int) -> str:
    return "".join(chr(ord("h") + 1 + i) for i in range(n))


def _params(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 6)
    kw.setdefault("ignore_eos", True)
    return SamplingParams(**kw)


async def _text(a: AsyncLLMEngine, rid: str, params: SamplingParams, prompt: str = PROMPT) -> str:
    outs = [o async for o in a.generate(prompt, params, rid)]
    assert outs[-1].finished
    return outs[-1].outputs[0].text


def _good_requests(a: AsyncLLMEngine):
    """Greedy, seeded and unseeded sampled requests, n=2 too: they must all finish exactly."""
    return [_text(a, "greedy", _params(temperature=0)),
            _text(a, "seeded", _params(temperature=0.8, seed=3)),
            _text(a, "sampled", _params(temperature=1.0, top_k=5, top_p=0.9)),
            _text(a, "penalised", _params(temperature=0.7, seed=9, repetition_penalty=1.1, n=2))]


async def _run_with_faulty(bad_params: SamplingParams, bad_prompt: str = PROMPT) -> BaseException:
    """Start good requests, a faulty one among them; return the faulty one's error."""
    a = AsyncLLMEngine(make_engine())
    a.start()
    results = await asyncio.gather(_text(a, "bad", bad_params, bad_prompt), *_good_requests(a),
                                   return_exceptions=True)
    error, texts = results[0], results[1:]
    assert texts == [expected(6)] * 4, texts
    assert isinstance(error, Exception), error
    assert a.is_alive and a.crash is None
    assert await _text(a, "after", _params(temperature=0)) == expected(6)  # still serving
    await a.call(assert_blocks_all_free)
    await a.shutdown()
    return error


def _out_of_range_seed(seed: int) -> SamplingParams:
    params = _params(temperature=1.0, seed=1)
    params.seed = seed  # past validation: what a Python caller or a server bug can still hand the engine
    return params


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_torch_cannot_take_fails_that_request_only(seed):
    error = run(_run_with_faulty(_out_of_range_seed(seed)))
    assert isinstance(error, InvalidRequestError) and "seed" in str(error)


def test_seed_plus_n_past_the_range_fails_the_whole_request_only():
    params = _params(temperature=1.0, seed=1, n=3)
    params.seed = 2**64 - 2  # the third sample's seed is 2**64
    error = run(_run_with_faulty(params))
    assert isinstance(error, InvalidRequestError)


@pytest.mark.parametrize("stage", ["metadata", "sampler"])
def test_a_sampler_fault_in_one_request_fails_it_alone(monkeypatch, stage):
    """top_k=13 marks the faulty request; the fault fires wherever its rows are in the batch."""
    if stage == "metadata":
        real = sampler_mod.SamplingMetadata.from_rows.__func__

        def from_rows(cls, rows, vocab_size, device):
            if any(r.params.top_k == 13 for r in rows):
                raise RuntimeError("injected sampling-metadata fault")
            return real(cls, rows, vocab_size, device)
        monkeypatch.setattr(sampler_mod.SamplingMetadata, "from_rows", classmethod(from_rows))
    else:
        real_call = sampler_mod.Sampler.__call__

        def call(self, logits, md):
            if md.top_k is not None and 13 in md.top_k.tolist():
                raise RuntimeError("injected sampler fault")
            return real_call(self, logits, md)
        monkeypatch.setattr(sampler_mod.Sampler, "__call__", call)
    error = run(_run_with_faulty(_params(temperature=1.0, top_k=13)))
    assert isinstance(error, RequestError) and error.request_id == "bad"
    assert "injected" not in str(error)  # internals stay in the log


def test_a_detokenizer_fault_fails_that_request_alone(monkeypatch):
    real = IncrementalDetokenizer.add_token

    def add_token(self, token_id):
        if "XYZ" in self.tokenizer.decode(self.ids[:self.num_prompt_tail]):
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "injected")
        return real(self, token_id)
    monkeypatch.setattr(IncrementalDetokenizer, "add_token", add_token)
    error = run(_run_with_faulty(_params(temperature=0), bad_prompt="abcdeXYZ"))
    assert isinstance(error, RequestError)


def test_a_stop_check_fault_fails_that_request_alone(monkeypatch):
    real = IncrementalDetokenizer._find_stop

    def find_stop(self, start):
        if "boom" in self.stop:
            raise RuntimeError("injected stop-check fault")
        return real(self, start)
    monkeypatch.setattr(IncrementalDetokenizer, "_find_stop", find_stop)
    error = run(_run_with_faulty(_params(temperature=0, stop=["boom"])))
    assert isinstance(error, RequestError)


def test_a_forward_failure_fails_everyone_and_marks_the_engine_crashed():
    async def main():
        eng = make_engine()
        a = AsyncLLMEngine(eng)
        a.start()
        assert await _text(a, "ok", _params(temperature=0)) == expected(6)
        streams = [await a.add_request(f"r{i}", PROMPT, _params(max_tokens=100, temperature=0)) for i in range(3)]
        await streams[0].__anext__()
        eng.runner.model.fail = True
        for s in streams:
            with pytest.raises(EngineDeadError):
                async for _ in s:
                    pass
        await asyncio.sleep(0.05)
        assert not a.is_alive and isinstance(a.crash, RuntimeError)
        assert eng.scheduler.kv.num_free_blocks == eng.scheduler.kv.num_blocks  # freed for the drain
        with pytest.raises(EngineDeadError):
            await a.add_request("late", PROMPT, _params())
    run(main())


def test_over_http_the_faulty_request_gets_a_500_and_the_others_their_tokens(monkeypatch, caplog):
    import concurrent.futures

    import httpx

    from inflight.entrypoints.openai.server_thread import ServerThread

    real = IncrementalDetokenizer._find_stop

    def find_stop(self, start):
        if "boom" in self.stop:
            raise RuntimeError("injected stop-check fault")
        return real(self, start)
    monkeypatch.setattr(IncrementalDetokenizer, "_find_stop", find_stop)
    engine = make_engine()
    body = {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    with ServerThread(engine, "tiny", log_stats=False) as srv, concurrent.futures.ThreadPoolExecutor(4) as pool:
        def post(extra):
            return httpx.post(srv.base_url + "/v1/completions", json={**body, **extra}, timeout=30)
        futures = [pool.submit(post, {"stop": ["boom"]})] + [pool.submit(post, {"seed": i}) for i in range(3)]
        bad, *good = [f.result() for f in futures]
        assert bad.status_code == 500 and "injected" not in bad.text
        assert [r.json()["choices"][0]["text"] for r in good] == [expected(6)] * 3
        with httpx.stream("POST", srv.base_url + "/v1/completions", json={**body, "stop": ["boom"], "stream": True},
                          timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert '"error"' in events[-2] and events[-1] == "data: [DONE]"  # in-band, then the end
        assert srv.state.engine.is_alive
        srv.state.engine.call_sync(assert_blocks_all_free, timeout=10)
    assert any("failed; the engine goes on" in r.getMessage() and "cmpl-" in r.getMessage()
               for r in caplog.records)  # the request id is in the log


def test_a_responses_stream_that_fails_ends_with_the_responses_failure_events(monkeypatch):
    # not the completions APIs' error chunk and [DONE]: OpenAI's "error" event, then
    # "response.failed" carrying the response with its error set
    import json

    import httpx

    from inflight.entrypoints.openai.server_thread import ServerThread

    def add_token(self, token_id):
        raise RuntimeError("injected detokenizer fault")
    monkeypatch.setattr(IncrementalDetokenizer, "add_token", add_token)
    body = {"model": "tiny", "input": PROMPT, "max_output_tokens": 4, "stream": True}
    with ServerThread(make_engine(), "tiny", log_stats=False) as srv:
        with httpx.stream("POST", srv.base_url + "/v1/responses", json=body, timeout=30) as r:
            data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [d["type"] for d in data[:2]] == ["response.created", "response.in_progress"]
        assert [d["type"] for d in data[-2:]] == ["error", "response.failed"], data
        assert [d["sequence_number"] for d in data] == list(range(len(data)))
        failed = data[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        assert "injected" not in json.dumps(data)  # internals stay in the log
        srv.state.engine.call_sync(assert_blocks_all_free, timeout=10)
