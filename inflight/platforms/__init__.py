"""The platform layer: one ``Platform`` per device kind (cpu, cuda), detected once."""
from __future__ import annotations

import functools

import torch

from inflight.platforms.interface import Platform

__all__ = ["Platform", "current_platform"]


@functools.lru_cache(maxsize=None)
def _platform(kind: str) -> Platform:
    if kind == "cuda":
        from inflight.platforms.cuda import CudaPlatform
        return CudaPlatform()
    if kind == "cpu":
        from inflight.platforms.cpu import CpuPlatform
        return CpuPlatform()
    raise ValueError(f"unknown device {kind!r}; choose auto, cpu or cuda")


def current_platform(device: str = "auto") -> Platform:
    """The platform for the ``device`` setting: ``auto`` is CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA device is available")
    return _platform(kind)
