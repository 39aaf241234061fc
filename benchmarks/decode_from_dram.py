"""The float32 paged decode kernel reading its K/V from DRAM, as in serving: one pool per
layer, so a step's pools (1.5 GB by default) are far larger than the caches, and
16-token blocks at random places. Prints the time of one pass over every layer and the
K/V bytes read per second.

    python benchmarks/decode_from_dram.py [--seqs 64] [--context 512] [--layers 30] [--repeats 3]
    BASE=../before; for tree in $BASE .; do PYTHONPATH=$tree python benchmarks/decode_from_dram.py; done

SmolLM2's shape (9 query heads over 3 kv heads of 64). Compare two checkouts by running
the script with each on PYTHONPATH, alternating, nothing else running.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

from inflight.kernels.cpu.build import load_library, ptr

H, KVH, D = 9, 3, 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lib = load_library("paged_decode")
    if lib is None:
        raise SystemExit("no C kernels on this machine")
    s, ctx, bs = args.seqs, args.context, args.block_size
    per = -(-ctx // bs)
    nb = s * per + 1
    pools = [(torch.randn(nb, bs, KVH, D), torch.randn(nb, bs, KVH, D)) for _ in range(args.layers)]
    tables = torch.randperm(nb)[:s * per].view(s, per).contiguous()
    lens = torch.full((s,), ctx, dtype=torch.int64)
    q, out = torch.randn(s, H, D), torch.empty(s, H, D)
    fn = lib.paged_decode_f32
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    fn.argtypes = [vp, i64, vp, vp, vp, i64, vp, vp, i32, i32, i32, i32, i32, ctypes.c_float, i32]

    def one_pass() -> float:
        t = time.perf_counter()
        for kc, vc in pools:
            fn(ptr(q), H * D, ptr(kc), ptr(vc), ptr(tables), per, ptr(lens), ptr(out), s, H, KVH, D, bs,
               D ** -0.5, ctx)
        return time.perf_counter() - t

    one_pass()
    times = [one_pass() for _ in range(args.repeats)]
    nbytes = args.layers * s * ctx * KVH * D * 4 * 2
    print(f"{args.layers} layers x {s} seqs x {ctx} tokens, blocks of {bs}: min {min(times) * 1e3:.1f} ms, "
          f"median {statistics.median(times) * 1e3:.1f} ms, {nbytes / min(times) / 1e9:.2f} GB/s of K/V")


if __name__ == "__main__":
    main()
