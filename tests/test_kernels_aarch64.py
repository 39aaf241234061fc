"""The fp32 CPU kernels on every ISA level, through one C driver (tests/csrc/kernel_check.c
and its parts, tests/csrc/check_*.c).

The driver, built with a level's flags (build.py's compile_flags), is linked against the
kernel libraries the engine loads for that level (build.library_path: the same files,
built once) and checks each kernel against a plain C reference in double. It runs
natively for every level this CPU runs, and, on x86-64, cross-compiled with Debian's
gcc-aarch64-linux-gnu and run under qemu-user for the aarch64 levels (neon; scalar, the
same C as x86-64's scalar level, is only built): the ``emulated`` tests, which skip,
saying why, when those packages are missing (``make cross-tools`` installs them; .ci/run
does). The AVX-512 levels also run on an x86-64 CPU without AVX-512, emulated through SIMDe
(isa.emulated(), Debian's libsimde-dev, also from make cross-tools): the same code paths, slowly.
The levels the CPU cannot run are still built and linked, so a build error on any level fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c_build import build_executable, executable_flags, kernel_libraries
from isa_levels import built_here, emulated_o0
from inflight.kernels.cpu import build
from inflight.kernels.cpu.isa import LEVELS, IsaLevel, get_level, machine_arch, simde_available, supported_levels

CSRC = Path(build.__file__).parent / "csrc"
DRIVER_DIR = Path(__file__).parent / "csrc"
DRIVER = DRIVER_DIR / "kernel_check.c"
DRIVER_SOURCES = (DRIVER, *sorted(DRIVER_DIR.glob("check_*.c")))
# the sources of the kernels the driver checks (kernels.h); one not there yet is left out
KERNEL_SOURCES = ("gemm_f32.c", "fused_ops.c", "paged_decode.c", "paged_prefill.c")
CROSS_CC = "aarch64-linux-gnu-gcc"
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"
HERE = machine_arch()
SUPPORTED = supported_levels()


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def build_driver(level: IsaLevel, cc: str, out: Path, opt: str = "-O3") -> subprocess.CompletedProcess:
    """kernel_check for ``level``: the driver compiled with the level's flags and linked against
    the engine's own kernel libraries for the level (``cc`` a cross compiler for another
    architecture's level); each kernel source is also parsed with kernels.h force-included,
    so a drifted signature is a compile error. Returns the first failing compiler run, or the link."""
    srcs = [CSRC / n for n in KERNEL_SOURCES if (CSRC / n).exists()]
    libraries = kernel_libraries([src.stem for src in srcs], level, cc)
    parse = [cc, *executable_flags(level, "-O0"), "-fsyntax-only", f"-I{CSRC}",
             "-include", str(DRIVER_DIR / "kernels.h")]
    checks = [[*parse, str(src)] for src in srcs]
    sources = [(src, [f"-I{CSRC}", "-Wall", f"-I{DRIVER_DIR}"]) for src in DRIVER_SOURCES]
    return build_executable(cc, executable_flags(level, opt), sources, out, list(libraries.values()), checks)


def check_output(res: subprocess.CompletedProcess, what: str) -> None:
    """All checks passed, and none skipped for a kernel whose source defines it."""
    out = res.stdout + res.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", res.stdout, re.M)
    assert m, f"{what}: no summary line\n{out[-4000:]}"
    assert res.returncode == 0 and m.group(2) == "0", f"{what}: {m.group(0)}\n{out[-4000:]}"
    text = "\n".join((CSRC / n).read_text() for n in KERNEL_SOURCES if (CSRC / n).exists())
    skipped = re.findall(r"^SKIP (\w+):", res.stdout, re.M)
    defined = [s for s in skipped if re.search(rf"^[A-Za-z_][\w \t\*]*\b{s}\s*\(", text, re.M)]
    assert not defined, f"{what}: kernels defined in csrc but not checked: {defined}"
    assert int(m.group(1)) >= 12, f"{what}: too few checks ran\n{out[-4000:]}"


def _env() -> dict[str, str]:
    # 3 threads: an odd split of the GEMM panels and attention items
    return {**os.environ, "OMP_NUM_THREADS": "3"}


# ---- native: every level of this architecture is built; those the CPU runs are run ----

@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.arch == HERE], ids=lambda lv: lv.name)
def test_kernel_check_native(level, tmp_path):
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / f"kernel_check_{level.name}"
    runs = level in SUPPORTED
    res = build_driver(built_here(level), cc, exe, opt="-O3" if runs else "-O0")
    assert res.returncode == 0, f"building kernel_check for {level.name} failed:\n{res.stderr[-4000:]}"
    if not runs:
        return  # it builds; this CPU cannot run it (an AVX-512 level on an AVX2 machine)
    check_output(_run([str(exe)], env=_env(), timeout=300), f"{level.name} (native)")


@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.arch == HERE], ids=lambda lv: lv.name)
def test_vec_h_warning_free(level, tmp_path):
    """vec.h, with every primitive instantiated, compiles without a -Wall warning."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    res = _vec_h_compile(cc, level, tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]


def _vec_h_compile(cc: str, level: IsaLevel, tmp: Path) -> subprocess.CompletedProcess:
    src = tmp / "use_vec.c"
    src.write_text('#include "vec.h"\n'
                   "float use(const float* p, float* q, const uint16_t* h) {\n"
                   "    vf x = vf_load(p), y = vf_load_n(p + VL, 3);\n"
                   "    vf_store_n(q, vf_fma(x, y, vf_set1(1.f)), 2);\n"
                   "    vf_store(q + VL, vf_round(vf_min(vf_max(x, y), vf_zero())));\n"
                   "    return vf_reduce_add(vf_exp(x)) + vf_reduce_max(vf_silu(y)) + vf_reduce_add(vf_load_bf16(h));\n"
                   "}\n")
    return _run([cc, *executable_flags(level), "-Wall", "-Werror", f"-I{CSRC}", "-c", str(src),
                 "-o", str(tmp / "use_vec.o")])


# ---- emulated: the AVX-512 levels through SIMDe on any AVX2 CPU ----

AVX512_LEVELS = [lv for lv in LEVELS if lv.arch == "x86_64" and lv.lanes == 16 and not lv.has_amx]  # no AMX emulation


def avx512_emulation_cc() -> str:
    """The C compiler for an emulated AVX-512 build, or a skip saying what is missing."""
    if HERE != "x86_64" or get_level("avx2", "x86_64") not in SUPPORTED:
        pytest.skip("AVX-512 emulation runs on an x86-64 CPU with AVX2")
    if not simde_available():
        pytest.skip("no SIMDe headers (Debian: libsimde-dev; make cross-tools)")
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


@pytest.mark.emulated
@pytest.mark.parametrize("level", AVX512_LEVELS, ids=lambda lv: f"{lv.name}-emulated")
def test_kernel_check_avx512_emulated(level, tmp_path):
    """Every fp32 check at 16 lanes (AVX-512's register tiles and microkernel shapes), also
    on a machine that runs the level natively: it then checks the emulation as well."""
    cc = avx512_emulation_cc()
    exe = tmp_path / f"kernel_check_{level.name}_emulated"
    res = build_driver(emulated_o0(level), cc, exe, opt="-O0")
    assert res.returncode == 0, f"building kernel_check for {level.name} (emulated) failed:\n{res.stderr[-4000:]}"
    check_output(_run([str(exe)], env=_env(), timeout=300), f"{level.name} (emulated)")


# ---- emulated: aarch64 under qemu-user ----

def qemu_aarch64() -> list[str]:
    """The command prefix that runs an aarch64 executable linked against the cross sysroot's
    libc and libgomp, or a skip saying what is missing."""
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip("aarch64 kernels built but not run: no qemu-aarch64 (Debian: qemu-user; make cross-tools)")
    return [qemu, "-L", AARCH64_SYSROOT]


def _cross_cc() -> str:
    if HERE == "aarch64":
        pytest.skip("this machine is aarch64: the native tests run these levels")
    if not shutil.which(CROSS_CC):
        pytest.skip(f"aarch64 kernels not built: no {CROSS_CC} (Debian: gcc-aarch64-linux-gnu, "
                    "libc6-dev-arm64-cross; make cross-tools)")
    return CROSS_CC


AARCH64_LEVELS = [lv for lv in LEVELS if lv.arch == "aarch64"]


@pytest.mark.emulated
@pytest.mark.parametrize("level", AARCH64_LEVELS, ids=lambda lv: f"aarch64-{lv.name}")
def test_kernel_check_aarch64(level, tmp_path):
    cc = _cross_cc()
    exe = tmp_path / f"kernel_check_aarch64_{level.name}"
    res = build_driver(level, cc, exe)
    assert res.returncode == 0, f"cross-building kernel_check for aarch64 {level.name} failed:\n{res.stderr[-4000:]}"
    if level.name == "scalar":
        # NOTE: built, not run: every aarch64 CPU has NEON, so the portable level runs there
        # only when forced; its C is the same as x86-64's scalar level, which runs natively.
        return
    check_output(_run([*qemu_aarch64(), str(exe)], env=_env(), timeout=600), f"aarch64 {level.name} (qemu)")


@pytest.mark.emulated
@pytest.mark.parametrize("level", AARCH64_LEVELS, ids=lambda lv: f"aarch64-{lv.name}")
def test_csrc_compiles_aarch64(level, tmp_path):
    """vec.h without a -Wall warning, and the kernel libraries the driver does not link (the
    bf16 ones, the layer loop) build for aarch64."""
    cc = _cross_cc()
    res = _vec_h_compile(cc, level, tmp_path)
    assert res.returncode == 0, f"vec.h for aarch64 {level.name}:\n{res.stderr[-4000:]}"
    others = [src.stem for src in sorted(CSRC.glob("*.c")) if src.name not in KERNEL_SOURCES]
    kernel_libraries(others, level, cc)
