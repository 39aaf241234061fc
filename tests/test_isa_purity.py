"""Each ISA level's build of every C kernel holds no instruction from a higher level.

The capped levels (INFLIGHT_CPU_ISA=avx2 and below) run their tests on whatever CPU this is:
an AVX2 build that held an AVX-512 or AMX instruction would pass them here and die of SIGILL
on an AVX2-only CPU. So each level's libraries are disassembled and their instructions
sorted into the instruction families a level adds; none may come from above the level, and
each level's own family must show up (or the patterns would match nothing). The other
architecture's levels are cross-compiled and checked the same way in an ``emulated`` test
(aarch64's portable level, built with +nosimd, is never run: only this test looks at its code).
An x86-64 level this CPU cannot run is checked in the -O0 build its other tests use
(isa_levels.built_here); a CPU that runs it checks the optimised build the engine loads.
"""
import re
import shutil
import subprocess
from importlib import resources

import pytest

from c_build import kernel_libraries
from isa_levels import built_here
from inflight.kernels.cpu import isa

# the families of instructions each level adds, by how objdump's AT&T syntax spells them
FAMILIES = {
    "avx": r"\tv[a-z]",  # every VEX- or EVEX-encoded instruction's mnemonic starts with v
    "avx512": r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b",  # 512-bit, mask or upper registers
    "avx512_bf16": r"\tv(dpbf16ps|cvtne2?ps2bf16)\b",
    "amx": r"\t(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdpbf16ps)\b",
    "neon": r"\bv[0-9]+\.(8b|16b|4h|8h|2s|4s|2d)\b",  # vector registers by their arrangement
}
ALLOWED = {
    ("x86_64", "scalar"): set(),
    ("x86_64", "avx2"): {"avx"},
    ("x86_64", "avx512"): {"avx", "avx512"},
    ("x86_64", "avx512_bf16"): {"avx", "avx512", "avx512_bf16"},
    ("x86_64", "amx_bf16"): {"avx", "avx512", "avx512_bf16", "amx"},
    ("aarch64", "scalar"): set(),
    ("aarch64", "neon"): {"neon"},
}
OWN = {"avx2": "avx", "avx512": "avx512", "avx512_bf16": "avx512_bf16", "amx_bf16": "amx", "neon": "neon"}

ARCH = isa.machine_arch()
LEVELS = [lv for lv in isa.LEVELS if lv.arch == ARCH]
LIBRARIES = sorted(f.name[:-2] for f in resources.files("inflight.kernels.cpu").joinpath("csrc").iterdir()
                   if f.name.endswith(".c"))


def families(library: str, objdump: str = "objdump") -> dict[str, int]:
    """How many instructions of each family the library's disassembly holds."""
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", library], capture_output=True,
                          text=True, check=True).stdout
    return {fam: len(re.findall(pat, text)) for fam, pat in FAMILIES.items()}


def check_level(level: isa.IsaLevel, paths: dict[str, str], objdump: str = "objdump") -> None:
    """No library of ``paths`` (name: built for ``level``) holds an instruction from above the
    level, and the level's own family shows up in at least one of them."""
    found: dict[str, int] = {}
    for name, path in paths.items():
        counts = families(path, objdump)
        above = {fam: n for fam, n in counts.items() if n and fam not in ALLOWED[(level.arch, level.name)]}
        assert not above, f"{name} built for {level.arch} {level.name} holds instructions of {above}"
        for fam, n in counts.items():
            found[fam] = found.get(fam, 0) + n
    if level.name in OWN:
        assert found[OWN[level.name]] > 0, f"no {OWN[level.name]} instruction in any {level.name} library"


def test_every_level_has_rules():
    assert {(lv.arch, lv.name) for lv in isa.LEVELS} <= set(ALLOWED)
    assert len(LIBRARIES) >= 6


@pytest.mark.parametrize("level", LEVELS, ids=lambda lv: lv.name)
def test_a_level_builds_no_instruction_from_above_it(level):
    check_level(level, kernel_libraries(LIBRARIES, built_here(level)))


OTHER = "aarch64" if ARCH == "x86_64" else "x86_64"
CROSS = {"aarch64": "aarch64-linux-gnu-", "x86_64": "x86_64-linux-gnu-"}[OTHER]


@pytest.mark.emulated
@pytest.mark.parametrize("level", [lv for lv in isa.LEVELS if lv.arch == OTHER], ids=lambda lv: f"{OTHER}-{lv.name}")
def test_the_other_architecture_builds_no_instruction_from_above_its_level(level):
    cc, objdump = shutil.which(f"{CROSS}gcc"), shutil.which(f"{CROSS}objdump")
    if cc is None or objdump is None:
        pytest.skip(f"no {CROSS}gcc / {CROSS}objdump (Debian: gcc-{OTHER.replace('_', '-')}-linux-gnu; "
                    "make cross-tools)")
    check_level(level, kernel_libraries(LIBRARIES, level, cc), objdump)
