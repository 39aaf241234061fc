"""The low-bit panels (kernels/cpu/panel_lowbit.py) under several row limits in one process,
alternately, on one workload offline (every request at once, greedy, ignore_eos, default
settings): wall time per run, the median per limit, and whether every limit generates the
same tokens.

    python benchmarks/lowbit_panels_ab.py [--workload decode] [--repeats 2] [--limits 0 8 128]

The prefix cache is emptied before each run (else every run after the first would skip
its prompts). Limit 0 means every projection reads its fp32 panels; the default pair is 0
and the limit measured on this machine. The weights, the engine and the machine are
otherwise the same, and the limits alternate so that all see the same host load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from inflight import LLM, SamplingParams
from inflight.bench.workload import load_jsonl
from inflight.kernels.cpu.lowbit_rows import lowbit_linears, set_max_rows

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads")


def set_rows(model, rows: int) -> None:
    """Steps of at most ``rows`` tokens read the low-bit panels (C layer loop and Python linears)."""
    set_max_rows(lowbit_linears(model), rows)
    loop = getattr(model, "layer_loop", None)
    if loop is not None:
        loop.dims.lowbit_max_rows = rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="decode")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limits", type=int, nargs="*", default=None,
                    help="row limits to alternate (default: 0, then this machine's measured one)")
    args = ap.parse_args()
    llm = LLM()
    model = llm.llm_engine.runner.model
    bits = [getattr(m, "lowbit_bits", 0) for m in model.modules()]
    measured = lowbit_linears(model)[0].lowbit_max_rows  # this machine's (kernels/cpu/lowbit_rows.py)
    print(f"{bits.count(4)} projections have 4-bit panels, {bits.count(8)} 8-bit ones (row limit {measured})")
    limits = args.limits if args.limits else [0, measured]
    reqs = load_jsonl(os.path.join(SHARED, f"{args.workload}.jsonl"))
    prompts = [r.prompt for r in reqs]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0) for r in reqs]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    times: dict[int, list[float]] = {rows: [] for rows in limits}
    tokens: dict[int, list] = {}
    for _ in range(args.repeats):
        for rows in limits:
            set_rows(model, rows)
            llm.llm_engine.scheduler.kv.reset_prefix_cache()  # no run reuses an earlier one's prompts
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            times[rows].append(time.perf_counter() - t0)
            tokens[rows] = [o.outputs[0].token_ids for o in outs]
            print(f"limit {rows:4d} {times[rows][-1]:7.2f} s", flush=True)
    out_tokens = sum(len(t) for t in tokens[limits[0]])
    base = statistics.median(times[limits[0]])
    for rows in limits:
        t = statistics.median(times[rows])
        print(f"{args.workload}: limit {rows}: {t:.2f} s ({out_tokens / t:.1f} out tok/s), {t / base:.3f}x the time "
              f"of limit {limits[0]}; same tokens: {tokens[rows] == tokens[limits[0]]}")


if __name__ == "__main__":
    main()
