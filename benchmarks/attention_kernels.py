"""CPU attention kernels against the torch reference backend, SmolLM2's shape
(9 query heads over 3 kv heads, head_dim 64, 16-token blocks at random places).

    python benchmarks/attention_kernels.py            # bf16 (the C kernels need AVX-512-BF16)
    python benchmarks/attention_kernels.py --fp32     # float32 (the C kernels on every ISA level)
    OMP_NUM_THREADS=1 python benchmarks/attention_kernels.py --fp32 --cpu-time
        # one thread, CPU time instead of wall time: steadier on a machine others load

Prints the median time of each backend's decode and prefill calls and the
GFLOP/s they reach (4 x heads x head_dim per query-key pair; causal pairs only).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend
from inflight.attention.torch_ref import TorchAttentionBackend

H, KVH, D, BS = 9, 3, 64, 16


DTYPE = torch.bfloat16


def layout(ctx: list[int], new: list[int]) -> tuple:
    """Random pool and block tables for requests with ``ctx`` tokens after this step, ``new`` of them queries."""
    per = max(-(-c // BS) for c in ctx)
    nb = len(ctx) * per + 1
    kc = torch.randn(nb, BS, KVH, D).to(DTYPE)
    vc = torch.randn(nb, BS, KVH, D).to(DTYPE)
    tables = torch.randperm(nb)[:len(ctx) * per].view(len(ctx), per)
    qsl = [0]
    for n in new:
        qsl.append(qsl[-1] + n)
    md = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64), block_tables=tables,
                           seq_lens=torch.tensor(ctx), query_start_loc_list=qsl, seq_lens_list=ctx,
                           num_decodes=sum(1 for n in new if n == 1), block_size=BS,
                           max_decode_seq_len=max([c for c, n in zip(ctx, new) if n == 1], default=0))
    return torch.randn(qsl[-1], H, D).to(DTYPE), kc, vc, md


CLOCK = time.perf_counter


def median_time(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = CLOCK()
        fn()
        times.append(CLOCK() - t)
    return statistics.median(times)


def main() -> None:
    global DTYPE, CLOCK
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32", action="store_true", help="float32 q and caches (default bf16)")
    ap.add_argument("--cpu-time", action="store_true", help="time.process_time (all threads' CPU time) instead "
                    "of wall time; with OMP_NUM_THREADS=1 it is steady on a loaded machine")
    args = ap.parse_args()
    DTYPE = torch.float32 if args.fp32 else torch.bfloat16
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    ref, fast = TorchAttentionBackend(), CpuPagedAttentionBackend()
    cases = [("decode", [300] * 64, [1] * 64), ("decode", [1000] * 16, [1] * 16),
             ("prefill", [512], [512]), ("prefill", [1024], [512]), ("prefill", [3072], [512]),
             ("prefill", [128] * 4, [128] * 4)]
    if DTYPE == torch.float32:
        cases = [("decode", [512] * 32, [1] * 32), *cases[:2], ("prefill", [512], [512]), ("prefill", [1536], [512]),
                 *cases[4:]]
    print(f"{DTYPE}, {torch.get_num_threads()} threads; median of 7, {'CPU' if args.cpu_time else 'wall'} time")
    for kind, ctx, new in cases:
        q, kc, vc, md = layout(ctx, new)
        flops = sum(4 * H * D * n * (c - n + (n + 1) / 2) for c, n in zip(ctx, new))
        k = v = torch.randn(q.shape[0], KVH, D).to(DTYPE)  # the chunk's own K/V (timing only)
        row = []
        for name, be in (("torch", ref), ("C", fast)):
            out = torch.empty_like(q)
            if kind == "decode":
                t = median_time(lambda: be._decode(q, kc, vc, md, D ** -0.5))
            else:
                t = median_time(lambda: be._prefills(q, k, v, kc, vc, md, D ** -0.5, out))
            row.append(f"{name} {t * 1e3:7.2f} ms {flops / t / 1e9:5.0f} GFLOP/s")
        print(f"{kind:7s} {len(ctx):3d} x ctx {ctx[0]:4d} new {new[0]:3d}: " + "   ".join(row))


if __name__ == "__main__":
    main()
