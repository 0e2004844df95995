"""An epoch's partition order and its division, as pure arithmetic, shared by every order: the partitions
in a per-epoch permutation (``epoch_order``), their windows end to end, divided by ``division``; two ranks
share at most the partition where their slices meet, each reading its own *segment* (``segment_arrays``).
The pool order (``planning.pool``) cuts a reader's segments into units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_windows.planning.division import batches_per_rank, reader_span, windows_per_rank, worker_batch_range

__all__ = [
    "Segment",
    "batches_per_rank",
    "epoch_order",
    "reader_span",
    "rng_for",
    "segment_arrays",
    "windows_per_rank",
    "worker_batch_range",
]


@dataclass(frozen=True)
class Segment:
    """Windows ``[lo, hi)`` (numbered inside their partition) of one partition."""

    partition: int
    lo: int
    hi: int

    @property
    def num_windows(self) -> int:
        return self.hi - self.lo


def rng_for(*entropy: int) -> np.random.Generator:
    """A generator derived only from non-negative integers (seed, epoch, rank, ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(e) for e in entropy])))


def epoch_order(num_partitions: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The partition order of an epoch: a permutation when shuffling, else ``0..P-1``."""
    if not shuffle:
        return np.arange(num_partitions, dtype=np.int64)
    return rng_for(seed, epoch, 0x9A87).permutation(num_partitions).astype(np.int64)


def segment_arrays(
    partition: np.ndarray, first: np.ndarray, counts: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments covering epoch positions ``[lo, hi)`` of pieces (``(N,)`` ``partition``, ``first`` window,
    ``counts``) laid end to end, as three ``(K,)`` arrays: each segment's partition and windows ``[lo, hi)``."""
    ends = np.cumsum(counts)  # (N,) epoch position just past each ordered piece
    starts = ends - counts
    k0 = int(np.searchsorted(ends, lo, side="right"))
    k1 = int(np.searchsorted(starts, hi, side="left"))
    a = np.maximum(starts[k0:k1], lo)  # (K,) epoch positions each piece covers, clipped to [lo, hi)
    b = np.minimum(ends[k0:k1], hi)
    base = first[k0:k1] - starts[k0:k1]  # (K,) window in its partition minus epoch position
    keep = b > a
    return partition[k0:k1][keep], (a + base)[keep], (b + base)[keep]
