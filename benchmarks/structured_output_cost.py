"""What a JSON schema on every request costs, on one engine: the chat workload (greedy,
ignore_eos), in rounds that alternate a plain arm and an arm where every request carries a
schema constraining its whole output. Per run and arm: output throughput, TTFT and TPOT
p50 / p99, process CPU time per output token; then each arm's median over the rounds and
the schema / plain ratios (the targets: throughput and TPOT p99 within 10%).

    python benchmarks/structured_output_cost.py --num-requests 32 --rounds 3
    python benchmarks/structured_output_cost.py --request-rate 2   # Poisson arrivals, as served

Latencies are what the engine's caller sees (``inflight bench throughput``'s records): a
token counts when a step hands it back, from the request's arrival. With the default
``--request-rate inf`` every request arrives at once, so TTFT is mostly queueing; a finite
rate adds requests while the engine steps. Each run has its own prefix-cache salt, so no
run reuses another's prompt blocks. ``--arms plain,schema,schema-unfused`` adds the schema
arm with greedy rows forced off the fused lm_head argmax (full logits, masked, argmax'ed).
"""
from __future__ import annotations

import argparse
import collections
import math
import statistics
import time
from typing import Any, Optional

from inflight import LLM, SamplingParams
from inflight.bench.client import arrival_offsets
from inflight.bench.common import make_report, make_run, write_report
from inflight.bench.metrics import RequestRecord, summarize
from inflight.bench.throughput import record_step_outputs
from inflight.bench.workload import generate
from inflight.sampling_params import StructuredOutputsParams

# Open-ended (no maxLength, no maxItems): the grammar stays active until max_tokens.
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "items": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "items"], "additionalProperties": False}
ARMS = ("plain", "schema", "schema-unfused")
COLUMNS = (("output_throughput", "out tok/s", "{:>10.1f}"), ("ttft_p50_ms", "TTFT p50", "{:>10.0f}"),
           ("ttft_p99_ms", "TTFT p99", "{:>10.0f}"), ("tpot_p50_ms", "TPOT p50", "{:>10.1f}"),
           ("tpot_p99_ms", "TPOT p99", "{:>10.1f}"), ("cpu_ms_per_token", "CPU/tok", "{:>10.1f}"))


def chat_prompts(llm: LLM, texts: list[str]) -> list[list[int]]:
    """Each text as one user turn under the model's chat template, as ``LLM.chat`` sends it."""
    tok = llm.get_tokenizer()
    return [tok(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                        add_generation_prompt=True), add_special_tokens=False).input_ids
            for t in texts]


def run_arm(llm: LLM, tag: str, prompts: list[list[int]], max_tokens: list[int],
            so: Optional[StructuredOutputsParams], offsets: list[float]) -> tuple[list[RequestRecord], float, float]:
    """Add each request at its arrival offset and step the engine until all finish;
    returns the records, the wall time and the process CPU time."""
    engine = llm.llm_engine
    recs = {f"{tag}-{i}": RequestRecord(id=f"{tag}-{i}", prompt_tokens=len(p), max_tokens=n)
            for i, (p, n) in enumerate(zip(prompts, max_tokens))}
    todo = collections.deque(zip(recs, prompts, max_tokens, offsets))
    last: dict[str, float] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()
    while todo or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while todo and todo[0][3] <= now:
            rid, p, n, at = todo.popleft()
            params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, structured_outputs=so)
            engine.add_request(rid, {"prompt_token_ids": p}, params, cache_salt=tag)
            recs[rid].start = at  # late adds count as queueing, as a server's would
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, todo[0][3] - (time.perf_counter() - t0)))
            continue
        outs = engine.step()
        record_step_outputs(outs, recs, last, time.perf_counter() - t0)
    return list(recs.values()), time.perf_counter() - t0, time.process_time() - cpu0


def _force_unfused(llm: LLM, on: bool) -> None:
    """Greedy rows with a grammar off the fused lm_head argmax (``on``), or back on it."""
    model = llm.llm_engine.runner.model
    model.__dict__.pop("greedy_tokens", None)
    if on and hasattr(model, "greedy_tokens"):
        fused = model.greedy_tokens
        model.greedy_tokens = lambda h, vocab, grammar=None: None if grammar is not None else fused(h, vocab)


def _line(label: str, s: dict[str, float], ref: Optional[dict[str, float]] = None) -> str:
    if ref is None:
        return f"{label:<22}" + "".join(fmt.format(s[k]) for k, _, fmt in COLUMNS)
    return f"{label:<22}" + "".join(f"{s[k] / ref[k]:>10.3f}" for k, _, _ in COLUMNS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson); inf: all at once")
    p.add_argument("--max-tokens", type=int, default=None, help="every request's output length (default: the chat shape's)")
    p.add_argument("--arms", default="plain,schema", help=f"comma list from {', '.join(ARMS)}")
    p.add_argument("--dtype", default=None, help="the engine's dtype (default: the platform's)")
    p.add_argument("--result-file", default=None, help="write every run's records as JSON here")
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or any(a not in ARMS for a in arms):
        p.error(f"--arms: choose from {', '.join(ARMS)}")
    llm = LLM(**({"dtype": args.dtype} if args.dtype else {}))
    if "schema-unfused" in arms and llm.llm_engine.runner is None:
        p.error("schema-unfused needs the model runner in this process (one rank)")
    reqs = generate("chat", llm.get_tokenizer(), num_requests=args.num_requests)
    prompts = chat_prompts(llm, [r.prompt for r in reqs])
    max_tokens = [args.max_tokens or r.max_tokens for r in reqs]
    offsets = arrival_offsets(len(reqs), args.request_rate)
    schema = StructuredOutputsParams(json=SCHEMA)
    run_arm(llm, "warmup", prompts[:2], [4, 4], schema, [0.0, 0.0])  # compile the schema, warm up
    print(f"{'run':<22}" + "".join(f"{h:>10}" for _, h, _ in COLUMNS) + "  (latencies, CPU: ms)", flush=True)
    runs: list[dict[str, Any]] = []
    by_arm: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for rnd in range(args.rounds):
        for arm in arms:
            _force_unfused(llm, arm == "schema-unfused")
            records, wall, cpu = run_arm(llm, f"{arm}-{rnd}", prompts, max_tokens,
                                         None if arm == "plain" else schema, offsets)
            s = summarize(records, wall)
            s["cpu_ms_per_token"] = cpu / max(s["total_output_tokens"], 1) * 1e3
            print(_line(f"{arm} round {rnd}", s) + (f"  FAILED {s['failed']:.0f}" if s["failed"] else ""),
                  flush=True)
            by_arm[arm].append(s)
            runs.append(make_run(f"{arm}-{rnd}", "structured_output_cost",
                                 {"arm": arm, "round": rnd, "request_rate": args.request_rate}, s, records))
    _force_unfused(llm, False)
    medians = {arm: {k: statistics.median(s[k] for s in ss) for k, _, _ in COLUMNS} for arm, ss in by_arm.items()}
    print("median over rounds:")
    for arm, m in medians.items():
        print(_line(arm, m))
    if "plain" in medians:
        for arm in (a for a in arms if a != "plain"):
            print(_line(f"{arm} / plain", medians[arm], medians["plain"]))
    write_report(make_report(runs), args.result_file)


if __name__ == "__main__":
    main()
