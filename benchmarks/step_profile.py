"""Where an engine step's time goes on the CPU fast path: one workload offline
(every request at once, greedy, ignore_eos), the engine's parts timed around their
calls, the C layer loop's kernels from its time-stamp-counter profile.

    python benchmarks/step_profile.py [--workload chat|FILE.jsonl] [--max-num-seqs 128] [--max-num-batched-tokens 512]
                                      [--kv-cache-dtype bfloat16] [--block-size 64] [--by-rows]

Prints the wall time and a table of parts by share of it (kernels get the loop's
time split by their tick shares; "engine other" is scheduling, output processing
and detokenization). ``--by-rows`` prints the same table for each range of step
sizes (tokens in the step), with the steps' count and mean time.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import os
import threading
import time

from inflight import LLM, SamplingParams
from inflight.bench.workload import load_jsonl

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads")
ROW_EDGES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 1 << 30)  # step-size ranges: (prev, edge]


def timed(totals: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t
    return wrapper


def wait_for_prefault() -> None:
    """Let the KV pool fault in before timing, as a server idle after start-up does
    (huge_pages.prefault_when_idle): else the first steps' KV writes pay for it."""
    t = time.perf_counter()
    for thread in threading.enumerate():
        if thread.name == "inflight-kv-prefault":
            thread.join()
    print(f"KV pool faulted in: {time.perf_counter() - t:.1f} s before timing")


def instrument(engine, loop) -> dict[str, float]:
    """Wrap the engine's parts in timers; returns their running totals (seconds)."""
    totals: dict[str, float] = collections.defaultdict(float)
    runner, model = engine.runner, engine.runner.model
    engine.step = timed(totals, "step", engine.step)
    runner.prepare_inputs = timed(totals, "prepare inputs", runner.prepare_inputs)
    runner.sampler = timed(totals, "sampler", runner.sampler)
    model.compute_logits = timed(totals, "lm_head", model.compute_logits)
    if hasattr(model, "greedy_tokens"):  # greedy rows: the argmax inside the lm_head GEMM
        model.greedy_tokens = timed(totals, "lm_head", model.greedy_tokens)
    model.forward = timed(totals, "forward", model.forward)
    if loop is not None:
        loop.run = timed(totals, "layer loop", loop.run)
        loop.profile()
    return totals


class ByRows:
    """The timers' totals and the layer loop's ticks of each step, added up by the step's size
    (the rows its layer loop ran; 0: no forward, or no C layer loop), with the decodes'
    context keys (what decode attention reads)."""

    def __init__(self, engine, loop, totals: dict[str, float]):
        self.loop, self.totals, self.rows, self.keys = loop, totals, 0, 0
        self.buckets: dict[int, dict] = {}
        step, run = engine.step, None if loop is None else loop.run

        def step_wrapper(*args, **kwargs):
            self.rows = self.keys = 0
            before, ticks = dict(totals), None if loop is None else loop.ticks.clone()
            try:
                return step(*args, **kwargs)
            finally:
                self._add(before, ticks)

        def run_wrapper(x, rope, kv_caches, md):
            self.rows, self.keys = x.shape[0], int(md.seq_lens[:md.num_decodes].sum())
            return run(x, rope, kv_caches, md)
        engine.step = step_wrapper
        if loop is not None:
            loop.run = run_wrapper

    def _add(self, before: dict[str, float], ticks) -> None:
        edge = ROW_EDGES[bisect.bisect_left(ROW_EDGES, self.rows)] if self.rows else 0
        b = self.buckets.setdefault(edge, {"steps": 0, "keys": 0, "totals": collections.defaultdict(float),
                                           "ticks": None})
        b["steps"] += 1
        b["keys"] += self.keys
        for key, sec in self.totals.items():
            b["totals"][key] += sec - before.get(key, 0.0)
        if ticks is not None:
            delta = self.loop.ticks - ticks
            b["ticks"] = delta if b["ticks"] is None else b["ticks"] + delta


def parts_of(totals: dict[str, float], shares: dict[str, float]) -> dict[str, float]:
    """Seconds by part: the timers' totals, the layer loop split by its kernels' tick shares."""
    parts = {"lm_head": totals["lm_head"], "sampler": totals["sampler"], "prepare inputs": totals["prepare inputs"],
             "forward outside the layers": totals["forward"] - totals["layer loop"]}
    for name, share in shares.items():
        parts[name] = share * totals["layer loop"]
    parts["engine other"] = max(totals["step"] - sum(parts.values()), 0.0)
    return parts


def print_parts(parts: dict[str, float], whole: float, limit: int = 99) -> None:
    for name, sec in sorted(parts.items(), key=lambda kv: -kv[1])[:limit]:
        if sec > 0:
            print(f"  {100 * sec / whole:5.1f}%  {sec:6.2f} s  {name}")


def print_by_rows(by_rows: ByRows, wall: float) -> None:
    prev = 0
    for edge in sorted(by_rows.buckets):
        b = by_rows.buckets[edge]
        step = b["totals"]["step"]
        shares = {} if b["ticks"] is None else by_rows.loop.profile_shares(b["ticks"])
        label = "no layer loop" if edge == 0 else f"{prev + 1}-{edge} rows"
        print(f"{label}: {b['steps']} steps, {step:.2f} s ({100 * step / wall:.1f}% of wall), "
              f"{1000 * step / b['steps']:.1f} ms a step, {b['keys'] / b['steps']:.0f} decode keys a step")
        print_parts(parts_of(b["totals"], shares), step, limit=8)
        prev = edge if edge else prev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="chat", help="a name in ../shared/workloads, or a .jsonl file")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="default: the platform's")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the platform's")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--block-size", type=int, default=None, help="default: the platform's")
    ap.add_argument("--by-rows", action="store_true", help="a table for each range of step sizes too")
    args = ap.parse_args()
    extra = {} if args.block_size is None else {"block_size": args.block_size}
    llm = LLM(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_dtype=args.kv_cache_dtype, **extra)
    engine = llm.llm_engine
    loop = getattr(engine.runner.model, "layer_loop", None)
    path = args.workload if args.workload.endswith(".jsonl") else os.path.join(SHARED, f"{args.workload}.jsonl")
    reqs = load_jsonl(path)
    prompts = [r.prompt for r in reqs]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0) for r in reqs]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    wait_for_prefault()

    totals = instrument(engine, loop)
    by_rows = ByRows(engine, loop, totals) if args.by_rows else None
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t

    shares = loop.profile_shares() if loop is not None else {}
    print(f"{args.workload}: {wall:.2f} s wall, {totals['step']:.2f} s in steps"
          + ("" if loop is not None else " (no C layer loop: kernels not split)"))
    print_parts(parts_of(totals, shares), wall)
    if by_rows is not None:
        print_by_rows(by_rows, wall)


if __name__ == "__main__":
    main()
