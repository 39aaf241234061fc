"""The paged decode kernel (float32, or bf16) reading its K/V from DRAM, as in serving: one pool per
layer, so a step's pools (1.5 GB by default) are far larger than the caches, and
16-token blocks at random places. Prints the time of one pass over every layer and the
K/V bytes read per second.

    python benchmarks/decode_from_dram.py [--seqs 64] [--context 512] [--layers 30] [--repeats 3]
    python benchmarks/decode_from_dram.py --baseline ../before --repeats 9
    python benchmarks/decode_from_dram.py --dtype bfloat16   # the bf16 kernel (AVX-512-BF16 only)
    python benchmarks/decode_from_dram.py --kv-cache-dtype fp8  # over fp8 pools (codes and scales)

SmolLM2's shape (9 query heads over 3 kv heads of 64). With --baseline, that checkout's
paged_decode.c is built too (this checkout's flags) and the two kernels' passes alternate
in one process, so both see the host's load as it drifts; nothing else should run.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

from checkout_kernels import load_from_checkout, time_interleaved
from inflight.attention.kv_quant import fp8_row_bytes
from inflight.kernels.cpu.build import load_library, ptr
from inflight.worker.huge_pages import zeros_huge

H, KVH, D = 9, 3, 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", help="another checkout of inflight: its kernel against this one's")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
    args = ap.parse_args()
    lib = load_library("paged_decode")
    if lib is None:
        raise SystemExit("no C kernels on this machine")
    libs = {"baseline": load_from_checkout(args.baseline, "paged_decode"), "this": lib} if args.baseline else {"this": lib}
    s, ctx, bs = args.seqs, args.context, args.block_size
    per = -(-ctx // bs)
    nb = s * per + 1
    dtype = getattr(torch, args.dtype)
    fp8 = args.kv_cache_dtype == "fp8"
    fn = ("paged_decode_f32" if dtype == torch.float32 else "paged_decode_bf16") + ("_kvfp8" if fp8 else "")

    def pool() -> torch.Tensor:  # on huge pages where the kernel allows, as the engine's (platforms/cpu.py)
        if not fp8:
            return zeros_huge((nb, bs, KVH, D), dtype).normal_()
        rows = zeros_huge((nb, bs, KVH, fp8_row_bytes(D)), torch.uint8)
        rows[..., :D] = torch.randint(0x08, 0x78, (nb, bs, KVH, D), dtype=torch.uint8)  # normal codes
        rows[..., :D] |= torch.randint(0, 2, (nb, bs, KVH, D), dtype=torch.uint8) << 7
        rows[..., D:].view(torch.bfloat16).fill_(0.01)
        return rows

    pools = [(pool(), pool()) for _ in range(args.layers)]
    tables = torch.randperm(nb)[:s * per].view(s, per).contiguous()
    lens = torch.full((s,), ctx, dtype=torch.int64)
    q, out = torch.randn(s, H, D, dtype=dtype), torch.empty(s, H, D, dtype=dtype)
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    for one in libs.values():
        getattr(one, fn).argtypes = [vp, i64, vp, vp, vp, i64, vp, vp, i32, i32, i32, i32, i32, ctypes.c_float, i32]

    def one_pass(name: str, one: ctypes.CDLL) -> None:
        for kc, vc in pools:
            getattr(one, fn)(ptr(q), H * D, ptr(kc), ptr(vc), ptr(tables), per, ptr(lens), ptr(out), s, H, KVH,
                             D, bs, D ** -0.5, ctx)

    time_interleaved(libs, one_pass, 1)  # warm-up
    times = time_interleaved(libs, one_pass, args.repeats)
    nbytes = args.layers * s * ctx * KVH * (fp8_row_bytes(D) if fp8 else D * dtype.itemsize) * 2
    for k, ts in times.items():
        print(f"{k}: {args.layers} layers x {s} seqs x {ctx} tokens, blocks of {bs}: min {min(ts) * 1e3:.1f} ms, "
              f"median {statistics.median(ts) * 1e3:.1f} ms, {nbytes / statistics.median(ts) / 1e9:.2f} GB/s of K/V")
    if args.baseline:
        print(f"this / baseline, medians: {statistics.median(times['this']) / statistics.median(times['baseline']):.2f}x")


if __name__ == "__main__":
    main()
