"""Tensor parallelism's overhead on one machine: TP=2 against TP=1 (run on a quiet machine).

Saves a random-weight Llama (``--preset``: ``small`` 8 layers, hidden 768, 12 heads;
``quick``: a 2-layer toy that only checks the script runs), then

1. per rank, in processes this script starts (gloo on the CPU): the forward time of a
   decode step of ``B`` sequences of ``--context`` tokens and of one prefill chunk,
   and within it the time spent in collectives (the all-reduces after o_proj and
   down_proj, the embedding's all-reduce, the logits gather; waiting for the slower
   rank included), with their count and bytes per step;
2. end to end through the engine (``LLM``; TP=2 runs the mp executor): wall time and
   output tokens/s of a batch of greedy requests, which adds the scheduler output's
   trip to the workers.

Threads: each rank gets ``--threads`` (default: the cores split evenly), pinned, as
the mp executor does.

    python benchmarks/tp_overhead.py --preset small --json results/tp_overhead.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

PRESETS = {
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000),
    "quick": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512),
}


def save_model(folder: str, preset: str) -> None:
    """A random-weight LlamaForCausalLM and a byte-level tokenizer, saved by transformers."""
    import torch
    import transformers

    from inflight.loader.testing import write_tiny_gguf

    write_tiny_gguf(os.path.join(folder, "tok.gguf"), None)
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf").save_pretrained(folder)
    os.remove(os.path.join(folder, "tok.gguf"))
    cfg = transformers.LlamaConfig(max_position_embeddings=4096, tie_word_embeddings=False, **PRESETS[preset])
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)


def _decode_batch(kv_caches, block_size: int, batch: int, context: int):
    """Inputs of a decode step: ``batch`` sequences with ``context`` tokens each in their own blocks."""
    import torch

    from inflight.attention.base import AttentionMetadata

    per = -(-(context + 1) // block_size)
    tables = torch.arange(batch * per, dtype=torch.int64).view(batch, per)
    positions = torch.full((batch,), context, dtype=torch.int64)
    slots = tables[torch.arange(batch), positions // block_size] * block_size + positions % block_size
    lens = [context + 1] * batch
    md = AttentionMetadata(slot_mapping=slots, block_tables=tables, seq_lens=torch.tensor(lens),
                           query_start_loc_list=list(range(batch + 1)), seq_lens_list=lens, num_decodes=batch,
                           block_size=block_size, max_decode_seq_len=context + 1)
    return torch.zeros(batch, dtype=torch.int64), positions, md


class CollectiveTimer:
    """Wraps torch.distributed's all_reduce and all_gather to add up their time and bytes."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.seconds, self.calls, self.bytes = 0.0, 0, 0
        for name in ("all_reduce", "all_gather"):
            setattr(dist, name, self._wrap(getattr(dist, name)))

    def _wrap(self, fn):
        def timed(tensor_or_list, *args, **kwargs):
            t0 = time.perf_counter()
            out = fn(tensor_or_list, *args, **kwargs)
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            t = args[0] if isinstance(tensor_or_list, list) else tensor_or_list
            self.bytes += t.numel() * t.element_size()
            return out
        return timed

    def reset(self) -> None:
        self.seconds, self.calls, self.bytes = 0.0, 0, 0


def _time_forward(model, runner, inputs, timer, iters: int) -> dict:
    import torch

    ids, positions, md = inputs
    times, comm = [], []
    with torch.inference_mode():
        for i in range(iters + 2):
            if timer:
                timer.reset()
            t0 = time.perf_counter()
            hidden = model(ids, positions, runner.kv_caches, md)
            model.compute_logits(hidden[-min(len(ids), 64):])
            if i >= 2:  # two warm-up steps
                times.append(time.perf_counter() - t0)
                comm.append(timer.seconds if timer else 0.0)
    return {"step_ms": 1e3 * statistics.median(times), "collective_ms": 1e3 * statistics.median(comm),
            "collectives": timer.calls if timer else 0, "collective_bytes": timer.bytes if timer else 0}


def rank_main(rank: int, world: int, port: int, folder: str, args, queue) -> None:
    """One rank: build the shard as the engine does, time decode and prefill steps."""
    from inflight.config import EngineConfig
    from inflight.distributed.parallel_state import init_distributed_environment
    from inflight.executor.worker import pin_cores
    from inflight.loader import load_model
    from inflight.worker.builder import build_runner
    from inflight.worker.kv_cache import dummy_prefill_batch

    import torch
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) // world))
    pin_cores(rank, world)
    init_distributed_environment(world, rank, f"tcp://127.0.0.1:{port}")
    timer = CollectiveTimer() if world > 1 else None
    blocks = max(b for b in args.batch) * (-(-(args.context + 1) // 16)) + 64
    config = EngineConfig.from_kwargs(model=folder, dtype="float32", tensor_parallel_size=world,
                                      num_gpu_blocks_override=blocks)
    loaded = load_model(folder)
    built = build_runner(config, loaded.hf_config, loaded.weights)
    model, runner = built.runner.model, built.runner
    result = {}
    for b in args.batch:
        result[f"decode_b{b}"] = _time_forward(model, runner, _decode_batch(runner.kv_caches, 16, b, args.context),
                                               timer, args.iters)
    ids, positions, _, md = dummy_prefill_batch(built.arch, 16, torch.float32, torch.device("cpu"),
                                                args.prefill, args.prefill)
    result[f"prefill_{args.prefill}"] = _time_forward(model, runner, (ids, positions, md), timer,
                                                      max(2, args.iters // 4))
    queue.put((rank, result))


def per_rank(folder: str, world: int, args) -> dict:
    import multiprocessing as mp

    from inflight.executor.worker import free_port

    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, folder, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    return results[0]


def end_to_end(folder: str, world: int, args) -> dict:
    from inflight import LLM, SamplingParams

    llm = LLM(folder, dtype="float32", tensor_parallel_size=world)
    prompts = [[5 + (i * 7 + j * 13) % 250 for j in range(args.prompt_len)] for i in range(args.requests)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=sp, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    llm.llm_engine.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"wall_s": wall, "output_tok_s": tokens / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, default=256, help="tokens of context per decoding sequence")
    ap.add_argument("--prefill", type=int, default=512, help="tokens of the prefill step")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="threads per rank (default: cores / ranks)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--skip-engine", action="store_true", help="per-rank timings only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        save_model(folder, args.preset)
        report = {"preset": args.preset, "cores": len(os.sched_getaffinity(0)), "per_rank": {}, "engine": {}}
        for world in (1, 2):
            report["per_rank"][f"tp{world}"] = per_rank(folder, world, args)
            if not args.skip_engine:
                report["engine"][f"tp{world}"] = end_to_end(folder, world, args)
    for case, one in report["per_rank"]["tp1"].items():
        two = report["per_rank"]["tp2"][case]
        print(f"{case:>14}: TP=1 {one['step_ms']:8.2f} ms  TP=2 {two['step_ms']:8.2f} ms "
              f"(collectives {two['collective_ms']:.2f} ms in {two['collectives']} calls, "
              f"{two['collective_bytes'] / 1024:.0f} KiB)")
    for world, r in report["engine"].items():
        print(f"engine {world}: {r['output_tok_s']:.1f} output tok/s ({r['wall_s']:.2f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
