"""The memory of a pass's dropped buffers, handed to its next buffers instead of fresh memory.

Every buffer's arrays used to be fresh memory: the kernel zeroes each page on
its first touch (a reader thread decoding into it) and, on a machine whose
page cache fills the memory (a cold read of files larger than RAM), reclaims a
page for it first. Measured on the 2-core test machine during a cold epoch at
stride = window: 9-17% of the process's CPU in those faults, on the reader
threads, which are what bounds the epoch there. ``Spares.empty`` allocates an
array like ``np.empty`` whose memory, once no view of it is left (the buffer
is dropped by the consumer and every batch, part and torch view with it), goes
back to the pool, and a later ``empty`` of about its size takes it.

The trade-off: a dropped buffer's memory stays resident until the next buffer
takes it, where fresh memory would have become resident only as the readers
fill it; the peak RSS of a pass can then hold up to one buffer more
(``buffer_partitions`` partitions, docs/memory.md). ``keep`` bounds what waits
in the pool; the pool and what it holds go with the pass.

Reuse is decided by reference counts alone: each array is made by
``np.frombuffer`` of a fresh ``ctypes`` array over its block (the holder), which every numpy
view and torch tensor of the array keeps alive, and the memory is given back
by a ``weakref.finalize`` of that holder. So memory that anything can still
read or write is never handed out again.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from dask_windows.tuning import SPARE_MIN_BYTES as MIN_BYTES

__all__ = ["MIN_BYTES", "Spares"]


class Spares:
    """A pool of dropped arrays' memory, reused by ``empty`` (thread-safe).

    Args:
        keep: Most blocks of memory waiting in the pool (a buffer's features and targets: 2).
        slack: A block serves an array of ``nbytes`` if it holds at most ``slack * nbytes`` (plus
            ``MIN_BYTES``): a much larger block is left for a larger array, not pinned to a small one.
    """

    def __init__(self, keep: int = 2, slack: float = 1.25) -> None:
        self.keep = keep
        self.slack = slack
        self.reused = 0  # arrays whose memory came from the pool (for tests and figures)
        self._free: list[np.ndarray] = []  # (bytes,) uint8 blocks no array uses any more
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Blocks in the pool now."""
        with self._lock:
            return len(self._free)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-ordered array, like ``np.empty(shape, dtype)``, in reused memory if any fits."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        block = self._take(nbytes)
        if block is None:
            block = np.empty(nbytes, np.uint8)
        else:
            self.reused += 1
        # The exporter of the array's buffer, which every numpy view and torch tensor of the array
        # references. Not a view of ``block`` (numpy would reference ``block`` itself) nor a
        # memoryview (numpy's memoryview of it shares its buffer without referencing it).
        holder = (ctypes.c_char * nbytes).from_buffer(block)
        weakref.finalize(holder, _give_back, self._free, self.keep, block).atexit = False
        return np.frombuffer(holder, dtype).reshape(shape)

    def _take(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= self.slack * nbytes + MIN_BYTES]
            if not fits:
                return None
            best = min(fits, key=lambda i: self._free[i].nbytes)
            return self._free.pop(best)  # in place: the finalizers give blocks back to this list


def _give_back(free: list[np.ndarray], keep: int, block: np.ndarray) -> None:
    """``weakref.finalize`` callback: ``block`` is no longer used by any array; pool it (or let it go).

    Takes no lock: it runs wherever the last view is dropped, which may be a garbage collection
    started inside ``_take`` while its thread holds the pool's lock. An append only adds at the end,
    so the indices ``_take`` computed stay valid; two callbacks at once may pool ``keep + 1`` blocks.
    """
    if len(free) < keep:
        free.append(block)
