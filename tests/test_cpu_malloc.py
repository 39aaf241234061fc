"""The CPU engine keeps large freed buffers for reuse instead of unmapping them."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_PROBE = """
import resource, sys, torch
from inflight.worker.cpu_malloc import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def faults_of_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(20 << 20, dtype=torch.uint8)  # 20 MiB, like a step's logits copy
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_step()
print(faults_of_step())
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_second_step_reuses_freed_buffer_without_page_faults():
    # 20 MiB is 5,120 pages: the default allocator faults them all in again each time
    assert _faults("default") > 4000
    assert _faults("tuned") < 500
