"""Pooling requests in the scheduler (no torch): a prompt pooled chunk by chunk, finished with
its embedding and nothing sampled; the prefix cache for LAST only; preemption loses nothing."""
from __future__ import annotations

import pickle

import pytest

from fake_runner import make_scheduler
from inflight.core.outputs import ModelRunnerOutput
from inflight.core.pooling import PooledChunk, PoolingState
from inflight.core.request import Request
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import SamplingParams
from inflight.worker.request_state import RequestStates


class PoolingWorker:
    """Pools token ids instead of hidden states: MEAN sums them, LAST / CLS keep one."""

    def __init__(self) -> None:
        self.states = RequestStates()
        self.chunks: list[tuple[str, int, int]] = []

    def execute(self, sched) -> ModelRunnerOutput:
        batch = self.states.update(pickle.loads(pickle.dumps(sched)))
        out = ModelRunnerOutput({s.req_id: [7] for s in batch if s.samples})
        for s in batch:
            p = s.state.pooling_params
            if p is None:
                continue
            nc, n = s.state.num_computed_tokens, s.num_new_tokens
            toks = s.state.all_token_ids[nc:nc + n]
            self.chunks.append((s.req_id, nc, n))
            data = {"MEAN": float(sum(toks)), "CLS": float(toks[0]) if nc == 0 else None,
                    "LAST": float(toks[-1]) if nc + n == s.state.num_prompt_tokens else None}[p.pooling_type]
            out.pooled[s.req_id] = PooledChunk(nc, n, data)
        return out


def _pooling(rid: str, ids: list[int], kind: str) -> Request:
    params = PoolingParams(task="embed", pooling_type=kind, skip_reading_prefix_cache=kind != "LAST")
    return Request(rid, ids, SamplingParams(max_tokens=1, temperature=0.0), (), pooling_params=params)


def _run(scheduler, worker: PoolingWorker, max_steps: int = 500) -> dict:
    """Step until idle; returns request id -> pooling output, checking nothing is ever sampled."""
    done = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return done
        sched = scheduler.schedule()
        for out in scheduler.update_from_output(sched, worker.execute(sched)):
            if out.request_id.startswith("g"):  # a generating request
                done.setdefault(out.request_id, None)
                continue
            assert out.new_token_ids == [], "a pooling request sampled a token"
            if out.finish_reason is not None:
                assert out.finish_reason == "stop"
                done[out.request_id] = out.pooling_output
        scheduler.check_integrity()
    raise AssertionError("the scheduler did not finish")


def test_mean_pooling_over_chunks_finishes_with_the_mean_and_frees_every_block():
    s = make_scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=8)
    worker = PoolingWorker()
    ids = [3 + i * 5 % 17 for i in range(21)]
    s.add_request(_pooling("m", ids, "MEAN"))
    assert _run(s, worker) == {"m": pytest.approx(sum(ids) / len(ids))}
    assert [c[1:] for c in worker.chunks] == [(0, 8), (8, 8), (16, 5)]
    assert s.kv.usage == 0.0


@pytest.mark.parametrize("kind,pick", [("LAST", -1), ("CLS", 0)])
def test_last_and_cls_pooling_keep_one_position(kind, pick):
    s = make_scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=6)
    ids = list(range(10, 23))
    s.add_request(_pooling("r", ids, kind))
    assert _run(s, PoolingWorker()) == {"r": float(ids[pick])}


def test_last_pooling_reads_the_prefix_cache_and_mean_does_not():
    s = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    worker = PoolingWorker()
    ids = list(range(1, 19))
    s.add_request(_pooling("first", ids, "LAST"))
    _run(s, worker)
    again, mean = _pooling("again", ids, "LAST"), _pooling("mean", ids, "MEAN")
    s.add_request(again)
    s.add_request(mean)
    assert _run(s, worker) == {"again": float(ids[-1]), "mean": pytest.approx(sum(ids) / len(ids))}
    assert again.num_cached_tokens == 16  # whole blocks, the last token recomputed
    assert mean.num_cached_tokens == 0  # a cached position has no hidden state to average


def test_preemption_by_recompute_loses_no_pooled_chunk():
    """A pool too small for every prefill at once: requests are preempted mid-prompt and
    pooled again from their first token; each mean is still exact."""
    s = make_scheduler(num_blocks=14, block_size=4, max_num_batched_tokens=40, max_num_seqs=8,
                       long_prefill_token_threshold=8)
    worker = PoolingWorker()
    prompts = {f"r{i}": [1 + (i * 7 + j * 3) % 29 for j in range(18 + 3 * (i % 4))] for i in range(10)}
    for rid, ids in prompts.items():
        s.add_request(_pooling(rid, ids, "MEAN" if int(rid[1:]) % 3 else "CLS"))
    done = _run(s, worker)
    assert s.num_preemptions > 0, "the test must preempt"
    for rid, ids in prompts.items():
        want = float(ids[0]) if int(rid[1:]) % 3 == 0 else sum(ids) / len(ids)
        assert done[rid] == pytest.approx(want), rid


def test_pooling_and_generation_share_steps():
    s = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=16)
    worker = PoolingWorker()
    gen = Request("g", list(range(5)), SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), (0,))
    s.add_request(gen)
    s.add_request(_pooling("p", list(range(30)), "MEAN"))
    done = _run(s, worker)
    assert done == {"p": pytest.approx(14.5), "g": None}
    assert gen.output_token_ids == [7, 7, 7]


def test_a_chunk_out_of_order_is_refused():
    st = PoolingState("MEAN")
    st.add(PooledChunk(0, 4, 10.0))
    with pytest.raises(RuntimeError, match="pooled chunk at 8 after 4"):
        st.add(PooledChunk(8, 4, 1.0))
    st.add(PooledChunk(0, 4, 2.0))  # recomputed from the start: the sum begins again
    st.add(PooledChunk(4, 2, 4.0))
    assert st.result(6) == pytest.approx(1.0)
    assert st.result(7) is None
