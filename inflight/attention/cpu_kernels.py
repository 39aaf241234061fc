"""Builds and loads the C kernels in csrc/ with the system compiler, through ctypes.

Plain C with no torch headers compiles in about a second, so the library is
built on first use and cached; without a compiler the engine falls back to the
torch reference backend.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from typing import Optional

logger = logging.getLogger(__name__)

# NOTE: not -ffast-math: linking with it pulls in crtfastmath.o, which turns on
# flush-to-zero for the whole process when the library loads. Reassociation alone
# is what lets the compiler vectorise the dot products.
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]


@functools.lru_cache(maxsize=None)
def _machine_key() -> str:
    """What -march=native compiles for: a library built on one CPU may crash
    (SIGILL) on another that shares the cache directory, so the CPU is in the key."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return platform.machine() + " " + flags


def ptr(t) -> ctypes.c_void_p:
    """A tensor's data pointer for a kernel argument."""
    return ctypes.c_void_p(t.data_ptr())


def _cache_dir() -> str:
    base = os.environ.get("INFLIGHT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "inflight")
    return os.path.join(base, "kernels")


@functools.lru_cache(maxsize=None)
def load_library(name: str = "paged_decode") -> Optional[ctypes.CDLL]:
    """Compile (once per source hash) and load csrc/<name>.c; None when that is impossible."""
    if os.environ.get("INFLIGHT_DISABLE_C_KERNELS"):
        return None
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    csrc = resources.files("inflight.attention").joinpath("csrc")
    source = csrc.joinpath(f"{name}.c").read_text()
    headers = {f.name: f.read_text() for f in sorted(csrc.iterdir(), key=lambda f: f.name) if f.name.endswith(".h")}
    key = source + "".join(headers.values()) + " ".join(_FLAGS) + _machine_key()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"{name}-{digest}.so")
    if not os.path.exists(path):
        if cc is None:
            logger.warning("no C compiler found: using the torch attention backend")
            return None
        os.makedirs(_cache_dir(), exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, f"{name}.c")
            for fname, text in {f"{name}.c": source, **headers}.items():
                with open(os.path.join(tmp, fname), "w") as f:
                    f.write(text)
            out = os.path.join(tmp, "lib.so")
            res = subprocess.run([cc, *_FLAGS, src, "-o", out, "-lm"], capture_output=True, text=True)
            if res.returncode != 0:
                logger.warning("building C kernel %s failed, using torch attention: %s", name, res.stderr[-500:])
                return None
            os.replace(out, path)  # atomic: a concurrent builder never sees half a file
    return ctypes.CDLL(path)
