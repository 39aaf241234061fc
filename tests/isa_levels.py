"""The ISA levels the kernel tests run at: every level this CPU runs natively and, where it
lacks AVX-512-BF16, that level emulated through SIMDe (isa.emulated_levels: the same code
paths, slowly), so the bf16 dot-product kernels run on an AVX2 machine too. Without SIMDe's
headers (Debian: libsimde-dev; make cross-tools) only the native levels are listed."""
from __future__ import annotations

from dataclasses import replace

from inflight.kernels.cpu.isa import IsaLevel, emulated_levels, supported_levels


def kernel_test_levels() -> list[IsaLevel]:
    """The native levels, then the emulated AVX-512-BF16 one where there is one, built at -O0
    (the last -O wins): the tests' small shapes run fast enough, and it compiles in a third
    of the time."""
    emulated = [replace(lv, cflags=(*lv.cflags, "-O0")) for lv in emulated_levels() if lv.has_bf16_dot]
    return [*supported_levels(), *emulated]


def level_id(level: IsaLevel) -> str:
    return f"{level.name}-emulated" if level.emulated else level.name
