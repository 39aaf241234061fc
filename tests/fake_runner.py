"""A stand-in model runner for scheduler tests: samples a fixed token."""
from __future__ import annotations

from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.request import Request
from inflight.core.scheduler import Scheduler
from inflight.core.static_scheduler import StaticScheduler
from inflight.sampling_params import SamplingParams


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 1024, num_host_blocks: int = 0,
                   **sched_kw) -> Scheduler:
    caching = sched_kw.pop("enable_prefix_caching", True)
    spec = sched_kw.pop("speculative_config", None)
    window = sched_kw.pop("sliding_window", None)
    cls = StaticScheduler if sched_kw.get("scheduling") == "static" else Scheduler
    return cls(SchedulerConfig(**sched_kw), CacheConfig(block_size=block_size, enable_prefix_caching=caching),
               num_blocks, max_model_len, num_host_blocks=num_host_blocks, speculative_config=spec,
               sliding_window=window)


def make_request(rid: str, prompt_len: int = 8, max_tokens: int = 4, base: int = 0, **kw) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=kw.pop("ignore_eos", True))
    return Request(rid, [base + i for i in range(prompt_len)], sp, eos_token_ids=(0,), **kw)


def fake_execute(sched: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    """Sample ``token`` for every request whose chunk reaches the end of its tokens."""
    return ModelRunnerOutput({s.request.request_id: [token] for s in sched.scheduled if s.samples})


def run_step(scheduler: Scheduler, token: int = 7):
    sched = scheduler.schedule()
    outs = scheduler.update_from_output(sched, fake_execute(sched, token))
    return sched, outs
