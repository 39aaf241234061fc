"""Paged prefill attention (float32, or bfloat16 with ``--dtype bfloat16``): this checkout's
kernel against another checkout's, interleaved in one process (the host's load drifts;
alternating calls see the same).

    python benchmarks/prefill_attention_ab.py --baseline /path/to/other/checkout [--dtype bfloat16]

SmolLM2's heads by default (9 query heads over 3 kv heads, head_dim 64; ``--heads 16,8,128``
for Qwen3-0.6B's), 16-token blocks at random places. Each case is one step's prefill chunks: N requests with C cached tokens and Q
new ones each. Prints each kernel's median call time, the GFLOP/s it reaches (causal
query-key pairs only, 4 x heads x head_dim each) and the largest difference between outputs.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

from checkout_kernels import ab_setup, time_interleaved
from inflight.kernels.cpu.isa import current_level

BS = 16
CASES = [(1, 0, 1024), (1, 2048, 1024), (1, 3072, 512), (2, 512, 512), (8, 0, 128), (4, 1024, 40)]


def chunk(n: int, ctx: int, new: int, g: torch.Generator, dtype: torch.dtype, heads: tuple) -> tuple:
    H, KVH, D = heads
    per = -(-(ctx + new) // BS)
    nb = n * per + 1
    tables = torch.randperm(nb, generator=g)[:n * per].view(n, per).clone()
    kc, vc = (torch.randn(nb, BS, KVH, D, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(n * new, H * D + 2 * KVH * D, generator=g).to(dtype)  # rows of a fused qkv output
    q_start = torch.arange(n, dtype=torch.int64) * new
    q_len = torch.full((n,), new, dtype=torch.int64)
    return q, kc, vc, tables, q_start, q_len, q_len + ctx


def workspace(libs: dict[str, ctypes.CDLL], q_len, seq_len, heads: tuple) -> torch.Tensor:
    """The bf16 kernel's workspace for one case (it repacks K and V there first), sized for
    either library, allocated and touched once outside the timed calls as the engine does."""
    p = ctypes.c_void_p
    nbytes = 1
    for lib in libs.values():
        lib.paged_prefill_workspace.restype = ctypes.c_int64
        nbytes = max(nbytes, lib.paged_prefill_workspace(p(seq_len.data_ptr()), p(q_len.data_ptr()), len(q_len),
                                                         *heads))
    return torch.zeros(nbytes, dtype=torch.uint8)


def call(lib: ctypes.CDLL, heads: tuple, q, kc, vc, tables, q_start, q_len, seq_len, out, ws) -> None:
    H, KVH, D = heads
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = lib.paged_prefill_bf16 if q.dtype == torch.bfloat16 else lib.paged_prefill_f32
    rc = fn(p(q.data_ptr()), i64(q.stride(0)), p(kc.data_ptr()), p(vc.data_ptr()),
            p(tables.data_ptr()), i64(tables.stride(0)), p(q_start.data_ptr()), p(q_len.data_ptr()),
            p(seq_len.data_ptr()), p(out.data_ptr()), len(q_len), H, KVH, D, BS,
            ctypes.c_float(D ** -0.5), None if ws is None else p(ws.data_ptr()))
    assert rc == 0, "the prefill kernel refused the shape"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--heads", default="9,3,64", help="query heads, kv heads, head_dim")
    libs, args = ab_setup("paged_prefill", ap)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    print(f"level {current_level().name}, {args.dtype}, heads {args.heads}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}")
    heads = tuple(int(v) for v in args.heads.split(","))
    H, D = heads[0], heads[2]
    for n, ctx, new in CASES:
        inputs = chunk(n, ctx, new, g, dtype, heads)
        flops = n * 4 * H * D * new * (ctx + (new + 1) / 2)
        outs = {k: torch.zeros(n * new, H * D, dtype=dtype) for k in libs}
        ws = workspace(libs, inputs[5], inputs[6], heads) if dtype == torch.bfloat16 else None
        times = time_interleaved(libs, lambda k, lib: call(lib, heads, *inputs, outs[k], ws), args.repeats)
        a, b = (statistics.median(times[k]) for k in libs)
        diff = (outs["baseline"].float() - outs["this"].float()).abs().max().item()
        print(f"{n} x (ctx {ctx:4d} + {new:4d} new): baseline {a * 1e3:6.2f} ms ({flops / a / 1e9:3.0f} GFLOP/s), "
              f"this {b * 1e3:6.2f} ms ({flops / b / 1e9:3.0f} GFLOP/s) = {b / a:.2f}x, max difference {diff:.1e}")


if __name__ == "__main__":
    main()
