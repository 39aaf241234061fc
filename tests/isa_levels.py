"""The ISA levels the kernel tests run at: every level this CPU runs natively and, where it
lacks AVX-512-BF16, that level emulated through SIMDe (isa.emulated_levels: the same code
paths, slowly), so the bf16 dot-product kernels run on an AVX2 machine too. Without SIMDe's
headers (Debian: libsimde-dev; make cross-tools) only the native levels are listed."""
from __future__ import annotations

from dataclasses import replace

from inflight.kernels.cpu.isa import IsaLevel, emulated, emulated_levels, machine_arch, supported_levels


def _at_o0(level: IsaLevel) -> IsaLevel:
    """``level`` built at -O0: the last -O on the command line wins."""
    return replace(level, cflags=(*level.cflags, "-O0"))


def emulated_o0(level: IsaLevel) -> IsaLevel:
    """``level`` (an AVX-512 one) emulated, built at -O0: the tests' small shapes run fast
    enough, and it compiles in a third of the time. The Python kernel tests and the C check
    drivers use this one build."""
    return _at_o0(level if level.emulated else emulated(level))


def built_here(level: IsaLevel) -> IsaLevel:
    """``level`` as the native kernel tests build it: as the engine does where this CPU runs
    it (or it is another architecture's, run under qemu), else at -O0. A
    level this CPU cannot run is only checked to compile and to hold no instruction from above
    it, and an -O0 build compiles several times faster; a CPU that runs the level checks its
    optimised build."""
    if level.arch != machine_arch() or level in supported_levels():
        return level
    return _at_o0(level)


def kernel_test_levels() -> list[IsaLevel]:
    """The native levels, then the emulated AVX-512-BF16 one (emulated_o0) where there is one."""
    return [*supported_levels(), *(emulated_o0(lv) for lv in emulated_levels() if lv.has_bf16_dot)]


def level_id(level: IsaLevel) -> str:
    return f"{level.name}-emulated" if level.emulated else level.name
