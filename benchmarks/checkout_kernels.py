"""Another checkout's C kernel, built with this checkout's flags for this CPU's level, so
a benchmark can time both kernels interleaved in one process (the host's load drifts;
alternating calls see the same)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile

from inflight.kernels.cpu import build
from inflight.kernels.cpu.isa import current_level


def load_from_checkout(checkout: str, name: str) -> ctypes.CDLL:
    """``checkout``'s inflight/kernels/cpu/csrc/<name>.c as a loaded shared library."""
    csrc = os.path.join(checkout, "inflight/kernels/cpu/csrc")
    with tempfile.TemporaryDirectory() as tmp:  # a loaded library outlives its file
        out = os.path.join(tmp, f"{name}.so")
        subprocess.run(["gcc", *build.compile_flags(current_level()), os.path.join(csrc, f"{name}.c"), "-o", out,
                        "-lm"], check=True, cwd=csrc)
        return ctypes.CDLL(out)


def this_checkout() -> str:
    """The checkout whose inflight package this process imports."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(build.__file__)))))
