"""A stand-in model runner for scheduler tests: samples a fixed token."""
from __future__ import annotations

import pickle
import weakref

from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from inflight.core.request import Request
from inflight.core.scheduler import Scheduler
from inflight.sampling_params import SamplingParams
from inflight.worker.request_state import RequestStates, ScheduledState


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 1024, num_host_blocks: int = 0,
                   **sched_kw) -> Scheduler:
    caching = sched_kw.pop("enable_prefix_caching", True)
    spec = sched_kw.pop("speculative_config", None)
    window = sched_kw.pop("sliding_window", None)
    layer_windows = sched_kw.pop("layer_windows", None)
    max_loras = sched_kw.pop("max_loras", None)
    return Scheduler(SchedulerConfig(**sched_kw), CacheConfig(block_size=block_size, enable_prefix_caching=caching),
                     num_blocks, max_model_len, num_host_blocks=num_host_blocks, speculative_config=spec,
                     sliding_window=window, layer_windows=layer_windows, max_loras=max_loras)


def make_request(rid: str, prompt_len: int = 8, max_tokens: int = 4, base: int = 0, **kw) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=kw.pop("ignore_eos", True))
    return Request(rid, [base + i for i in range(prompt_len)], sp, eos_token_ids=(0,), **kw)


class FakeRunner:
    """The worker side of the contract without a model: keeps its own request state
    from each (pickled) SchedulerOutput, as a real worker in another process would."""

    def __init__(self, token: int = 7) -> None:
        self.token = token
        self.requests = RequestStates()

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Sample ``token`` for every request whose chunk reaches the end of its tokens."""
        batch = self.requests.update(pickle.loads(pickle.dumps(sched)))
        return ModelRunnerOutput({s.req_id: [self.token] for s in batch if s.samples})


_runners: "weakref.WeakKeyDictionary[Scheduler, FakeRunner]" = weakref.WeakKeyDictionary()


def fake_worker(scheduler: Scheduler) -> FakeRunner:
    """The scheduler's fake worker (one per scheduler, kept across steps)."""
    return _runners.setdefault(scheduler, FakeRunner())


def worker_batch(scheduler: Scheduler, sched: SchedulerOutput) -> list[ScheduledState]:
    """Apply ``sched`` (pickled, as to another process) to the scheduler's fake worker
    and return the step's batch as the worker sees it."""
    sched = sched.output if isinstance(sched, StepView) else sched
    return fake_worker(scheduler).requests.update(pickle.loads(pickle.dumps(sched)))


def fake_execute(scheduler: Scheduler, sched: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    """Run ``sched`` on the scheduler's fake worker."""
    runner = fake_worker(scheduler)
    runner.token = token
    return runner.execute(sched)


class StepView:
    """A step as a test inspects it: the SchedulerOutput sent to the worker (its
    fields read through) and ``scheduled``, the scheduler's own record of the batch
    with the live Requests (``Scheduler.last_scheduled``)."""

    def __init__(self, scheduler: Scheduler, output: SchedulerOutput) -> None:
        self.output = output
        self.scheduled: list[ScheduledRequest] = list(scheduler.last_scheduled)

    def __getattr__(self, name: str):
        if name == "output":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.output, name)


def schedule(scheduler: Scheduler) -> StepView:
    """``scheduler.schedule()``, seen as a :class:`StepView`."""
    return StepView(scheduler, scheduler.schedule())


def run_step(scheduler: Scheduler, token: int = 7) -> tuple[StepView, list]:
    """One step on the scheduler's fake worker: (the step, the EngineCoreOutputs)."""
    step = schedule(scheduler)
    outs = scheduler.update_from_output(step.output, fake_execute(scheduler, step.output, token))
    return step, outs
