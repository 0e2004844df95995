"""Give freed memory back to the OS between buffers: ``trim()`` (glibc's ``malloc_trim(0)``, and Arrow's
allocator) returns the freed holes glibc keeps after large blocks; elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["trim"]

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
