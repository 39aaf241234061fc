"""Large CPU tensors on transparent huge pages (Linux).

Decode attention reads each sequence's K/V rows from blocks scattered over a pool
of hundreds of MiB, a few hundred bytes per 4 KiB page: nearly every page it
touches misses the TLB, and the page walks, not DRAM, bound the kernel. With 2 MiB
pages the pool needs a few hundred TLB entries instead of a few hundred thousand.
Most distributions set transparent huge pages to ``madvise``: a mapping gets them
only when asked, before its pages are first touched.

The pool is not written at start-up: on a VM a fresh 2 GiB of huge pages can take
seconds to fault in. ``prefault_when_idle`` brings it in on a thread at idle priority
instead, so that a server idle after start-up does not pay for the faults inside its
first steps' KV writes, and a busy one pays no more than before.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import platform
import threading
import weakref
from collections.abc import Sequence
from typing import Optional

import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: faults pages in as writable without changing a byte of them
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = _THP_SETTING) -> Optional[str]:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), None if unknown."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return None


def _libc() -> Optional[ctypes.CDLL]:
    """The C library with ``madvise`` typed, None where it cannot be loaded."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def prefault_when_idle(tensors: Sequence[torch.Tensor]) -> Optional[threading.Thread]:
    """Fault in the pages of ``tensors`` on one daemon thread at idle priority, a huge page a
    call; None where the kernel cannot (not Linux, before 5.14). It holds them only weakly: a
    pool freed meanwhile (an engine shut down) is skipped, not kept alive.

    NOTE: MADV_POPULATE_WRITE leaves the contents alone, so KV written meanwhile is safe
    (a zero written to each page would race with it). Idle priority: it runs on cores the
    engine leaves free, not against its steps; a huge page a call, so it never holds the
    process's mmap lock for long."""
    refs = [weakref.ref(t) for t in tensors if t.numel()]
    if platform.system() != "Linux" or not refs or (libc := _libc()) is None:
        return None

    def run() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        except (AttributeError, OSError):
            pass
        for ref in refs:
            t = ref()
            if t is None:
                continue
            start = t.data_ptr() - t.data_ptr() % mmap.PAGESIZE
            end = t.data_ptr() + t.numel() * t.element_size()
            del t
            for at in range(start, end, HUGE_PAGE):
                # NOTE: the pool may be freed between pieces: madvise then fails on the unmapped
                # range (or populates whatever was mapped there since, leaving it unchanged)
                if ref() is None or libc.madvise(at, min(HUGE_PAGE, end - at), _MADV_POPULATE_WRITE) != 0:
                    break

    thread = threading.Thread(target=run, name="inflight-kv-prefault", daemon=True)
    thread.start()
    return thread


def zeros_huge(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros(shape, dtype)`` on the CPU, backed by huge pages where the kernel allows.

    The tensor is a 2 MiB-aligned view into a fresh anonymous mapping, advised before its
    first touch. NOTE: such a mapping reads as zeros (the kernel hands out zeroed pages), so
    nothing is written here: pages fault in as the pool fills, not all at start-up. Where
    huge pages are not possible (not Linux, THP ``never``, a small tensor) it is a plain
    ``torch.zeros``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
    if (nbytes < HUGE_PAGE or platform.system() != "Linux" or thp_mode() not in ("always", "madvise")
            or mmap.PAGESIZE > HUGE_PAGE):
        return torch.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = torch.frombuffer(mapping, dtype=torch.uint8)  # the tensor keeps the mapping alive
    offset = -buf.data_ptr() % HUGE_PAGE
    libc = _libc()
    if libc is None or libc.madvise(buf.data_ptr() + offset, nbytes - nbytes % HUGE_PAGE, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) refused; %d bytes on normal pages", nbytes)
    return buf[offset:offset + nbytes].view(dtype).view(shape)
