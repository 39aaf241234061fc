"""Compile the kernels for an NVIDIA target without a GPU: catches what the interpreter cannot
(tile shapes tl.dot rejects, operand dtype mismatches, unsupported control flow).

    python -m inflight.attention.triton.compile_check [--arch 90] [--dtypes bf16,fp32]

Must run with TRITON_INTERPRET unset (``@triton.jit`` would otherwise build interpreted
functions). Exit status 0: every variant compiled; 1: a kernel failed to compile;
3: this Triton has no NVIDIA backend or a different ahead-of-time API (nothing checked).
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _variants(dtype: str) -> list[tuple[str, dict]]:
    """(kernel, constexprs) for the shapes the engine launches: Llama-8B-like (GQA 4, head 128)
    and SmolLM2-like (GQA 3, head 64), direct and split decode."""
    prec = "ieee" if dtype == "fp32" else "tf32"
    out: list[tuple[str, dict]] = []
    for group, hd in ((4, 128), (3, 64)):
        for direct in (True, False):
            out.append(("decode1", dict(GROUP=group, HEAD_DIM=hd, PAGE=16, BLOCK_H=16, BLOCK_D=hd, BLOCK_N=64,
                                        DIRECT=direct, UPCAST=False, PREC=prec)))
        out.append(("prefill", dict(GROUP=group, HEAD_DIM=hd, PAGE=16, BLOCK_M=64, BLOCK_N=64 if hd <= 64 else 32,
                                    BLOCK_D=hd, UPCAST=False, PREC=prec)))
    out.append(("decode2", dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_S=16)))
    out.append(("write_kv", dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80 (A100), 90 (H100/H200)")
    p.add_argument("--dtypes", default="bf16,fp32")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET to compile", file=sys.stderr)
        return 3
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from inflight.attention.triton import decode, prefill, write_kv
    except ImportError as e:
        print(f"cannot compile ahead of time here: {e}", file=sys.stderr)
        return 3
    kernels = {"decode1": decode._decode_stage1, "decode2": decode._decode_stage2,
               "prefill": prefill._prefill_kernel, "write_kv": write_kv._write_kv_kernel}
    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    for dtype in args.dtypes.split(","):
        ptr = {"bf16": "*bf16", "fp32": "*fp32", "fp16": "*fp16"}[dtype]
        types = {n: ptr for n in ("Q", "K_CACHE", "V_CACHE", "OUT", "K", "V")}
        types.update({"BLOCK_TABLES": "*i64", "SEQ_LENS": "*i64", "SLOTS": "*i64", "QUERY_START": "*i32",
                      "MID_O": "*fp32", "MID_LSE": "*fp32", "scale": "fp32"})
        for name, consts in _variants(dtype):
            fn = kernels[name]
            names = fn.arg_names
            sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in names}
            t = time.time()
            try:
                src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
                kernel = triton.compile(src, target=target, options={"num_warps": 4})
            except TypeError as e:  # a Triton whose ASTSource takes other arguments
                print(f"unsupported ahead-of-time API: {e}", file=sys.stderr)
                return 3
            except Exception as e:  # noqa: BLE001 - report every failing variant
                failed += 1
                print(f"FAIL {name} {dtype} {consts}: {type(e).__name__}: {str(e)[:400]}")
                continue
            print(f"ok   {name} {dtype} sm_{args.arch} shared={kernel.metadata.shared}B ({time.time() - t:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
