"""Give freed memory back to the OS between buffers.

glibc raises its mmap threshold after a large block is freed, so later
partition-sized arrays come from the heap, and the freed holes between them
stay in the process's RSS: peak memory then creeps up with the number of
partitions read, which breaks the promise that it depends on the buffer
settings only. ``trim()`` (``malloc_trim(0)``, a few milliseconds, once per
buffer) returns those pages, and Arrow's allocator is asked to do the same.
Elsewhere than glibc it does nothing.

The first buffer of a pass is mapped in small pages (``small_pages_map``:
faulting huge pages in can stall on compaction, on the way to the first
batch); once its first batches are out, ``huge_pages`` asks the kernel to move
it to huge pages (``MADV_COLLAPSE``, Linux 6.1+, on the builder thread), where
random gathers miss the TLB far less. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from typing import Any

__all__ = ["SmallPages", "huge_pages", "small_pages_map", "trim"]

_MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)  # Linux's value; older kernels answer EINVAL

_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        _libc = None


def trim() -> None:
    """Return freed heap pages (glibc) and Arrow pool pages to the OS."""
    if _libc is not None:
        _libc.malloc_trim(0)
    # Arrow's pool holds memory only where pyarrow was loaded (a Parquet or Arrow source); loading it
    # here only to find an empty pool would cost an array-only process tens of MB.
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


class SmallPages(mmap.mmap):
    """An anonymous private mapping in small pages, which ``huge_pages`` may move to huge pages."""


def small_pages_map(size: int) -> mmap.mmap:
    """``size`` bytes of anonymous memory, private to the process, in small pages until ``huge_pages``."""
    if not hasattr(mmap, "MAP_PRIVATE"):  # Windows: no advice to give
        return SmallPages(-1, size)
    mapped = SmallPages(-1, size, flags=mmap.MAP_PRIVATE)  # MAP_ANONYMOUS: added for fd -1
    try:  # where THP is "always", faults here must not compact memory either
        mapped.madvise(mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError, ValueError):
        pass
    return mapped


def huge_pages(array: Any) -> bool:
    """Move the pages of ``array``'s ``small_pages_map`` mapping to huge pages now, if the kernel can.

    ``MADV_COLLAPSE`` copies each aligned 2 MiB of the mapping into a huge page (about 15 ms for 32
    MiB on the 2-core test machine), values unchanged; a thread touching a range while it is moved
    waits for it. Arrays not viewing such a mapping, kernels without the call and a lack of free
    huge pages leave everything as it was.

    Returns:
        Whether the kernel took the advice.
    """
    base = array
    while base is not None and not isinstance(base, mmap.mmap):  # array views, then np.frombuffer's memoryview
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if not isinstance(base, SmallPages) or base.closed:
        return False
    try:
        base.madvise(mmap.MADV_HUGEPAGE)  # clears MADV_NOHUGEPAGE, which MADV_COLLAPSE respects
        base.madvise(_MADV_COLLAPSE)
    except (AttributeError, OSError, ValueError):
        return False
    return True
