"""The CPU's vector ISA level, detected once from its flags, and the compiler flags
that build a kernel for each level.

Levels, lowest first: ``scalar`` (portable C, whatever the compiler vectorizes for the
architecture's baseline), ``avx2`` (AVX2 + FMA: 8 fp32 lanes), ``avx512`` (AVX-512F/BW/VL/DQ:
16 lanes), ``avx512_bf16`` (plus the bf16 dot product), ``amx_bf16`` (plus Intel's AMX tile
multiplies for the bf16 GEMM; every other kernel builds as at avx512_bf16), and ``neon`` on
aarch64 (4 lanes).
``INFLIGHT_CPU_ISA`` forces a lower level, so one machine tests every build it can run.
``INFLIGHT_CPU_ISA=avx512_bf16-emulated`` (or ``avx512-emulated``) runs an AVX-512 level's code
on an AVX2 CPU: the intrinsics come from SIMDe (csrc/avx512_emu.h), correct but slow; for tests.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class IsaLevel:
    """One vector ISA level: its name, fp32 lanes per vector, and the flags that target it."""

    name: str
    arch: str  # platform.machine() family: "x86_64" or "aarch64"
    rank: int  # higher runs everything a lower rank of the same arch runs
    lanes: int
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the level needs
    emulated: bool = False  # built for AVX2 with the AVX-512 intrinsics emulated (emulated())

    @property
    def has_bf16_dot(self) -> bool:
        return self.name in ("avx512_bf16", "amx_bf16")

    @property
    def has_amx(self) -> bool:
        """AMX tiles: no emulation of them exists, so the level runs natively or not at all."""
        return "amx_bf16" in self.cpu_flags


_AVX512 = ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
LEVELS: tuple[IsaLevel, ...] = (
    IsaLevel("scalar", "x86_64", 0, 1, ("-mtune=generic",), ()),
    IsaLevel("avx2", "x86_64", 1, 8, ("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c")),
    IsaLevel("avx512", "x86_64", 2, 16, (*_AVX512, "-mprefer-vector-width=512"),
             ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    IsaLevel("avx512_bf16", "x86_64", 3, 16, (*_AVX512, "-mavx512bf16", "-mprefer-vector-width=512"),
             ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")),
    # NOTE: also defines avx512_bf16's macro: every kernel but the bf16 GEMM is that level's build
    IsaLevel("amx_bf16", "x86_64", 4, 16, (*_AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16",
                                           "-DINFLIGHT_ISA_AVX512_BF16=1", "-mprefer-vector-width=512"),
             ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
              "amx_tile", "amx_bf16")),
    IsaLevel("scalar", "aarch64", 0, 1, ("-march=armv8-a+nosimd",), ()),
    IsaLevel("neon", "aarch64", 1, 4, ("-march=armv8-a",), ("asimd",)),
)


EMULATION_HEADER = "avx512_emu.h"  # in csrc/; needs SIMDe's headers (Debian: libsimde-dev)
EMULATED_SUFFIX = "-emulated"


def emulated(level: IsaLevel) -> IsaLevel:
    """``level`` (an AVX-512 one) built to run on an AVX2 CPU: the avx2 flags, the level's own
    ``INFLIGHT_ISA_*`` macro, and csrc/avx512_emu.h force-included, which maps the AVX-512
    intrinsics onto SIMDe's portable versions. The same code paths, slowly: for tests."""
    if level.arch != "x86_64" or level.lanes != 16 or level.has_amx:
        raise ValueError(f"only the AVX-512 levels are emulated, not {level.name}")
    avx2 = get_level("avx2", "x86_64")
    return replace(level, cflags=(*avx2.cflags, "-Wno-psabi", "-include", EMULATION_HEADER),
                   cpu_flags=avx2.cpu_flags, emulated=True)


def simde_available() -> bool:
    """Whether SIMDe's AVX-512 header is on the C compiler's default include path."""
    dirs = [*os.environ.get("C_INCLUDE_PATH", "").split(":"), *os.environ.get("CPATH", "").split(":"),
            "/usr/local/include", "/usr/include"]
    return any(d and os.path.exists(os.path.join(d, "simde", "x86", "avx512.h")) for d in dirs)


def emulated_levels() -> list[IsaLevel]:
    """The AVX-512 levels this machine runs only through emulation (an x86-64 CPU with AVX2
    but without them, and SIMDe installed), lowest first."""
    if machine_arch() != "x86_64" or not simde_available():
        return []
    native = supported_levels()
    if get_level("avx2", "x86_64") not in native:
        return []
    return [emulated(lv) for lv in LEVELS
            if lv.arch == "x86_64" and lv.lanes == 16 and not lv.has_amx and lv not in native]


def get_level(name: str, arch: str | None = None) -> IsaLevel:
    """The level called ``name`` on ``arch`` (this machine's by default)."""
    arch = arch or machine_arch()
    for lv in LEVELS:
        if lv.name == name and lv.arch == arch:
            return lv
    names = ", ".join(lv.name for lv in LEVELS if lv.arch == arch)
    raise ValueError(f"no ISA level {name!r} on {arch}; the levels are {names}")


def machine_arch() -> str:
    m = platform.machine().lower()
    return "aarch64" if m in ("aarch64", "arm64") else "x86_64" if m in ("x86_64", "amd64") else m


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        line = ""
    return frozenset(line.split(":", 1)[-1].split())


def supported_levels(arch: str | None = None, flags: frozenset[str] | None = None) -> list[IsaLevel]:
    """Every level this CPU runs, lowest first."""
    arch = arch or machine_arch()
    flags = cpu_flags() if flags is None else flags
    if arch == "aarch64" and not flags:
        flags = frozenset({"asimd"})  # NEON is part of every aarch64 CPU (macOS has no /proc)
    levels = [lv for lv in LEVELS if lv.arch == arch and set(lv.cpu_flags) <= flags]
    return sorted(levels, key=lambda lv: lv.rank)


def _forced() -> str:
    return os.environ.get("INFLIGHT_CPU_ISA", "").strip().lower()


@functools.lru_cache(maxsize=None)
def _detect(forced: str) -> IsaLevel | None:
    levels = supported_levels()
    if not levels:
        return None
    if not forced or forced == "native":
        return levels[-1]
    if forced.endswith(EMULATED_SUFFIX):
        name = forced[: -len(EMULATED_SUFFIX)]
        found = [lv for lv in emulated_levels() if lv.name == name]
        if not found:
            raise ValueError(f"INFLIGHT_CPU_ISA={forced!r}: only avx512 and avx512_bf16 are emulated, on an "
                             "x86-64 CPU with AVX2 that lacks them, with SIMDe's headers (Debian: libsimde-dev)")
        return found[0]
    level = get_level(forced)
    if level not in levels:
        raise ValueError(f"INFLIGHT_CPU_ISA={forced!r}: this CPU runs only {', '.join(lv.name for lv in levels)}")
    return level


def current_level() -> IsaLevel | None:
    """The level kernels are built for: the highest this CPU runs, or ``INFLIGHT_CPU_ISA``;
    None on an architecture with no kernels (the engine then runs plain torch)."""
    return _detect(_forced())
