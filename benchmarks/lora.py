"""The cost of serving LoRA adapters, offline on one engine: the same requests with no
LoRA at all, on a LoRA engine without adapters, all with one adapter, and spread over
two adapters in the same batches.

    python benchmarks/lora.py [MODEL] [--workload decode] [--num-requests 48] [--repeats 3] [--rank 16]

The adapters are random PEFT folders (every projection of every layer, rank --rank)
written for the model, so any model works offline. Each repeat runs every mode once,
in a rotated order; medians over repeats. Prints output tokens/s, TTFT and TPOT
percentiles, and each mode's throughput against no LoRA.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from inflight import LLM, LoRARequest
from inflight.bench.metrics import nearest_rank
from inflight.bench.throughput import run_offline
from inflight.bench.workload import generate
from inflight.lora.testing import write_random_adapter
from inflight.models.registry import arch_spec

MODES = ("no-lora", "lora-engine, base", "one adapter", "two adapters")


def run_mode(llm: LLM, requests, loras) -> dict[str, float]:
    recs, wall = run_offline(llm, requests, show_progress=False, lora_requests=loras)
    ttft = [r.ttft for r in recs]
    tpot = [(r.e2e - r.ttft) / max(r.output_tokens - 1, 1) for r in recs]
    return {"out_tok_s": sum(r.output_tokens for r in recs) / wall, "ttft_p50_s": nearest_rank(ttft, 50),
            "ttft_p99_s": nearest_rank(ttft, 99), "tpot_p50_ms": 1e3 * nearest_rank(tpot, 50),
            "tpot_p99_ms": 1e3 * nearest_rank(tpot, 99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--workload", default="decode")
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the medians as JSON here")
    ap.add_argument("--write-adapter", default=None, metavar="DIR",
                    help="only write one random adapter for the model here (for the served comparison) and exit")
    args = ap.parse_args()
    if args.write_adapter:
        llm = LLM(args.model, dtype=args.dtype, enable_lora=True, max_lora_rank=args.rank)
        e = llm.llm_engine
        stacked = arch_spec(e.arch.architecture).stacked
        write_random_adapter(args.write_adapter, e.runner.lora.targets, stacked, args.rank, 1)
        return

    lora_llm = LLM(args.model, dtype=args.dtype, enable_lora=True, max_loras=2, max_lora_rank=args.rank)
    plain = LLM(args.model, dtype=args.dtype)
    engine = lora_llm.llm_engine
    requests = generate(args.workload, engine.tokenizer, num_requests=args.num_requests)
    tmp = tempfile.mkdtemp(prefix="inflight-lora-bench-")
    adapters = []
    for i in (1, 2):
        folder = os.path.join(tmp, f"adapter{i}")
        stacked = arch_spec(engine.arch.architecture).stacked
        write_random_adapter(folder, engine.runner.lora.targets, stacked, args.rank, i)
        adapters.append(LoRARequest(f"adapter{i}", i, folder))
    n = len(requests)
    plan = {"no-lora": (plain, None), "lora-engine, base": (lora_llm, None),
            "one adapter": (lora_llm, [adapters[0]] * n),
            "two adapters": (lora_llm, [adapters[i % 2] for i in range(n)])}
    for llm in (plain, lora_llm):  # warm-up: each engine's first full batch (its pools' first touch) untimed
        run_mode(llm, requests, None)
    for llm, loras in plan.values():  # every adapter loaded, every path run once
        run_mode(llm, requests[:4], loras[:4] if loras else None)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for rep in range(args.repeats):
        for mode in MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]:
            llm, loras = plan[mode]
            results[mode].append(run_mode(llm, requests, loras))
            print(f"repeat {rep + 1} {mode}: {results[mode][-1]['out_tok_s']:.1f} out tok/s", flush=True)
    medians = {m: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for m, runs in results.items()}
    base = medians["no-lora"]["out_tok_s"]
    print(f"\n{args.workload}, {n} requests, rank {args.rank}, {engine.dtype}, medians of {args.repeats}")
    print(f"{'mode':<20}{'out tok/s':>10}{'vs no-lora':>11}{'TTFT p50/p99 s':>17}{'TPOT p50/p99 ms':>18}")
    for m, r in medians.items():
        print(f"{m:<20}{r['out_tok_s']:>10.1f}{r['out_tok_s'] / base:>10.2f}x"
              f"{r['ttft_p50_s']:>8.2f}/{r['ttft_p99_s']:<8.2f}{r['tpot_p50_ms']:>8.1f}/{r['tpot_p99_ms']:<8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"workload": args.workload, "num_requests": n, "rank": args.rank, "dtype": str(engine.dtype),
                       "medians": medians, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
