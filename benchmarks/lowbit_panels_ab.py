"""The low-bit panels (kernels/cpu/panel_lowbit.py) on and off in one process, alternately, on
one workload offline (every request at once, greedy, ignore_eos, default settings):
wall time per run, the median per mode, and whether both modes generate the same tokens.

    python benchmarks/lowbit_panels_ab.py [--workload decode] [--repeats 2]

The prefix cache is emptied before each run (else every run after the first would skip
its prompts). "Off" sets the row limit to 0, so every projection reads its fp32 panels; the weights,
the engine and the machine are otherwise the same, and the modes alternate so that both
see the same host load.
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
    args = ap.parse_args()
    llm = LLM()
    model = llm.llm_engine.runner.model
    bits = [getattr(m, "lowbit_bits", 0) for m in model.modules()]
    limit = lowbit_linears(model)[0].lowbit_max_rows  # this machine's (kernels/cpu/lowbit_rows.py)
    print(f"{bits.count(4)} projections have 4-bit panels, {bits.count(8)} 8-bit ones (row limit {limit})")
    reqs = load_jsonl(os.path.join(SHARED, f"{args.workload}.jsonl"))
    prompts = [r.prompt for r in reqs]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0) for r in reqs]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    times: dict[str, list[float]] = {"fp32": [], "lowbit": []}
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for mode, rows in (("fp32", 0), ("lowbit", limit)):
            set_rows(model, rows)
            llm.llm_engine.scheduler.kv.reset_prefix_cache()  # no run reuses an earlier one's prompts
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            times[mode].append(time.perf_counter() - t0)
            tokens[mode] = [o.outputs[0].token_ids for o in outs]
            print(f"{mode:6s} {times[mode][-1]:7.2f} s", flush=True)
    out_tokens = sum(len(t) for t in tokens["lowbit"])
    a, b = statistics.median(times["fp32"]), statistics.median(times["lowbit"])
    print(f"{args.workload}: fp32 panels {a:.2f} s ({out_tokens / a:.1f} out tok/s), low-bit panels {b:.2f} s "
          f"({out_tokens / b:.1f} out tok/s): {a / b:.2f}x; same tokens: {tokens['fp32'] == tokens['lowbit']}")


if __name__ == "__main__":
    main()
