"""AsyncLLMEngine: the step thread, per-request streams, aborts, crashes, idle CPU.

Uses a real LLMEngine (scheduler, KV manager, output processor) around a fake
model runner and a byte-level tokenizer, so no torch model is needed. The fake
engine is also imported by the fast server tests.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from types import SimpleNamespace

import pytest

from inflight.config import EngineConfig
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.scheduler import Scheduler
from inflight.engine.async_engine import AsyncLLMEngine, EngineDeadError
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.output_processor import OutputProcessor
from inflight.sampling_params import SamplingParams
from inflight.worker.request_state import RequestStates, ScheduledState

EOS = 256
SCRIPT = "hello world, the quick brown fox jumps over the lazy dog. "


class ByteTokenizer:
    """UTF-8 bytes are the token ids; 256 is EOS. Enough of the HF interface for the server."""

    eos_token_id = EOS
    chat_template = "fake"

    def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=list(text.encode()))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids):
        return [chr(i) if i < 256 else "</s>" for i in ids]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw) -> str:
        for m in messages:
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown role {m['role']}")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __len__(self) -> int:
        return 257


class FakeRunner:
    """Samples the next character of SCRIPT; optionally slow, optionally crashing."""

    def __init__(self) -> None:
        self.step_delay = 0.0
        self.crash = False
        self.requests = RequestStates()  # the worker's own state, from each SchedulerOutput

    def batch(self, sched: SchedulerOutput) -> list[ScheduledState]:
        """This step's requests, from the worker's state after applying ``sched``."""
        return self.requests.update(sched)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        if self.crash:
            raise RuntimeError("simulated device failure")
        if self.step_delay:
            time.sleep(self.step_delay)
        out = ModelRunnerOutput()
        for s in self.batch(sched):
            if not s.samples:
                continue
            req = s.state
            seed = req.sampling_params.seed or 0
            tok = ord(SCRIPT[(len(req.output_token_ids) + seed) % len(SCRIPT)])
            out.sampled_token_ids[req.req_id] = [tok]
            if req.sampling_params.logprobs is not None:
                alts = [(ord("x"), -2.0, 2), (ord("y"), -3.0, 3)][:req.sampling_params.logprobs]
                out.logprobs[req.req_id] = [(tok, -0.5, 1)] + alts
        return out


def make_fake_engine(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 128,
                     **sched_kwargs) -> LLMEngine:
    """An LLMEngine whose model is FakeRunner (built without loading weights)."""
    # the builder's platform step fills these in; a fake engine is built without it
    sched_kwargs.setdefault("max_num_seqs", 64)
    sched_kwargs.setdefault("max_num_batched_tokens", 512)
    cfg = EngineConfig.from_kwargs(block_size=block_size, **sched_kwargs)
    eng = LLMEngine.__new__(LLMEngine)
    eng.config = cfg
    eng.tokenizer = ByteTokenizer()
    eng.eos_token_ids = (EOS,)
    eng.model_source = "fake"
    eng.runner = FakeRunner()
    # the in-process executor's one call, to whichever runner a test puts in eng.runner
    eng.executor = SimpleNamespace(execute_model=lambda sched: eng.runner.execute(sched), shutdown=lambda: None)
    eng.kv_connector = None
    eng.arch = SimpleNamespace(vocab_size=257)
    eng.dtype, eng.device = "float32", "cpu"
    eng.max_model_len = max_model_len
    eng.max_sequence_tokens = max_model_len
    eng.num_blocks = num_blocks
    eng.scheduler = Scheduler(cfg.scheduler_config, cfg.cache_config, num_blocks, max_model_len)
    eng.output_processor = OutputProcessor(eng.tokenizer)
    eng._ids = itertools.count()
    eng.step_count = 0
    eng._trace = None
    return eng


def thread_cpu_seconds(thread: threading.Thread) -> float:
    """CPU time (user + system) of one thread, from /proc on Linux."""
    path = f"/proc/self/task/{thread.native_id}/stat"
    if not os.path.exists(path):
        return time.process_time()
    fields = open(path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_wakeup_cpu_seconds() -> float:
    """CPU this thread spends on what an idle server cannot avoid for 1 s: an event loop waking
    every 0.1 s (uvicorn's tick) and one 1 s sleep. Near zero on most hosts; on some VMs each
    wakeup costs milliseconds of CPU, which no server code can help."""
    async def ticks() -> None:
        for _ in range(10):
            await asyncio.sleep(0.1)

    t0 = time.thread_time()
    asyncio.run(ticks())
    time.sleep(1.0)
    return time.thread_time() - t0


def assert_blocks_all_free(engine: LLMEngine) -> None:
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks
    kv.check_integrity()
    assert not engine.scheduler.running and not engine.scheduler.waiting


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _started(engine=None) -> AsyncLLMEngine:
    a = AsyncLLMEngine(engine or make_fake_engine())
    a.start()
    return a


async def _collect(a: AsyncLLMEngine, rid: str, **params):
    outs = [o async for o in a.generate("Hi there", SamplingParams(temperature=0, **params), rid)]
    return outs


def test_generate_streams_until_finished_and_frees_blocks():
    async def main():
        a = await _started()
        outs = await _collect(a, "r1", max_tokens=5)
        assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 3, 4, 5]
        assert outs[-1].finished and outs[-1].outputs[0].text == SCRIPT[:5]
        await a.call(assert_blocks_all_free)
        await a.shutdown()
        assert not a.is_alive
    run(main())


def test_many_concurrent_requests_get_exact_token_counts():
    async def main():
        a = await _started(make_fake_engine(num_blocks=256, max_num_seqs=16))
        results = await asyncio.gather(*(_collect(a, f"r{i}", max_tokens=1 + i % 7, ignore_eos=True)
                                         for i in range(40)))
        for i, outs in enumerate(results):
            assert len(outs[-1].outputs[0].token_ids) == 1 + i % 7
        await a.call(assert_blocks_all_free)
        await a.shutdown()
    run(main())


def test_closing_a_stream_aborts_at_the_next_step():
    async def main():
        eng = make_fake_engine()
        eng.runner.step_delay = 0.01
        a = await _started(eng)
        stream = await a.add_request("r", "Hello", SamplingParams(max_tokens=100, ignore_eos=True))
        await stream.__anext__()
        await stream.__anext__()
        stream.close()
        await a.call(assert_blocks_all_free)  # the abort was queued before this call
        await a.shutdown()
    run(main())


def test_cancelled_consumer_aborts_its_request():
    async def main():
        eng = make_fake_engine()
        eng.runner.step_delay = 0.01
        a = await _started(eng)
        task = asyncio.ensure_future(_collect(a, "r", max_tokens=100))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await a.call(assert_blocks_all_free)
        await a.shutdown()
    run(main())


def test_bad_input_raises_value_error_and_the_loop_keeps_serving():
    async def main():
        a = await _started()
        with pytest.raises(ValueError, match="max_model_len"):
            await a.add_request("bad", "x" * 200, SamplingParams(max_tokens=4))
        with pytest.raises(ValueError, match="empty"):
            await a.add_request("bad2", "", SamplingParams(max_tokens=4))
        outs = await _collect(a, "good", max_tokens=3)
        assert outs[-1].finished
        await a.shutdown()
    run(main())


def test_step_crash_fails_pending_requests_and_marks_engine_dead():
    async def main():
        eng = make_fake_engine()
        eng.runner.step_delay = 0.01
        a = await _started(eng)
        stream = await a.add_request("r", "Hello", SamplingParams(max_tokens=100))
        await stream.__anext__()
        eng.runner.crash = True
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        assert not a.is_alive
        with pytest.raises(EngineDeadError):
            await a.add_request("r2", "Hello", SamplingParams(max_tokens=2))
        await a.shutdown()
    run(main())


def test_shutdown_aborts_what_outlives_the_grace_period():
    async def main():
        eng = make_fake_engine()
        eng.runner.step_delay = 0.01
        a = await _started(eng)
        stream = await a.add_request("r", "Hello", SamplingParams(max_tokens=100, ignore_eos=True))
        await a.shutdown(grace_period=0.1)
        outs = [o async for o in stream]
        assert outs[-1].outputs[0].finish_reason == "abort"
        assert_blocks_all_free(eng)
    run(main())


def test_idle_step_thread_uses_no_cpu():
    async def main():
        a = await _started()
        await _collect(a, "warm", max_tokens=3)
        before = thread_cpu_seconds(a.thread)
        await asyncio.sleep(1.0)
        used = thread_cpu_seconds(a.thread) - before
        assert used < 0.05, f"idle step thread used {used:.3f} s of CPU in 1 s"
        await a.shutdown()
    run(main())


def test_from_factory_builds_and_steps_on_one_thread():
    """torch's OpenMP pool belongs to the thread that loaded the model: stepping must happen there."""
    seen = []

    class RecordingRunner(FakeRunner):
        def execute(self, sched):
            seen.append(threading.current_thread())
            return super().execute(sched)

    def factory():
        eng = make_fake_engine()
        eng.runner = RecordingRunner()
        seen.append(threading.current_thread())
        return eng

    async def main():
        a = AsyncLLMEngine.from_factory(factory)
        assert a.engine is not None and seen == [a.thread] and a.thread is not threading.current_thread()
        a.start()
        outs = await _collect(a, "r1", max_tokens=3)
        assert outs[-1].outputs[0].text == SCRIPT[:3]
        assert set(seen) == {a.thread}
        await a.shutdown()
        assert not a.thread.is_alive()
        assert_blocks_all_free(a.engine)

    run(main())


def test_from_factory_reraises_a_failed_build_and_a_never_started_engine_shuts_down():
    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        AsyncLLMEngine.from_factory(broken)

    async def main():
        a = AsyncLLMEngine.from_factory(make_fake_engine)
        await a.shutdown()  # never started: the waiting thread must still exit
        assert not a.thread.is_alive()

    run(main())
