"""Paged decode on batches whose requests share cached prefix blocks (prefix
caching): this checkout's kernel against another checkout's, interleaved in one process.

    python benchmarks/shared_prefix_decode.py --baseline /path/to/other/checkout [--dtype bfloat16]

SmolLM2's heads (9 query heads over 3 kv heads, head_dim 64, 16-token blocks at random
places). Each case is a decode step of N requests: the first P keys in the same blocks
for all of them, then 1..S keys of their own. Prints the median of each kernel's calls
and the largest difference between their outputs; a case with P = 0 shares nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

from checkout_kernels import ab_setup, time_interleaved
from inflight.kernels.cpu.isa import current_level

H, KVH, D, BS = 9, 3, 64, 16
CASES = [(96, 512, 150), (96, 0, 150), (64, 512, 100), (32, 256, 64), (24, 1024, 64), (8, 512, 64), (96, 0, 600),
         (64, 0, 300)]


def step(n: int, prefix: int, own: int, g: torch.Generator, dtype: torch.dtype) -> tuple:
    lens = prefix + torch.randint(1, own, (n,), generator=g)
    per = -(-int(lens.max()) // BS)
    shared = prefix // BS
    nb = shared + n * per + 1
    tables = torch.randperm(nb, generator=g)[shared:shared + n * per].view(n, per).clone()
    tables[:, :shared] = torch.randperm(nb, generator=g)[:shared]  # NOTE: may reuse an own block id: reads only
    kc, vc = torch.randn(nb, BS, KVH, D, generator=g).to(dtype), torch.randn(nb, BS, KVH, D, generator=g).to(dtype)
    q = torch.randn(n, H * D + 2 * KVH * D, generator=g).to(dtype)  # rows of a fused qkv output
    return q, kc, vc, tables, lens


def call(lib: ctypes.CDLL, q, kc, vc, tables, lens, out) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = lib.paged_decode_bf16 if q.dtype == torch.bfloat16 else lib.paged_decode_f32
    fn(p(q.data_ptr()), i64(q.stride(0)), p(kc.data_ptr()), p(vc.data_ptr()), p(tables.data_ptr()),
       i64(tables.stride(0)), p(lens.data_ptr()), p(out.data_ptr()), q.shape[0], H, KVH, D, BS,
       ctypes.c_float(D ** -0.5), int(lens.max()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    libs, args = ab_setup("paged_decode", ap)
    repeats, dtype = args.repeats, getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    print(f"level {current_level().name}, {args.dtype}, {torch.get_num_threads()} threads")
    for n, prefix, own in CASES:
        inputs = step(n, prefix, own, g, dtype)
        outs = {k: torch.zeros(n, H * D, dtype=dtype) for k in libs}
        times = time_interleaved(libs, lambda k, lib: call(lib, *inputs, outs[k]), repeats)
        a, b = (statistics.median(times[k]) * 1e3 for k in libs)
        diff = (outs["baseline"].float() - outs["this"].float()).abs().max().item()
        print(f"{n:3d} requests, {prefix:4d} shared keys, 1-{own} own: baseline {a:.3f} ms, this {b:.3f} ms "
              f"({b / a:.2f}x), max difference {diff:.1e}")


if __name__ == "__main__":
    main()
