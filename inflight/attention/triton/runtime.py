"""Whether Triton is importable and whether a kernel can be launched on a tensor's device.

Triton compiles kernels for CUDA; with ``TRITON_INTERPRET=1`` set *before*
the kernel modules are imported (``@triton.jit`` reads it at decoration time)
it instead runs them in numpy on CPU tensors, which is how the tests check the
kernels on machines without a GPU.
"""
from __future__ import annotations

import os

import torch

try:  # Triton is optional: the CPU build of torch does not pull it in.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False


def interpreting() -> bool:
    """True when Triton runs kernels through its numpy interpreter."""
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "runtime"):
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def can_launch(t: torch.Tensor) -> bool:
    """Can a Triton kernel read ``t`` here: CUDA tensors compiled, CPU tensors interpreted."""
    if not HAS_TRITON:
        return False
    if t.device.type == "cuda":
        return not interpreting()
    return t.device.type == "cpu" and interpreting()


def upcast_for(t: torch.Tensor) -> bool:
    """The interpreter computes on bfloat16's raw bit patterns (it has no numpy bf16 type,
    triton-lang/triton#11584), so interpreted kernels convert every tile to float32 first;
    compiled kernels keep 16-bit operands for the tensor cores."""
    return t.device.type == "cpu"


def dot_precision(dtype: torch.dtype) -> str:
    """float32 models get exact float32 dot products (tf32 would break fp32 parity tests);
    the argument is ignored for 16-bit operands."""
    return "ieee" if dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
