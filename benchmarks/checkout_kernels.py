"""Another checkout's C kernel, built with this checkout's flags for this CPU's level, so
a benchmark can time both kernels interleaved in one process (the host's load drifts;
alternating calls see the same)."""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from typing import Callable

from inflight.kernels.cpu import build
from inflight.kernels.cpu.isa import current_level


def load_from_checkout(checkout: str, name: str) -> ctypes.CDLL:
    """``checkout``'s inflight/kernels/cpu/csrc/<name>.c as a loaded shared library.

    Refuses to run when the inflight package this process imports is not the one beside
    this script: ``python benchmarks/x.py`` puts benchmarks/ on the path, not the checkout,
    so from a worktree it imports the installed (editable) checkout's kernels as "this"."""
    script_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.realpath(script_checkout) != os.path.realpath(this_checkout()):
        raise SystemExit(f"this script is {script_checkout}'s, but it imports inflight from {this_checkout()}: "
                         f"run it with PYTHONPATH={script_checkout}")
    csrc = os.path.join(os.path.abspath(checkout), "inflight/kernels/cpu/csrc")
    with tempfile.TemporaryDirectory() as tmp:  # a loaded library outlives its file
        out = os.path.join(tmp, f"{name}.so")
        subprocess.run(["gcc", *build.compile_flags(current_level()), os.path.join(csrc, f"{name}.c"), "-o", out,
                        "-lm"], check=True, cwd=csrc)
        return ctypes.CDLL(out)


def time_interleaved(libs: dict[str, ctypes.CDLL], run: Callable[[str, ctypes.CDLL], None],
                     repeats: int) -> dict[str, list[float]]:
    """Seconds of each ``run(name, lib)``, ``repeats`` rounds, the libraries taking turns
    within a round."""
    times: dict[str, list[float]] = {k: [] for k in libs}
    for _ in range(repeats):
        for k, lib in libs.items():
            t0 = time.perf_counter()
            run(k, lib)
            times[k].append(time.perf_counter() - t0)
    return times


def this_checkout() -> str:
    """The checkout whose inflight package this process imports."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(build.__file__)))))


def ab_setup(name: str, ap: argparse.ArgumentParser | None = None) -> tuple[dict[str, ctypes.CDLL], argparse.Namespace]:
    """The command line of an A/B script (``--baseline DIR``, ``--repeats``, and what ``ap``
    adds): csrc/<name>.c of the other checkout and of this one, as {"baseline": lib, "this": lib},
    and the parsed arguments."""
    ap = ap or argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="another checkout of inflight")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    return {"baseline": load_from_checkout(args.baseline, name), "this": load_from_checkout(this_checkout(), name)}, args
