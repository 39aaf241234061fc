"""Fairness for interactive traffic: a flood of long generations plus a trickle
of short interactive requests, with and without the long-generation seat share
(``long_generation_threshold`` / ``long_generation_seat_share``; the policy is
explained in ``inflight/core/admission.py``).

    python benchmarks/fairness.py                  # scheduler only, fake runner: TTFT in steps
    python benchmarks/fairness.py --runner model   # the embedded model on this machine: TTFT in seconds

The flood (all ``--num-long`` requests at step 0) fills every seat; a short
request arrives every ``--short-every`` steps. Without the policy, FCFS puts
each short request behind the whole flood; with it, long generations keep at
most ``--seat-share`` of ``--max-num-seqs`` seats and short requests take the
rest. Reported: TTFT of the short requests (p50/p99/max), TTFT and completion
of the long ones, the makespan and the throughput it costs, and preemptions.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from inflight.bench.metrics import nearest_rank
from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.outputs import ModelRunnerOutput
from inflight.core.request import Request
from inflight.core.scheduler import Scheduler
from inflight.sampling_params import SamplingParams


@dataclass
class Arrival:
    """One request of the workload: when it arrives (engine step) and its shape."""

    rid: str
    step: int
    prompt_len: int
    max_tokens: int
    short: bool


def workload(args) -> list[Arrival]:
    out = [Arrival(f"long{i}", 0, args.prompt_len, args.long_tokens, False) for i in range(args.num_long)]
    out += [Arrival(f"short{i}", args.short_start + i * args.short_every, args.prompt_len, args.short_tokens, True)
            for i in range(args.num_short)]
    return out



def summarize(arrivals: list[Arrival], ttft: dict, done: dict, steps: int, wall: float, tokens: int,
              preemptions: int) -> dict:
    short = [ttft[a.rid] for a in arrivals if a.short]
    long = [ttft[a.rid] for a in arrivals if not a.short]
    long_done = [done[a.rid] for a in arrivals if not a.short]
    return {"short_ttft_p50": nearest_rank(short, 50), "short_ttft_p99": nearest_rank(short, 99), "short_ttft_max": max(short),
            "long_ttft_p50": nearest_rank(long, 50), "long_done_p50": nearest_rank(long_done, 50), "long_done_max": max(long_done),
            "steps": steps, "wall_s": round(wall, 2), "output_tokens": tokens,
            "tokens_per_step": round(tokens / steps, 2), "preemptions": preemptions}


def run_fake(args, arrivals: list[Arrival], policy: bool) -> dict:
    """The real scheduler with a runner that samples a fixed token: times are in steps."""
    cfg = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          long_generation_threshold=args.threshold if policy else 0,
                          long_generation_seat_share=args.seat_share, preemption_mode=args.preemption_mode)
    s = Scheduler(cfg, CacheConfig(block_size=16), args.num_blocks, 4096, num_host_blocks=args.num_blocks)
    pending = sorted(arrivals, key=lambda a: a.step)
    ttft, done, tokens, step = {}, {}, 0, 0
    arrived_at = {a.rid: a.step for a in arrivals}
    t0 = time.time()
    while pending or s.has_unfinished_requests():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
            s.add_request(Request(a.rid, [100 + i for i in range(a.prompt_len)], sp, arrival_time=float(step)))
        sched = s.schedule()
        result = ModelRunnerOutput({x.request.request_id: [7] for x in s.last_scheduled if x.samples})
        step += 1
        for o in s.update_from_output(sched, result):
            tokens += len(o.new_token_ids)
            ttft.setdefault(o.request_id, step - arrived_at[o.request_id])
            if o.finish_reason:
                done[o.request_id] = step - arrived_at[o.request_id]
    return summarize(arrivals, ttft, done, step, time.time() - t0, tokens, s.num_preemptions)


def run_model(args, arrivals: list[Arrival], policy: bool, llm=None) -> dict:
    """The embedded model on this machine: requests arrive at engine steps, times in seconds."""
    from inflight import LLM

    llm = llm or LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     kv_cache_memory=args.kv_cache_memory, preemption_mode=args.preemption_mode,
                     swap_space=args.kv_cache_memory / 2**30)
    eng = llm.llm_engine
    eng.scheduler.config.long_generation_threshold = args.threshold if policy else 0
    eng.scheduler.config.long_generation_seat_share = args.seat_share
    pending = sorted(arrivals, key=lambda a: a.step)
    arrived, ttft, done, tokens, step = {}, {}, {}, 0, 0
    before = eng.scheduler.num_preemptions
    t0 = time.time()
    while pending or eng.has_unfinished_requests():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
            arrived[a.rid] = time.time()
            eng.add_request(a.rid, {"prompt_token_ids": [100 + i for i in range(a.prompt_len)]}, sp)
        outs = eng.step()
        step += 1
        now = time.time()
        for o in outs:
            c = o.outputs[0]
            if c.token_ids:
                ttft.setdefault(o.request_id, now - arrived[o.request_id])
            if o.finished:
                done[o.request_id] = now - arrived[o.request_id]
                tokens += len(c.token_ids)
    return summarize(arrivals, ttft, done, step, time.time() - t0, tokens,
                     eng.scheduler.num_preemptions - before), llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", choices=["fake", "model"], default="fake")
    p.add_argument("--num-long", type=int, default=64)
    p.add_argument("--long-tokens", type=int, default=256)
    p.add_argument("--num-short", type=int, default=16)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--short-start", type=int, default=10)
    p.add_argument("--short-every", type=int, default=25)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--num-blocks", type=int, default=4096, help="fake runner: KV blocks of 16 tokens")
    p.add_argument("--kv-cache-memory", type=int, default=256 * 2**20, help="model runner: KV bytes")
    p.add_argument("--threshold", type=int, default=64, help="max_tokens above which a request is long")
    p.add_argument("--seat-share", type=float, default=0.75)
    p.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    arrivals = workload(args)
    results, llm = {}, None
    for name, policy in (("fcfs", False), ("seat_share", True)):
        if args.runner == "fake":
            results[name] = run_fake(args, arrivals, policy)
        else:
            results[name], llm = run_model(args, arrivals, policy, llm)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    unit = "steps" if args.runner == "fake" else "s"
    print(f"{args.num_long} long ({args.long_tokens} tokens) at step 0, {args.num_short} short "
          f"({args.short_tokens} tokens) every {args.short_every} steps; max_num_seqs={args.max_num_seqs}; "
          f"policy: long > {args.threshold} tokens entitled to {args.seat_share:.0%} of seats; "
          f"preemption by {args.preemption_mode}; times in {unit}")
    keys = list(results["fcfs"])
    print(f"{'':16}" + "".join(f"{k:>16}" for k in results))
    for k in keys:
        print(f"{k:16}" + "".join(f"{_fmt(results[n][k]):>16}" for n in results))


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
