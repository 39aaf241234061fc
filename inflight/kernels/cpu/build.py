"""Builds and loads the C kernels in csrc/ with the system compiler, through ctypes.

Plain C with no torch headers compiles in about a second, so each library is built on
first use for the CPU's ISA level (isa.py) and cached by source hash, flags and level;
without a compiler the engine falls back to plain torch. The same sources build for
every level: csrc/vec.h maps one set of vector operations onto AVX2, AVX-512, NEON or
plain C, chosen by the ``INFLIGHT_ISA_*`` macro the flags define.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from typing import Optional

from inflight.cache_root import cache_root
from inflight.kernels.cpu.isa import IsaLevel, current_level

logger = logging.getLogger(__name__)

# NOTE: not -ffast-math: linking with it pulls in crtfastmath.o, which turns on
# flush-to-zero for the whole process when the library loads. Reassociation alone
# is what lets the compiler vectorise the dot products.
_FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
          "-fopenmp", "-shared", "-fPIC"]


def ptr(t) -> ctypes.c_void_p:
    """A tensor's data pointer for a kernel argument."""
    return ctypes.c_void_p(t.data_ptr())


def _cache_dir() -> str:
    return os.path.join(cache_root(), "kernels")


def sources(name: str) -> dict[str, str]:
    """``{file name: text}`` of csrc/<name>.c and every header beside it."""
    csrc = resources.files("inflight.kernels.cpu").joinpath("csrc")
    files = {f"{name}.c": csrc.joinpath(f"{name}.c").read_text()}
    files.update({f.name: f.read_text() for f in sorted(csrc.iterdir(), key=lambda f: f.name)
                  if f.name.endswith(".h")})
    return files


def compile_flags(level: IsaLevel) -> list[str]:
    # an emulated level at -O1: at -O3 GCC spends minutes inlining SIMDe's lane loops (-O0
    # compiles faster still, but the model then runs ten times slower)
    flags = ["-O1" if f == "-O3" and level.emulated else f for f in _FLAGS]
    return [*flags, *level.cflags, f"-DINFLIGHT_ISA_{level.name.upper()}=1"]


def compile_library(name: str, level: IsaLevel, out: str, cc: str) -> subprocess.CompletedProcess:
    """Compile csrc/<name>.c for ``level`` into the shared library ``out`` with ``cc``
    (a cross compiler builds another architecture's level)."""
    with tempfile.TemporaryDirectory() as tmp:
        for fname, text in sources(name).items():
            with open(os.path.join(tmp, fname), "w") as f:
                f.write(text)
        # cwd: where an -include'd header (an emulated level's) is looked up first
        cmd = [cc, *compile_flags(level), os.path.join(tmp, f"{name}.c"), "-o", os.path.abspath(out), "-lm"]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)


def load_library(name: str = "paged_decode", level: Optional[IsaLevel] = None) -> Optional[ctypes.CDLL]:
    """Compile (once per source hash and ISA level) and load csrc/<name>.c; None when
    that is impossible. ``level`` defaults to the CPU's (or ``INFLIGHT_CPU_ISA``)."""
    if os.environ.get("INFLIGHT_DISABLE_C_KERNELS"):
        return None
    level = level or current_level()
    return None if level is None else _load(name, level)


def library_path(name: str, level: IsaLevel, cross_cc: Optional[str] = None) -> Optional[str]:
    """The shared library of csrc/<name>.c built for ``level``, compiled on first use and
    cached by source hash and flags; None without a compiler or when the build fails.
    ``level`` need not be this CPU's: building runs nothing. ``cross_cc`` (a compiler
    for ``level.arch``, e.g. aarch64-linux-gnu-gcc) builds another architecture's level."""
    cc = shutil.which(cross_cc) if cross_cc else shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    key = "".join(sources(name).values()) + " ".join(compile_flags(level)) + os.path.basename(cross_cc or "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    tag = f"{level.name}-emulated" if level.emulated else level.name
    if cross_cc:
        tag = f"{level.arch}-{tag}"
    path = os.path.join(_cache_dir(), f"{name}-{tag}-{digest}.so")
    if os.path.exists(path):
        return path
    if cc is None:
        logger.warning("no C compiler found: the CPU kernels are off, plain torch runs")
        return None
    os.makedirs(_cache_dir(), exist_ok=True)
    with _locked(f"{path}.lock"):  # another process building the same library: wait for it
        if not os.path.exists(path):
            tmp_out = f"{path}.{os.getpid()}.tmp"
            res = compile_library(name, level, tmp_out, cc)
            if res.returncode != 0:
                logger.warning("building C kernel %s for %s failed: %s", name, level.name, res.stderr[-800:])
                return None
            os.replace(tmp_out, path)  # atomic: a reader that takes no lock never sees half a file
    return path


@contextlib.contextmanager
def _locked(lock_path: str):
    """An exclusive lock on lock_path (created if absent) for the with-block, released when
    it ends or its process dies."""
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@functools.lru_cache(maxsize=None)
def _load(name: str, level: IsaLevel) -> Optional[ctypes.CDLL]:
    path = library_path(name, level)
    return None if path is None else ctypes.CDLL(path)
