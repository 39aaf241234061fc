"""The measurements of the device benchmark: decode sweep with HBM bandwidth, offline
chat throughput, in-process serving with Poisson arrivals, greedy parity with transformers."""
from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any, Optional

import torch

from inflight.bench.metrics import RequestRecord, nearest_rank, summarize
from inflight.bench.throughput import record_step_outputs
from inflight.bench.workload import WorkloadRequest
from inflight.sampling_params import SamplingParams

# Datasheet HBM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name().
CARD_PEAK_BW = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.039e12,
                "A100 80GB PCIe": 1.935e12, "A100": 1.555e12, "L40S": 0.864e12, "L4": 0.3e12, "A10": 0.6e12}


def card_peak_bandwidth(name: str) -> Optional[float]:
    for key, bw in CARD_PEAK_BW.items():  # ordered: more specific names first
        if key in name:
            return bw
    return None


def measure_copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (a practical ceiling)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1000 / iters
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


def chat_requests(n: int, vocab_size: int, seed: int = 0) -> list[WorkloadRequest]:
    """The project's chat shape (inflight/bench/workload.py: prompt ~ lognormal median 150,
    output ~ median 86) with random token ids as prompts (no tokenizer needed)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        plen, olen = _lognormal(rng, 150, 0.8, 16, 1024), _lognormal(rng, 86, 0.8, 8, 512)
        ids = [rng.randrange(3, vocab_size) for _ in range(plen)]
        out.append(WorkloadRequest(f"chat-{i}", ids, plen, olen))  # type: ignore[arg-type]
    return out


def kv_bytes_per_token(hf: dict[str, Any], dtype_bytes: int = 2) -> int:
    return 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * hf["head_dim"] * dtype_bytes


def decode_bytes_per_step(hf: dict[str, Any], weight_bytes: int, batch: int, mean_ctx: float) -> float:
    """HBM bytes one decode step must read: every weight once (an untied embedding table is
    only gathered, ``batch`` rows) plus every running request's KV."""
    emb = 2 * hf["vocab_size"] * hf["hidden_size"]
    weights = weight_bytes - (emb if not hf["tie_word_embeddings"] else 0)
    return weights + batch * mean_ctx * kv_bytes_per_token(hf)


def decode_sweep(llm, hf: dict[str, Any], weight_bytes: int, batches: list[int], prompt_len: int = 128,
                 steps: int = 64, peak_bw: Optional[float] = None, seed: int = 0) -> list[dict[str, Any]]:
    """Per batch size: time ``steps`` engine steps once every request is decoding."""
    engine = llm.llm_engine
    rng = random.Random(seed)
    graphs = engine.runner.graph_runner
    rows = []
    for b in batches:
        params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
        ids = [f"dec{b}-{i}" for i in range(b)]
        for rid in ids:
            engine.add_request(rid, [rng.randrange(3, hf["vocab_size"]) for _ in range(prompt_len)], params)
        started: set[str] = set()
        while len(started) < b:  # prefill (chunked) until every request has its first token
            started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
        replays0 = graphs.num_replays if graphs else 0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        fwd_s = replay_seconds(graphs, b)  # before draining: the static buffers hold this batch
        while engine.has_unfinished_requests():
            engine.step()
        step_s = statistics.median(times)
        nbytes = decode_bytes_per_step(hf, weight_bytes, b, prompt_len + 1 + steps / 2)  # mean context
        row = {"batch": b, "step_ms_p50": 1000 * step_s, "step_ms_p90": 1000 * nearest_rank(times, 90),
               "tokens_per_s": b / step_s, "hbm_bytes_per_s": nbytes / step_s,
               "hbm_fraction_of_peak": nbytes / step_s / peak_bw if peak_bw else None,
               "graph_replays": (graphs.num_replays - replays0) if graphs else 0}
        if fwd_s:  # the forward pass alone (graph replay): what the kernels achieve without host overhead
            last = decode_bytes_per_step(hf, weight_bytes, b, prompt_len + steps)
            row.update(forward_ms=1000 * fwd_s,
                       forward_hbm_fraction_of_peak=last / fwd_s / peak_bw if peak_bw else None)
        rows.append(row)
    return rows


def replay_seconds(graphs, batch: int, iters: int = 20) -> Optional[float]:
    """Mean time of one replay of the decode graph last used for ``batch`` rows (CUDA events).
    Replaying rewrites the K/V the last step wrote, with the same values: harmless."""
    if graphs is None:
        return None
    from inflight.worker.cuda_graphs import padded_size

    size = padded_size(batch, graphs.sizes)
    graph = graphs.graphs.get(size) if size else None
    if graph is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / iters



def serve_poisson(llm, requests: list[WorkloadRequest], rate: float, seed: int = 0) -> dict[str, Any]:
    """In-process serving: requests arrive as a Poisson process of ``rate``/s (``inf``: all at
    once) while the engine steps; TTFT/TPOT as vLLM's benchmark_serving defines them, minus HTTP."""
    engine = llm.llm_engine
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in requests:
        arrivals.append(t)
        t += rng.expovariate(rate) if math.isfinite(rate) else 0.0
    recs = {f"srv-{i}": RequestRecord(id=r.id, prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens)
            for i, r in enumerate(requests)}
    keys, last, nxt = list(recs), {}, 0
    t0 = time.perf_counter()
    while nxt < len(requests) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < len(requests) and arrivals[nxt] <= now:
            r = requests[nxt]
            engine.add_request(keys[nxt], r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens,
                                                                   ignore_eos=True))
            recs[keys[nxt]].start = now
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(arrivals[nxt] - now, 0.01)))
            continue
        outs = engine.step()
        record_step_outputs(outs, recs, last, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    summary = summarize(list(recs.values()), wall)
    summary["request_rate"] = rate if math.isfinite(rate) else "inf"
    return summary


def greedy_parity(llm, weights: dict[str, torch.Tensor], hf: dict[str, Any], prompts: list[list[int]],
                  max_tokens: int) -> dict[str, Any]:
    """Our greedy tokens against transformers' ``generate`` on the same weights (float32, GPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in hf.items() if k not in ("architectures", "model_type")}
    ref = LlamaForCausalLM(LlamaConfig(**cfg))
    ref.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    ref.tie_weights()
    ref = ref.to("cuda").eval()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                         use_tqdm=False)]
    theirs = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p], device="cuda")
            y = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            theirs.append(y[0, len(p):].tolist())
    first_diff = [next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), None) for o, t in zip(ours, theirs)]
    return {"prompts": len(prompts), "max_tokens": max_tokens, "exact": all(d is None for d in first_diff),
            "first_divergence": first_diff}
