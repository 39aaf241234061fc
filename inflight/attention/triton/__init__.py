"""Attention on NVIDIA GPUs through Triton kernels (and on CPU tensors through Triton's
interpreter, for tests). Importing this package only imports Triton to learn whether
it is there (about 0.3 s); the kernels are compiled on first use."""
from __future__ import annotations

from typing import Any

from inflight.attention.triton.runtime import HAS_TRITON, can_launch, interpreting

__all__ = ["HAS_TRITON", "TritonAttentionBackend", "can_launch", "interpreting", "is_available"]


def is_available() -> bool:
    """Triton is importable (whether a kernel can run on a given tensor: ``can_launch``)."""
    return HAS_TRITON


def __getattr__(name: str) -> Any:
    if name == "TritonAttentionBackend":
        if not HAS_TRITON:
            raise ImportError("the Triton attention backend needs `pip install triton`")
        from inflight.attention.triton.backend import TritonAttentionBackend

        return TritonAttentionBackend
    raise AttributeError(name)
