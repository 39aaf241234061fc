"""The scheduler-to-worker contract is data: it pickles, holds no Request, and a
worker that keeps its own state from it sees exactly the scheduler's requests."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from fake_runner import make_request, make_scheduler, run_step, worker_batch
from inflight.config import SpeculativeConfig
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.request import Request
from inflight.sampling_params import SamplingParams, StructuredOutputsParams


def _contains_request(x) -> bool:
    if isinstance(x, Request):
        return True
    if dataclasses.is_dataclass(x):
        return any(_contains_request(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, dict):
        return any(_contains_request(k) or _contains_request(v) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return any(_contains_request(v) for v in x)
    return False


def test_output_pickles_to_an_equal_output_without_requests():
    s = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64, preemption_mode="swap",
                       num_host_blocks=8, speculative_config=SpeculativeConfig(num_speculative_tokens=2))
    s.add_request(make_request("a", prompt_len=8, max_tokens=12, arrival_time=1.0))
    s.add_request(make_request("b", prompt_len=8, max_tokens=12, base=100, arrival_time=2.0))
    seen = {"new": False, "cached": False, "swap_out": False, "swap_in": False, "finished": False}
    for _ in range(40):
        sched, _ = run_step(s)
        out: SchedulerOutput = sched.output
        assert pickle.loads(pickle.dumps(out)) == out
        assert not _contains_request(out)
        seen["new"] |= bool(out.scheduled_new_reqs)
        seen["cached"] |= bool(out.scheduled_cached_reqs)
        seen["swap_out"] |= bool(out.blocks_to_swap_out)
        seen["swap_in"] |= bool(out.blocks_to_swap_in)
        seen["finished"] |= bool(out.finished_req_ids)
        if not s.has_unfinished_requests():
            break
    assert all(seen.values()), seen


def test_every_sampling_setting_crosses_the_boundary():
    s = make_scheduler()
    sp = SamplingParams(temperature=0.7, seed=3, max_tokens=4, logit_bias={5: 2.0}, prompt_logprobs=2, logprobs=1,
                        stop_token_ids=[9], structured_outputs=StructuredOutputsParams(regex="[a-z]+"))
    s.add_request(Request("x", [1, 2, 3], sp, eos_token_ids=(0,)))
    out = s.schedule()
    (new,) = pickle.loads(pickle.dumps(out)).scheduled_new_reqs
    assert new.sampling_params == sp and new.eos_token_ids == (0,) and new.prompt_token_ids == [1, 2, 3]


def test_a_running_request_is_sent_in_full_once_then_as_diffs():
    s = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    s.add_request(make_request("a", prompt_len=6, max_tokens=4))
    first, _ = run_step(s, token=9)
    new = first.scheduled_new_reqs
    assert [d.req_id for d in new] == ["a"] and new[0].prompt_token_ids == list(range(6))
    assert new[0].block_ids == ([0, 1],) and new[0].num_computed_tokens == 0 and not first.scheduled_cached_reqs
    second, _ = run_step(s, token=9)
    (diff,) = second.scheduled_cached_reqs
    assert not second.scheduled_new_reqs
    # the token sampled last step, no block yet (7 tokens fit in two blocks of 4)
    assert diff.new_token_ids == [9] and diff.new_block_ids == ([],) and diff.num_computed_tokens == 6
    run_step(s, token=9)  # position 7: the last slot of block 1
    fourth, _ = run_step(s, token=9)  # position 8 opens a block
    assert fourth.scheduled_cached_reqs[0].new_block_ids == ([2],)
    assert fourth.scheduled_cached_reqs[0].new_token_ids == [9]


@pytest.mark.parametrize("kw", [
    dict(preemption_mode="recompute"),
    dict(preemption_mode="swap", num_host_blocks=6),
    dict(preemption_mode="recompute", sliding_window=6),
    dict(scheduling="static"),
    dict(preemption_mode="recompute", speculative_config=SpeculativeConfig(num_speculative_tokens=3)),
    dict(layer_windows=[6, None, 6, None], num_blocks=24),  # a block table per layer group
])
def test_worker_state_follows_the_scheduler_through_preemption(kw):
    """Under memory pressure: after every step the worker's copy of each scheduled
    request (tokens, progress, block tables) equals the scheduler's."""
    s = make_scheduler(**{**dict(num_blocks=12, block_size=2, max_num_batched_tokens=16, max_num_seqs=4), **kw})
    for i in range(5):
        s.add_request(make_request(f"r{i}", prompt_len=3 + i, max_tokens=6 + i, base=1 + 3 * (i % 2),
                                   arrival_time=float(i)))
    preempted = 0
    for step in range(300):
        out = s.schedule()
        preempted += len(out.preempted_req_ids)
        batch = worker_batch(s, out)
        assert [b.req_id for b in batch] == [x.request.request_id for x in s.last_scheduled]
        for b, x in zip(batch, s.last_scheduled):
            r = x.request
            assert b.state.all_token_ids == r.all_token_ids and b.state.output_token_ids == r.output_token_ids
            assert b.state.num_computed_tokens == r.num_computed_tokens and b.num_new_tokens == x.num_new_tokens
            assert b.state.block_ids == x.block_ids and b.spec_token_ids == x.spec_token_ids
            assert b.samples == x.samples
        # a periodic "model", so n-gram drafts recur and are partly accepted
        result = ModelRunnerOutput({b.req_id: [1 + (b.state.num_tokens + j) % 4 for j in range(1 + len(b.spec_token_ids))]
                                    for b in batch if b.samples})
        s.update_from_output(out, result)
        if not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests()
    if "scheduling" not in kw:
        assert preempted > 0  # the pool is small enough that the diffs cross preemptions


@pytest.mark.slow
def test_the_real_runner_gives_the_same_tokens_when_every_step_is_pickled():
    """The model runner reads only the data it is sent: a worker that gets each
    SchedulerOutput through pickle (as another process does) samples the same
    tokens, under preemption, chunked prefill, seeds, logit bias and prompt logprobs."""
    from inflight import LLM

    llm = LLM(dtype="float32", num_gpu_blocks_override=5, block_size=16, max_model_len=256,
              max_num_batched_tokens=48, enable_prefix_caching=False)
    prompts = [f"List {i}: one, two, three, four, five," for i in range(4)]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, prompt_logprobs=1),
              SamplingParams(temperature=0.9, seed=11, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logit_bias={11: 5.0}),
              SamplingParams(temperature=0.8, seed=5, max_tokens=16, ignore_eos=True, logprobs=2)]

    def run():
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.prompt_logprobs) for o in outs]

    eng = llm.llm_engine
    before = eng.scheduler.num_preemptions
    direct = run()
    assert eng.scheduler.num_preemptions > before  # 5 blocks of 16 tokens: the four requests (2 blocks each) cannot all fit
    execute = eng.executor.execute_model
    eng.executor.execute_model = lambda sched: execute(pickle.loads(pickle.dumps(sched)))
    try:
        assert run() == direct
    finally:
        eng.executor.execute_model = execute
