"""Offline throughput: inflight (continuous batching) vs transformers' static `generate`.

    python benchmarks/offline_throughput.py [--workload decode] [--num-requests 96] [--hf-requests 32]

Both run the same requests (from the project's workload generator, or a JSONL file
given with --workload-file) in the same process, in the dtype inflight's "auto" picks
(bfloat16 on a CPU with bf16 units, float32 elsewhere) unless --dtype says otherwise, with
inflight's defaults for the platform unless flags say otherwise, every output generated to
exactly max_tokens (ignore_eos). transformers runs static batches of --hf-batch-size:
each batch generates until its longest member is done; only each request's own
max_tokens count as useful output. Prints tokens/s, TTFT/TPOT percentiles and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from inflight import LLM, SamplingParams
from inflight.bench.metrics import nearest_rank
from inflight.bench.workload import generate, load_jsonl



def latency_percentiles(ttft: list[float], tpot: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p99 of TTFT and TPOT, in seconds."""
    return {"ttft_p50_s": nearest_rank(ttft, 50), "ttft_p99_s": nearest_rank(ttft, 99),
            "tpot_p50_s": nearest_rank(tpot, 50), "tpot_p99_s": nearest_rank(tpot, 99)}


def run_inflight(llm: LLM, reqs) -> dict:
    sps = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    t0 = time.time()
    outs = llm.generate([r.prompt for r in reqs], sps, use_tqdm=True)
    wall = time.time() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    ttft = [o.metrics.first_token_time - t0 for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / max(len(o.outputs[0].token_ids) - 1, 1)
            for o in outs]
    return {"requests": len(reqs), "output_tokens": n_out, "wall_s": wall, "output_tok_s": n_out / wall,
            **latency_percentiles(ttft, tpot)}


def hf_model(dtype: torch.dtype):
    """A plain transformers Llama in ``dtype`` with the same (dequantized) weights.

    Loading the GGUF through transformers keeps the weights quantized and casts
    around every matmul, which would make the baseline unfairly slow."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from inflight.loader import load_model

    loaded = load_model(None)
    cfg = {k: v for k, v in loaded.hf_config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.load_state_dict(loaded.weights, strict=False)
    model.tie_weights()
    return model.to(dtype).eval()


class _StepClock:
    """A logits processor that only records when each generation step happens."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.time())
        return scores


def run_hf_static(reqs, tokenizer, batch_size: int, dtype: torch.dtype) -> dict:
    """transformers' ``generate`` on static batches, every request arriving at t0.

    A request's first token comes with its batch's first step and its last with
    step ``max_tokens``; the batch runs on to its longest member regardless."""
    from transformers import LogitsProcessorList

    model = hf_model(dtype)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    useful, t0 = 0, time.time()
    ttft, tpot = [], []
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i:i + batch_size]
        enc = tokenizer([r.prompt for r in batch], return_tensors="pt", padding=True)
        longest = max(r.max_tokens for r in batch)
        clock = _StepClock()
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id, logits_processor=LogitsProcessorList([clock]))
        for r in batch:
            ttft.append(clock.times[0] - t0)
            tpot.append((clock.times[r.max_tokens - 1] - clock.times[0]) / max(r.max_tokens - 1, 1))
        useful += sum(r.max_tokens for r in batch)
        print(f"transformers batch {i // batch_size + 1}: {longest} steps, {time.time() - t0:.1f}s", file=sys.stderr)
    wall = time.time() - t0
    return {"requests": len(reqs), "useful_output_tokens": useful, "wall_s": wall, "output_tok_s": useful / wall,
            **latency_percentiles(ttft, tpot)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="decode")
    ap.add_argument("--workload-file", default=None)
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--hf-requests", type=int, default=32, help="requests for the transformers baseline (0: skip)")
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--hf-only", action="store_true", help="only the transformers baseline on --hf-requests")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="default: the platform's")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the platform's")
    ap.add_argument("--dtype", default="auto", help="both systems' dtype (auto: what `inflight serve` picks)")
    ap.add_argument("--speculative-config", default=None,
                    help='e.g. \'{"method": "ngram", "num_speculative_tokens": 2}\' (default: off)')
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    llm = LLM(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              speculative_config=args.speculative_config,
              kv_cache_memory=2 * 2**30)
    tok = llm.get_tokenizer()
    dtype = llm.llm_engine.dtype
    reqs = load_jsonl(args.workload_file) if args.workload_file else generate(args.workload, tok)
    reqs = reqs[:args.num_requests] if args.num_requests else reqs
    res = {"machine": f"{os.cpu_count()} cpus, torch {torch.__version__}", "date": time.strftime("%Y-%m-%d"),
           "dtype": str(dtype).removeprefix("torch."),
           "workload": args.workload_file or args.workload}
    if not args.hf_only:
        res["inflight_all"] = run_inflight(llm, reqs)
    if args.hf_only:
        res["hf_static"] = run_hf_static(reqs[:args.hf_requests], tok, args.hf_batch_size, dtype)
    elif args.hf_requests:
        sub = reqs[:args.hf_requests]
        res["inflight_subset"] = run_inflight(llm, sub)
        res["hf_static"] = run_hf_static(sub, tok, args.hf_batch_size, dtype)
        res["ratio_subset"] = res["inflight_subset"]["output_tok_s"] / res["hf_static"]["output_tok_s"]
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
