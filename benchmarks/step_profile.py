"""Where an engine step's time goes on the CPU fast path: one workload offline
(every request at once, greedy, ignore_eos), the engine's parts timed around their
calls, the C layer loop's kernels from its time-stamp-counter profile.

    python benchmarks/step_profile.py [--workload chat] [--max-num-seqs 128] [--max-num-batched-tokens 512]
                                      [--kv-cache-dtype bfloat16] [--block-size 64]

Prints the wall time and a table of parts by share of it (kernels get the loop's
time split by their tick shares; "engine other" is scheduling, output processing
and detokenization).
"""
from __future__ import annotations

import argparse
import collections
import os
import threading
import time

from inflight import LLM, SamplingParams
from inflight.bench.workload import load_jsonl

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="default: the platform's")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the platform's")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--block-size", type=int, default=None, help="default: the platform's")
    args = ap.parse_args()
    extra = {} if args.block_size is None else {"block_size": args.block_size}
    llm = LLM(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_dtype=args.kv_cache_dtype, **extra)
    engine = llm.llm_engine
    runner, model = engine.runner, engine.runner.model
    loop = getattr(model, "layer_loop", None)
    reqs = load_jsonl(os.path.join(SHARED, f"{args.workload}.jsonl"))
    prompts = [r.prompt for r in reqs]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0) for r in reqs]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    wait_for_prefault()

    totals: dict[str, float] = collections.defaultdict(float)
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
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t

    parts = {"lm_head": totals["lm_head"], "sampler": totals["sampler"], "prepare inputs": totals["prepare inputs"],
             "forward outside the layers": totals["forward"] - totals["layer loop"],
             "execute other": 0.0, "engine other": 0.0}
    if loop is not None:
        for name, share in loop.profile_shares().items():
            parts[name] = share * totals["layer loop"]
    execute = sum(parts.values())
    parts["engine other"] = max(totals["step"] - execute, 0.0)
    print(f"{args.workload}: {wall:.2f} s wall, {totals['step']:.2f} s in steps"
          + ("" if loop is not None else " (no C layer loop: kernels not split)"))
    for name, sec in sorted(parts.items(), key=lambda kv: -kv[1]):
        if sec > 0:
            print(f"  {100 * sec / wall:5.1f}%  {sec:6.2f} s  {name}")


if __name__ == "__main__":
    main()
