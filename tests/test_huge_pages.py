"""The CPU KV pool on transparent huge pages: zeroed, shaped, backed by 2 MiB pages, and faulted in
off the hot path."""
import mmap
import weakref

import pytest
import torch

from inflight.platforms import current_platform
from inflight.worker.huge_pages import _MADV_POPULATE_WRITE, HUGE_PAGE, _libc, prefault_when_idle, thp_mode, zeros_huge


def _smaps_kib(addr: int, field: str = "AnonHugePages:") -> int:
    """A field (kB) of the mapping that holds ``addr``, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == field:
                return int(line.split()[1])
    return 0


def _can_populate() -> bool:
    """Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14+)."""
    libc = _libc()
    page = torch.frombuffer(mmap.mmap(-1, mmap.PAGESIZE), dtype=torch.uint8)
    return libc is not None and libc.madvise(page.data_ptr(), mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0


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
    assert _smaps_kib(t.data_ptr()) >= HUGE_PAGE >> 10


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off in this kernel")
@pytest.mark.skipif(not _can_populate(), reason="MADV_POPULATE_WRITE needs Linux 5.14+")
def test_prefault_brings_the_pools_in_and_keeps_what_was_written():
    """The pools' pages fault in off the step thread; KV written before and meanwhile survives."""
    nbytes = 32 << 20
    pools = [zeros_huge(nbytes // 4, torch.float32) for _ in range(2)]
    assert all(_smaps_kib(p.data_ptr(), "Rss:") < nbytes >> 11 for p in pools)  # nothing touched yet
    pools[0][:1024].fill_(3.0)  # the first 4 KiB page
    thread = prefault_when_idle(pools)
    assert thread is not None
    pools[1][-1024:].fill_(5.0)  # the last one, meanwhile
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert all(_smaps_kib(p.data_ptr(), "Rss:") >= nbytes >> 10 for p in pools)
    assert float(pools[0].sum()) == 3.0 * 1024 and float(pools[1].sum()) == 5.0 * 1024


def test_prefault_does_not_keep_a_freed_pool_alive():
    pool = zeros_huge((32 << 20) // 4, torch.float32)
    ref = weakref.ref(pool)
    thread = prefault_when_idle([pool])
    del pool
    assert ref() is None
    if thread is not None:
        thread.join(timeout=60)
        assert not thread.is_alive()


def test_cpu_platform_allocates_the_pool_with_it():
    pool = current_platform("cpu").zeros((8 << 20) // 4, torch.float32)
    assert pool.data_ptr() % HUGE_PAGE == 0 or thp_mode() not in ("always", "madvise")
    assert not pool.any()
