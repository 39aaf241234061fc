"""The CPU KV pool on transparent huge pages: zeroed, shaped, and actually backed by 2 MiB pages."""
import pytest
import torch

from inflight.platforms import current_platform
from inflight.worker.huge_pages import HUGE_PAGE, thp_mode, zeros_huge


def _anon_huge_kib(addr: int) -> int:
    """AnonHugePages of the mapping that holds ``addr`` (from /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def test_zeros_huge_is_zeroed_and_shaped():
    t = zeros_huge((4000, 16, 3, 64), torch.float32)
    assert t.shape == (4000, 16, 3, 64) and t.dtype == torch.float32 and t.is_contiguous()
    assert not t.any()
    t[-1] = 2.0  # writable, and the storage outlives the mapping object
    assert float(t.sum()) == 2.0 * 3 * 64 * 16
    small = zeros_huge((2, 3), torch.bfloat16)
    assert small.shape == (2, 3) and small.dtype == torch.bfloat16 and not small.any()


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off in this kernel")
def test_zeros_huge_is_backed_by_huge_pages():
    t = zeros_huge((64 << 20) // 4, torch.float32)
    assert t.data_ptr() % HUGE_PAGE == 0
    t.fill_(1.0)  # pages fault in as they are first written
    assert _anon_huge_kib(t.data_ptr()) >= HUGE_PAGE >> 10


def test_cpu_platform_allocates_the_pool_with_it():
    pool = current_platform("cpu").zeros((8 << 20) // 4, torch.float32)
    assert pool.data_ptr() % HUGE_PAGE == 0 or thp_mode() not in ("always", "madvise")
    assert not pool.any()
