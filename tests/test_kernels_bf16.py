"""The bf16 kernels (gemm_bf16.c, paged_prefill.c's paged_prefill_bf16, paged_decode.c's
paged_decode_bf16 over shared prefixes) on every ISA level,
through one C driver (tests/csrc/bf16_check.c) that checks them against references in
double: built with each level's flags (build.py's compile_flags) and linked against the
engine's kernel libraries for the level (build.library_path), run natively for every
level this CPU runs (the others are only built and linked), and on x86-64 cross-compiled for the
aarch64 levels (neon, scalar) and run under qemu-user: the ``emulated`` tests, which skip
with the reason when gcc-aarch64-linux-gnu / qemu-user are missing (make cross-tools). The
AVX-512 levels also run emulated through SIMDe on a CPU without them (isa.emulated())."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c_build import build_executable, executable_flags, kernel_libraries
from isa_levels import built_here, emulated_o0
from test_kernels_aarch64 import AVX512_LEVELS, avx512_emulation_cc, qemu_aarch64
from inflight.kernels.cpu import build
from inflight.kernels.cpu.isa import LEVELS, IsaLevel, machine_arch, supported_levels

CSRC = Path(build.__file__).parent / "csrc"
DRIVER = Path(__file__).parent / "csrc" / "bf16_check.c"
LIBRARIES = ("gemm_bf16", "paged_prefill", "paged_decode")
HERE = machine_arch()
CROSS_CC = "aarch64-linux-gnu-gcc"


def _build(level: IsaLevel, cc: str, out: Path, opt: str = "-O3") -> subprocess.CompletedProcess:
    """bf16_check for ``level``, linked against the engine's kernel libraries for it."""
    libraries = kernel_libraries(list(LIBRARIES), level, cc)
    return build_executable(cc, executable_flags(level, opt), [(DRIVER, [f"-I{CSRC}"])], out, list(libraries.values()))


def _check(res: subprocess.CompletedProcess, what: str) -> None:
    m = re.search(r"^(\d+) passed, (\d+) failed$", res.stdout, re.M)
    assert m and res.returncode == 0 and m.group(2) == "0", f"{what}:\n{(res.stdout + res.stderr)[-4000:]}"
    assert int(m.group(1)) >= 20, f"{what}: too few checks ran\n{res.stdout[-4000:]}"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "3"}  # an odd split of panels and work items


@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.arch == HERE], ids=lambda lv: lv.name)
def test_bf16_kernels_native(level, tmp_path):
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    runs = level in supported_levels()
    exe = tmp_path / f"bf16_check_{level.name}"
    res = _build(built_here(level), cc, exe, opt="-O3" if runs else "-O0")
    assert res.returncode == 0, f"building bf16_check for {level.name} failed:\n{res.stderr[-4000:]}"
    if runs:  # else it builds; this CPU cannot run it
        _check(subprocess.run([str(exe)], capture_output=True, text=True, env=_env(), timeout=300), level.name)


@pytest.mark.emulated
@pytest.mark.parametrize("level", AVX512_LEVELS, ids=lambda lv: f"{lv.name}-emulated")
def test_bf16_kernels_avx512_emulated(level, tmp_path):
    cc = avx512_emulation_cc()
    exe = tmp_path / f"bf16_check_{level.name}_emulated"
    res = _build(emulated_o0(level), cc, exe, opt="-O0")
    assert res.returncode == 0, f"building bf16_check for {level.name} (emulated) failed:\n{res.stderr[-4000:]}"
    _check(subprocess.run([str(exe)], capture_output=True, text=True, env=_env(), timeout=300), f"{level.name} (emulated)")


@pytest.mark.emulated
@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.arch == "aarch64"], ids=lambda lv: f"aarch64-{lv.name}")
def test_bf16_kernels_aarch64(level, tmp_path):
    if HERE == "aarch64":
        pytest.skip("this machine is aarch64: the native tests run these levels")
    if not shutil.which(CROSS_CC):
        pytest.skip(f"no {CROSS_CC} (Debian: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross; make cross-tools)")
    exe = tmp_path / f"bf16_check_aarch64_{level.name}"
    res = _build(level, CROSS_CC, exe)
    assert res.returncode == 0, f"cross-building bf16_check for aarch64 {level.name} failed:\n{res.stderr[-4000:]}"
    _check(subprocess.run([*qemu_aarch64(), str(exe)], capture_output=True, text=True, env=_env(), timeout=600),
           f"aarch64 {level.name} (qemu)")
