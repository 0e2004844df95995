"""The dataset's window grid: per partition, its runs and how many windows each holds.

Built once when a dataset is opened from row counts and the series column
(plus the feature columns only with ``nan="drop"``). It holds O(runs)
numbers per partition: for every run its first window's row and its window
count. Any filter of whole stretches of a run's window grid (NaN rows,
temporal splits) is expressed by moving a run's first window and shrinking
its count, so the rest of the loader never changes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dask_windows.windows import split_runs_at, windows_per_run

__all__ = ["PartitionRuns", "WindowGrid", "scan_runs"]


@dataclass(frozen=True)
class PartitionRuns:
    """Runs of one partition (partition rows): ``starts``, ``lengths`` and series ``keys``.

    ``whole`` holds the series runs before NaN rows cut them into these pieces (``nan="drop"``),
    or ``None`` when nothing was cut; ``series_runs`` is whichever covers every row.
    """

    starts: np.ndarray
    lengths: np.ndarray
    keys: np.ndarray
    whole: PartitionRuns | None = None

    @property
    def series_runs(self) -> PartitionRuns:
        """The runs of one series each, covering every row of the partition."""
        return self if self.whole is None else self.whole


@dataclass(frozen=True)
class WindowGrid:
    """The windows of every partition.

    Attributes:
        first: Per partition, ``(R,)`` row of each run's first window.
        counts: Per partition, ``(R,)`` windows of each run.
        stride: Rows between consecutive windows of a run.
    """

    first: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]
    stride: int

    @classmethod
    def from_runs(cls, runs: Sequence[PartitionRuns], span: int, stride: int) -> WindowGrid:
        first = tuple(r.starts for r in runs)
        counts = tuple(windows_per_run(r.lengths, span, stride) for r in runs)
        return cls(first, counts, stride)

    @property
    def windows_per_partition(self) -> np.ndarray:
        """``(P,)`` windows of each partition."""
        return np.array([int(c.sum()) for c in self.counts], dtype=np.int64)

    def restrict(self, keep_lo: Sequence[np.ndarray], keep_hi: Sequence[np.ndarray]) -> WindowGrid:
        """Keep windows ``[keep_lo, keep_hi)`` of each run's grid (clipped to the run)."""
        first, counts = [], []
        for f, c, lo, hi in zip(self.first, self.counts, keep_lo, keep_hi):
            lo = np.clip(lo, 0, c)
            hi = np.clip(hi, lo, c)
            first.append(f + lo * self.stride)
            counts.append(hi - lo)
        return replace(self, first=tuple(first), counts=tuple(counts))


def scan_runs(
    num_partitions: int,
    read_runs: Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]],
    read_bad_rows: Callable[[int], np.ndarray] | None = None,
    threads: int = 8,
) -> list[PartitionRuns]:
    """Runs of every partition, read in parallel threads.

    Args:
        num_partitions: Partitions to scan.
        read_runs: ``i -> (starts, lengths, keys)`` of partition ``i``.
        read_bad_rows: ``i -> sorted rows`` no window may contain (``nan="drop"``), or ``None``.
        threads: Parallel reads.

    Returns:
        One ``PartitionRuns`` per partition, in partition order.
    """

    def scan(i: int) -> PartitionRuns:
        starts, lengths, keys = read_runs(i)
        runs = PartitionRuns(np.asarray(starts, np.int64), np.asarray(lengths, np.int64), np.asarray(keys))
        if read_bad_rows is not None:
            bad = read_bad_rows(i)
            if len(bad):
                pieces, piece_lengths = split_runs_at(runs.starts, runs.lengths, bad)
                piece_keys = runs.keys[np.searchsorted(runs.starts, pieces, side="right") - 1]
                return PartitionRuns(pieces, piece_lengths, piece_keys, whole=runs)
        return runs

    if num_partitions <= 1 or threads <= 1:
        return [scan(i) for i in range(num_partitions)]
    # Contiguous blocks of partitions per task: with 10,000 small files, one task per file
    # costs more in thread hand-offs than the reads themselves.
    blocks = np.array_split(np.arange(num_partitions), min(num_partitions, threads * 4))
    with ThreadPoolExecutor(min(threads, num_partitions)) as pool:
        return [runs for block in pool.map(lambda b: [scan(int(i)) for i in b], blocks) for runs in block]


def nan_rows(columns: dict[Any, np.ndarray]) -> np.ndarray:
    """Sorted rows where any of ``columns`` is NaN."""
    bad = None
    for values in columns.values():
        if values.dtype.kind in "fc":
            isnan = np.isnan(values)
            bad = isnan if bad is None else bad | isnan
    return np.zeros(0, np.int64) if bad is None else np.flatnonzero(bad).astype(np.int64)
