"""Each ISA level's build of every C kernel holds no instruction from a higher level.

The capped levels (INFLIGHT_CPU_ISA=avx2 and below) run their tests on whatever CPU this is:
an AVX2 build that held an AVX-512 or AMX instruction would pass them here and die of SIGILL
on an AVX2-only CPU. So each level's libraries are disassembled and their instructions
sorted into the instruction families a level adds; none may come from above the level, and
each level's own family must show up (or the patterns would match nothing).
"""
import re
import subprocess
from importlib import resources

import pytest

from inflight.kernels.cpu import build, isa

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


def families(library: str) -> dict[str, int]:
    """How many instructions of each family the library's disassembly holds."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], capture_output=True,
                          text=True, check=True).stdout
    return {fam: len(re.findall(pat, text)) for fam, pat in FAMILIES.items()}


def test_every_level_of_this_architecture_has_rules():
    assert {(lv.arch, lv.name) for lv in LEVELS} <= set(ALLOWED)
    assert len(LIBRARIES) >= 6


@pytest.mark.parametrize("level", LEVELS, ids=lambda lv: lv.name)
def test_a_level_builds_no_instruction_from_above_it(level):
    found: dict[str, int] = {}
    for name in LIBRARIES:
        path = build.library_path(name, level)
        assert path is not None, f"{name} did not build for {level.name}"
        counts = families(path)
        above = {fam: n for fam, n in counts.items() if n and fam not in ALLOWED[(level.arch, level.name)]}
        assert not above, f"{name} built for {level.name} holds instructions of {above}"
        for fam, n in counts.items():
            found[fam] = found.get(fam, 0) + n
    if level.name in OWN:
        assert found[OWN[level.name]] > 0, f"no {OWN[level.name]} instruction in any {level.name} library"
