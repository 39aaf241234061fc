"""``CustomOp``: one op, a reference implementation and per-platform fast ones.

As vLLM's ``CustomOp``: ``forward_native`` is plain torch and runs everywhere (the
reference the tests compare against); ``forward_cpu`` and ``forward_cuda`` may
override it. An op runs ``forward_native`` until the platform layer calls
:meth:`CustomOp.dispatch_to`, so a model built for the torch reference path never
touches a kernel.
"""
from __future__ import annotations

from torch import nn


class CustomOp(nn.Module):
    """Base of ops with per-platform implementations; subclasses define ``forward_native``."""

    def __init__(self) -> None:
        super().__init__()
        self._forward_impl = self.forward_native

    def forward(self, *args, **kwargs):
        return self._forward_impl(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)

    def dispatch_to(self, device_type: str) -> None:
        """Run ``forward_<device_type>`` from now on (``native``: the reference)."""
        self._forward_impl = getattr(self, f"forward_{device_type}")


def dispatch_custom_ops(model: nn.Module, device_type: str) -> int:
    """Point every ``CustomOp`` in ``model`` at ``device_type``'s implementation; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, CustomOp):
            module.dispatch_to(device_type)
            count += 1
    return count
