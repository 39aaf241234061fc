"""A short run of the soak and chaos benchmark (benchmarks/soak.py) against a real
`inflight serve` subprocess on the embedded SmolLM2-135M."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

pytestmark = pytest.mark.slow

SOAK = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_short_soak_leaks_nothing_and_answers_everyone(tmp_path):
    soak = _soak_module()
    cfg = soak.SoakConfig(num_requests=60, max_tokens=2, max_prompt_words=16, max_num_seqs=8, burst_s=1.0,
                          pause_factor=0.0, kv_cache_memory=32 * 2**20, log_path=str(tmp_path / "server.log"))
    report = soak.run_soak(cfg)
    print(report)  # the figures, for `pytest -s`
    # RSS is reported, not judged: after 6 requests the server is still warming up.
    assert [f for f in report.failures if not f.startswith("RSS")] == [], report
    assert report.leaked_kv_blocks == 0 and report.num_kv_blocks > 0
    assert report.completed > 0 and report.dropped > 0 and report.jobs["bad"] > 0
    assert report.exit_code == 0 and report.health_failures == 0
