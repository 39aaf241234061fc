"""ISA level selection: INFLIGHT_CPU_ISA's emulated AVX-512 levels and their build flags."""
import subprocess
import threading
import time

import pytest

from inflight.kernels.cpu import build, isa


def test_an_emulated_level_builds_with_avx2_flags_and_its_own_macro():
    level = isa.emulated(isa.get_level("avx512_bf16", "x86_64"))
    flags = build.compile_flags(level)
    assert level.emulated and level.has_bf16_dot and level.lanes == 16
    assert "-DINFLIGHT_ISA_AVX512_BF16=1" in flags and "-mavx2" in flags
    assert not any(f.startswith("-mavx512") for f in flags)
    assert flags[flags.index("-include") + 1] == isa.EMULATION_HEADER
    assert "-O1" in flags and "-O3" not in flags


def test_only_avx512_levels_are_emulated():
    with pytest.raises(ValueError, match="only the AVX-512 levels"):
        isa.emulated(isa.get_level("avx2", "x86_64"))


def test_forcing_an_emulated_level():
    available = {lv.name: lv for lv in isa.emulated_levels()}
    if "avx512_bf16" in available:  # an AVX2 CPU without AVX-512-BF16, with SIMDe
        assert isa._detect("avx512_bf16-emulated") == available["avx512_bf16"]
    else:
        with pytest.raises(ValueError, match="libsimde-dev"):
            isa._detect("avx512_bf16-emulated")
    with pytest.raises(ValueError, match="libsimde-dev"):
        isa._detect("neon-emulated")


def test_amx_is_the_top_level_only_with_its_flags_and_never_emulated():
    avx512_bf16 = isa.get_level("avx512_bf16", "x86_64")
    amx = isa.get_level("amx_bf16", "x86_64")
    flags = frozenset(avx512_bf16.cpu_flags)
    assert isa.supported_levels("x86_64", flags)[-1] == avx512_bf16
    assert isa.supported_levels("x86_64", flags | {"amx_tile", "amx_bf16"})[-1] == amx
    assert amx.has_bf16_dot and amx.has_amx and not avx512_bf16.has_amx
    # every kernel but the GEMM takes the avx512_bf16 paths: both macros are defined
    assert {"-DINFLIGHT_ISA_AMX_BF16=1", "-DINFLIGHT_ISA_AVX512_BF16=1"} <= set(build.compile_flags(amx))
    with pytest.raises(ValueError, match="only the AVX-512 levels"):
        isa.emulated(amx)
    assert all(not lv.has_amx for lv in isa.emulated_levels())


def test_processes_building_the_same_library_at_once_compile_it_once(tmp_path, monkeypatch):
    """Test workers or data-parallel replicas starting together wait for one build of a
    library (a lock beside it) instead of each compiling it."""
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path))
    calls = []

    def slow_compile(name, level, out, cc):
        calls.append(name)
        time.sleep(0.5)
        open(out, "wb").close()
        return subprocess.CompletedProcess([cc], 0, "", "")

    monkeypatch.setattr(build, "compile_library", slow_compile)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(build.library_path("fused_ops", isa.current_level())))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["fused_ops"] and len(set(paths)) == 1 and paths[0].startswith(str(tmp_path))
