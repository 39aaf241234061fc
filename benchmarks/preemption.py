"""Scheduling under pressure: a chat-shaped workload on a KV pool too small
for it, offline through LLM.generate on the embedded model (bfloat16).

    python benchmarks/preemption.py [--num-requests 48] [--num-blocks 160] [--out out/preemption.json]

Runs: recompute vs swap preemption, each with and without the admission watermark;
then the priority policy with a random 10% of requests at high priority. Reports
output tok/s, TTFT/TPOT p50/p99 and preemption counts per run (one engine, so the
model loads once; each run gets a fresh scheduler and an empty prefix cache).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from inflight import LLM, SamplingParams
from inflight.bench.metrics import percentile
from inflight.bench.workload import generate
from inflight.core.scheduler import Scheduler


def fresh_scheduler(llm: LLM, num_blocks: int, num_host_blocks: int, **sched) -> Scheduler:
    eng = llm.llm_engine
    cfg = replace(eng.config.scheduler_config, **sched)
    eng.scheduler = Scheduler(cfg, eng.config.cache_config, num_blocks, eng.max_model_len, num_host_blocks)
    return eng.scheduler


def run(llm: LLM, reqs, priorities=None) -> dict:
    sps = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    t0 = time.time()
    outs = llm.generate([r.prompt for r in reqs], sps, use_tqdm=False, priority=priorities)
    wall = time.time() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    ttft = [o.metrics.first_token_time - t0 for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / max(len(o.outputs[0].token_ids) - 1, 1)
            for o in outs]
    s = llm.llm_engine.scheduler
    res = {"wall_s": wall, "output_tok_s": n_out / wall, "ttft_p50_s": percentile(ttft, 50),
           "ttft_p99_s": percentile(ttft, 99), "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
           "preemptions": s.num_preemptions, "swap_outs": s.num_swap_outs, "swap_fallbacks": s.num_swap_fallbacks}
    if priorities:
        hi = [t for t, p in zip(ttft, priorities) if p < 0]
        lo = [t for t, p in zip(ttft, priorities) if p >= 0]
        res.update({"ttft_high_p50_s": percentile(hi, 50), "ttft_high_p99_s": percentile(hi, 99),
                    "ttft_rest_p50_s": percentile(lo, 50), "ttft_rest_p99_s": percentile(lo, 99)})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--num-blocks", type=int, default=160, help="KV blocks of 16 tokens (small: forces preemption)")
    ap.add_argument("--num-host-blocks", type=int, default=400)
    ap.add_argument("--out", default=None)
    ap.add_argument("--priority-only", action="store_true", help="skip the recompute/swap runs")
    args = ap.parse_args()
    llm = LLM(dtype="bfloat16", num_gpu_blocks_override=args.num_blocks, num_cpu_blocks_override=args.num_host_blocks,
              preemption_mode="swap", max_num_seqs=64, max_num_batched_tokens=512, enable_prefix_caching=False)
    reqs = generate("chat", llm.get_tokenizer(), num_requests=args.num_requests)
    results = {"num_requests": len(reqs), "num_blocks": args.num_blocks, "runs": {}}
    for mode in () if args.priority_only else ("recompute", "swap"):
        for wm in (0.0, 0.05):
            fresh_scheduler(llm, args.num_blocks, args.num_host_blocks if mode == "swap" else 0,
                            preemption_mode=mode, watermark=wm)
            results["runs"][f"{mode}, watermark {wm:.0%}"] = r = run(llm, reqs)
            print(f"{mode:>9} watermark {wm:4.0%}: {r['output_tok_s']:6.1f} tok/s  TTFT p50/p99 "
                  f"{r['ttft_p50_s']:.1f}/{r['ttft_p99_s']:.1f} s  TPOT p50/p99 {r['tpot_p50_s']:.3f}/"
                  f"{r['tpot_p99_s']:.3f} s  preemptions {r['preemptions']} (swap-outs {r['swap_outs']})", flush=True)
    prios = [-1 if i % 10 == 9 else 0 for i in range(len(reqs))]  # every tenth request is urgent
    for policy in ("fcfs", "priority"):
        fresh_scheduler(llm, args.num_blocks, 0, preemption_mode="recompute", scheduling_policy=policy)
        results["runs"][f"{policy}, 10% high priority"] = r = run(llm, reqs, prios)
        print(f"{policy:>9}: TTFT high p50/p99 {r['ttft_high_p50_s']:.1f}/{r['ttft_high_p99_s']:.1f} s, rest "
              f"{r['ttft_rest_p50_s']:.1f}/{r['ttft_rest_p99_s']:.1f} s, {r['output_tok_s']:.1f} tok/s, "
              f"preemptions {r['preemptions']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
