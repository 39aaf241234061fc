"""KV memory a long request holds on a stack that mixes sliding-window and global layers:
one block table for every layer (what the engine does for such stacks when the model class
has no ``supports_hybrid_kv``) against the hybrid manager's per-group tables
(``inflight/core/hybrid_kv.py``: the engine's layout for Gemma 2/3 and mixed Qwen2/Qwen3 stacks). Counts only, no timing:

    python benchmarks/hybrid_kv_blocks.py                       # 4,096 tokens, 1,024 window, 1:1
    python benchmarks/hybrid_kv_blocks.py --pattern 6 --layers 26 --window 512   # Gemma 3 1B's shape

The request is a prompt computed in ``--chunk``-token chunks, then decodes to
``--tokens``. Reported: peak and final blocks, and the same in layer-blocks (a block
times the layers it holds: proportional to bytes), for all layers global, one shared
table (the windowed layers read their window from it: no saving), and hybrid groups.
"""
from __future__ import annotations

import argparse
import json

from inflight.core.hybrid_kv import HybridKVCacheManager, group_layers
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.request import Request
from inflight.sampling_params import SamplingParams


def held_blocks(kv, prompt: int, total: int, chunk: int) -> tuple[int, int]:
    """(peak, final) pool blocks of one request driven as the scheduler drives it (the
    last token is sampled, never computed)."""
    sp = SamplingParams(temperature=0.0, max_tokens=total - prompt, ignore_eos=True)
    req = Request("a", list(range(prompt)), sp, eos_token_ids=(-1,))
    peak = 0
    while req.num_tokens < total:
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        if not kv.allocate_slots(req, n):
            raise SystemExit("the pool is too small; raise --num-blocks")
        peak = max(peak, kv.num_blocks_of("a"))
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token(5)
    return peak, kv.num_blocks_of("a")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=4000)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--pattern", type=int, default=2, help="every n-th layer global (Gemma 2: 2, Gemma 3: 6)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--num-blocks", type=int, default=100_000)
    args = ap.parse_args()
    windows = [None if (i + 1) % args.pattern == 0 else args.window for i in range(args.layers)]
    groups = group_layers(windows)
    group_size = len(groups[0].layers)
    shared = held_blocks(KVCacheManager(args.num_blocks, args.block_size), args.prompt, args.tokens, args.chunk)
    hybrid = held_blocks(HybridKVCacheManager(args.num_blocks, args.block_size, False, groups),
                         args.prompt, args.tokens, args.chunk)
    rows = {"shared table": (shared, args.layers),
            f"hybrid, {len(groups)} groups of {group_size} layers": (hybrid, group_size)}
    for name, ((peak, final), layers) in rows.items():
        print(json.dumps({"layout": name, "peak_blocks": peak, "final_blocks": final,
                          "peak_layer_blocks": peak * layers, "final_layer_blocks": final * layers,
                          "final_vs_shared": round(final * layers / (shared[1] * args.layers), 3)}))


if __name__ == "__main__":
    main()
