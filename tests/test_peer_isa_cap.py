"""compare.py --cap-isa avx2: on any x86-64 CPU with AVX2, both servers and the peak run as on
an AVX2+FMA CPU (the AVX2 comparison where no AVX2-only host is at hand)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch.cpu

from inflight.kernels.cpu.isa import current_level, supported_levels
from tests.test_peer_compare import load_compare

PEERS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "peers"

X86_AVX2_OR_MORE = ("avx2", "avx512", "avx512_bf16", "amx_bf16")
pytestmark = pytest.mark.skipif(current_level() is None or current_level().name not in X86_AVX2_OR_MORE,
                                reason="the cap is for x86-64 CPUs with AVX2 or more")


def isa_caps() -> dict:
    return load_compare().ISA_CAPS["avx2"]


def run_python(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_capped_environment_runs_inflight_and_torch_at_avx2_in_float32():
    got = run_python(
        "import json, torch\n"
        "from inflight.kernels.cpu.isa import current_level\n"
        "from inflight.platforms import current_platform\n"
        "print(json.dumps({'level': current_level().name, 'aten': torch.backends.cpu.get_cpu_capability(),\n"
        "                  'auto': str(current_platform('cpu').resolve_dtype('auto'))}))", isa_caps())
    assert got == {"level": "avx2", "aten": "AVX2", "auto": "torch.float32"}


def test_vllms_sitecustomize_answers_torchs_avx512_probes_as_an_avx2_cpu():
    # vLLM picks vllm._C_AVX2 when torch.cpu._is_avx512_supported() is False
    probes = ["_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported", "_is_amx_tile_supported"]
    got = run_python("import json, torch.cpu\n"
                     f"print(json.dumps({{p: getattr(torch.cpu, p)() for p in {probes!r}}}))",
                     {"PYTHONPATH": str(PEERS / "cap_avx2")})
    assert got == {p: False for p in probes}


def test_avx512_cap_runs_inflight_and_torch_at_avx512_in_float32_where_the_cpu_has_it():
    code = ("import json, torch\n"
            "from inflight.kernels.cpu.isa import current_level\n"
            "from inflight.platforms import current_platform\n"
            "try:\n"
            "    level = current_level().name\n"
            "except ValueError as e:\n"
            "    level = 'refused: ' + str(e)\n"
            "print(json.dumps({'level': level, 'aten': torch.backends.cpu.get_cpu_capability(),\n"
            "                  'auto': str(current_platform('cpu').resolve_dtype('auto')) if 'refused' not in level\n"
            "                          else None}))")
    got = run_python(code, load_compare().ISA_CAPS["avx512"])
    if "avx512" not in {lv.name for lv in supported_levels()}:  # the cap is refused by name, not run lower
        assert got["level"].startswith("refused: INFLIGHT_CPU_ISA='avx512'"), got
    else:
        assert got == {"level": "avx512", "aten": "AVX512", "auto": "torch.float32"}


def test_vllms_avx512_sitecustomize_keeps_avx512_and_denies_bf16_vnni_and_amx():
    # vLLM picks vllm._C_AVX512 when torch finds AVX-512 but not its bf16 extension
    probes = ["_is_avx512_bf16_supported", "_is_vnni_supported", "_is_amx_tile_supported"]
    got = run_python("import json, torch.cpu\n"
                     f"print(json.dumps({{p: getattr(torch.cpu, p)() for p in {probes!r}}}))",
                     {"PYTHONPATH": str(PEERS / "cap_avx512")})
    assert got == {p: False for p in probes}
    real = run_python("import json, torch.cpu\nprint(json.dumps(torch.cpu._is_avx512_supported()))",
                      {"PYTHONPATH": str(PEERS / "cap_avx512")})
    assert real == torch.cpu._is_avx512_supported()  # the hardware's answer, left alone
