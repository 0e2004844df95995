"""The dataset's window grid: per partition, its runs and how many windows each holds.

Built once at open from row counts and the series column (and the features with ``nan="drop"``):
O(runs) numbers per partition. Filters (NaN rows, splits) move a run's first window and shrink its
count; a run that is a piece of a longer series keeps the series' stride grid (``origin``), and
``owned`` stops rows of a chunk's overlap from starting a window twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dask_windows.planning.ragged import Ragged
from dask_windows.planning.windows import split_runs_at, windows_per_run

__all__ = [
    "FileRuns",
    "PartitionRuns",
    "WindowGrid",
    "chain_origins",
    "cut_runs",
    "run_grid",
    "runs_of_files",
    "scan_runs",
]


@dataclass(frozen=True, slots=True)  # one per partition: no per-instance dict
class PartitionRuns:
    """Runs of one partition (partition rows): ``starts``, ``lengths`` and series ``keys``.

    ``whole``: the series runs before NaN rows cut them (``None``: nothing cut). ``origin``: ``(R,)``
    row of each run's first row in its series (``None``: 0). ``owned``: ``(R,)`` rows of each run
    where a window may start (the rest is a chunk's overlap; ``None``: the whole run).
    """

    starts: np.ndarray
    lengths: np.ndarray
    keys: np.ndarray
    whole: PartitionRuns | None = None
    origin: np.ndarray | None = None
    owned: np.ndarray | None = None

    @property
    def series_runs(self) -> PartitionRuns:
        """The runs of one series each, covering every row of the partition."""
        return self if self.whole is None else self.whole


class FileRuns(Sequence[PartitionRuns]):
    """The runs of partitions that are whole files (no halo, none continues another, nothing cut), as
    three ``Ragged`` of one offsets (``starts``, ``lengths``, ``keys``); item ``p`` is built when asked for."""

    __slots__ = ("keys", "lengths", "starts")

    def __init__(self, starts: np.ndarray, lengths: np.ndarray, keys: np.ndarray, offsets: np.ndarray) -> None:
        self.starts = Ragged(np.asarray(starts, np.int64), offsets)
        self.lengths = self.starts.with_values(np.asarray(lengths, np.int64))
        self.keys = self.starts.with_values(np.asarray(keys))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, p: Any) -> Any:
        if isinstance(p, slice):  # a list: nothing here slices, a Sequence must allow it
            return [self[i] for i in range(*p.indices(len(self)))]
        return PartitionRuns(self.starts[p], self.lengths[p], self.keys[p])

    def __iter__(self) -> Iterator[PartitionRuns]:
        return map(PartitionRuns, self.starts, self.lengths, self.keys)


@dataclass(frozen=True)
class WindowGrid:
    """The windows of every partition: per partition, ``(R,)`` row of each run's first window (``first``)
    and its windows (``counts``), ``stride`` rows apart."""

    first: Ragged
    counts: Ragged
    stride: int

    @classmethod
    def from_runs(cls, runs: Sequence[PartitionRuns], span: int, stride: int) -> WindowGrid:
        """The grid of ``runs``, honouring each run's ``origin`` and ``owned`` rows."""
        if isinstance(runs, FileRuns):  # columnar already: the grid's first rows are the runs' starts
            return cls(runs.starts, runs.starts.with_values(windows_per_run(runs.lengths.values, span, stride)), stride)
        if runs and all(r.origin is None and r.owned is None for r in runs):  # one numpy pass over every run
            first = Ragged.of([r.starts for r in runs])
            lengths = np.concatenate([r.lengths for r in runs])  # (runs of all,)
            return cls(first, first.with_values(windows_per_run(lengths, span, stride)), stride)
        grids = [run_grid(r.starts, r.lengths, span, stride, r.origin, r.owned) for r in runs]
        return cls(Ragged.of([f for f, _ in grids]), Ragged.of([c for _, c in grids]), stride)

    @property
    def windows_per_partition(self) -> np.ndarray:
        """``(P,)`` windows of each partition."""
        return self.counts.sums()

    def restrict(self, keep_lo: Sequence[np.ndarray], keep_hi: Sequence[np.ndarray]) -> WindowGrid:
        """Keep windows ``[keep_lo, keep_hi)`` of each run's grid (clipped to the run); ``keep_lo`` and
        ``keep_hi``: per partition, ``(R,)`` window numbers of each run."""
        counts = self.counts.values  # (runs of all,)
        lo = np.clip(Ragged.of(keep_lo).values, 0, counts)
        hi = np.clip(Ragged.of(keep_hi).values, lo, counts)
        first = self.first.with_values(self.first.values + lo * self.stride)
        return replace(self, first=first, counts=self.counts.with_values(hi - lo))


def run_grid(
    starts: np.ndarray,
    lengths: np.ndarray,
    span: int,
    stride: int,
    origin: np.ndarray | None = None,
    owned: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(first, counts)``: each run's first window row and window count.

    A window starts at rows ``r`` of the run with ``(origin + r - start) % stride == 0`` and
    ``r - start < owned``, and ends inside the run (``r + span <= start + length``).
    """
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    origin = np.zeros_like(starts) if origin is None else np.asarray(origin, np.int64)
    owned = lengths if owned is None else np.minimum(np.asarray(owned, np.int64), lengths)
    offset = (-origin) % stride  # (R,) rows from each run's start to its first grid row
    last = np.minimum(owned - 1, lengths - span)  # (R,) last row (run-relative) a window may start at
    counts = np.where(last >= offset, (last - offset) // stride + 1, 0).astype(np.int64)
    return starts + offset, counts


def cut_runs(runs: PartitionRuns, bad: np.ndarray) -> PartitionRuns:
    """Cut ``runs`` at the sorted ``bad`` rows; the pieces keep their run's stride grid and owned rows."""
    pieces, piece_lengths = split_runs_at(runs.starts, runs.lengths, bad)
    owner = np.searchsorted(runs.starts, pieces, side="right") - 1  # (K,) run each piece lies in
    base = runs.starts[owner]
    origin = (0 if runs.origin is None else runs.origin[owner]) + (pieces - base)
    owned_rows = runs.lengths if runs.owned is None else runs.owned
    owned = np.clip(base + owned_rows[owner] - pieces, 0, piece_lengths)
    return PartitionRuns(pieces, piece_lengths, runs.keys[owner], whole=runs, origin=origin, owned=owned)


def scan_runs(
    num_partitions: int,
    read_runs: Callable[[int], tuple[np.ndarray, ...]],
    read_bad_rows: Callable[[int], np.ndarray] | None = None,
    threads: int = 8,
    continues: Callable[[int], bool] | None = None,
    num_rows: Sequence[int] | None = None,
) -> list[PartitionRuns]:
    """Runs of every partition, read in parallel threads: ``read_runs(i) -> (starts, lengths, keys[, origin,
    owned])``, ``read_bad_rows(i)``: sorted rows no window may contain (``nan="drop"``) or ``None``;
    ``continues(i)``: whether partition ``i`` follows ``i - 1`` in one file (its first run keeps its series'
    grid: ``chain_origins``); ``num_rows``: per partition, its own rows (without the halo)."""

    def scan(i: int) -> tuple[PartitionRuns, np.ndarray | None]:
        found = read_runs(i)
        starts, lengths, keys = found[:3]
        origin, owned = (found[3], found[4]) if len(found) > 3 else (None, None)
        runs = PartitionRuns(
            np.asarray(starts, np.int64),
            np.asarray(lengths, np.int64),
            np.asarray(keys),
            origin=None if origin is None else np.asarray(origin, np.int64),
            owned=None if owned is None else np.asarray(owned, np.int64),
        )
        return runs, (None if read_bad_rows is None else np.asarray(read_bad_rows(i), np.int64))

    if num_partitions <= 1 or threads <= 1:
        found = [scan(i) for i in range(num_partitions)]
    else:
        # contiguous blocks of partitions per task: a task per small file costs more than its read
        blocks = np.array_split(np.arange(num_partitions), min(num_partitions, threads * 4))
        with ThreadPoolExecutor(min(threads, num_partitions)) as pool:
            found = [item for block in pool.map(lambda b: [scan(int(i)) for i in b], blocks) for item in block]
    runs = [r for r, _ in found]
    if continues is not None:
        own = [int(r.starts[-1] + r.lengths[-1]) if num_rows is None else int(num_rows[i]) for i, r in enumerate(runs)]
        runs = chain_origins(runs, [i > 0 and continues(i) for i in range(num_partitions)], own)
    return [r if bad is None or not len(bad) else cut_runs(r, bad) for r, (_, bad) in zip(runs, found)]


def runs_of_files(starts: np.ndarray, lengths: np.ndarray, keys: np.ndarray, offsets: np.ndarray) -> FileRuns:
    """``scan_runs`` of partitions that are whole files, from their runs told at once, flat."""
    return FileRuns(starts, lengths, keys, offsets)


def _same_key(a: Any, b: Any) -> bool:
    """Whether two series keys are equal (NaN keys equal, as one run of ``find_runs``)."""
    a, b = (v.item() if isinstance(v, np.generic) else v for v in (a, b))
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def chain_origins(
    runs: Sequence[PartitionRuns], continues: Sequence[bool], num_rows: Sequence[int]
) -> list[PartitionRuns]:
    """``runs`` (per partition, before any NaN cut) with ``origin`` set on each first run continuing its
    series from the previous partition (``continues``), so its windows keep the series' stride grid."""
    out = list(runs)
    for i in range(1, len(out)):
        prev, cur, n = out[i - 1], out[i], int(num_rows[i - 1])
        if not continues[i] or cur.origin is not None or n == 0 or not len(cur.lengths) or cur.starts[0] != 0:
            continue
        j = int(np.searchsorted(prev.starts, n - 1, side="right")) - 1  # the run holding the last own row
        if not _same_key(prev.keys[j], cur.keys[0]):
            continue
        origin = np.zeros(len(cur.lengths), np.int64)
        origin[0] = n - int(prev.starts[j]) + (0 if prev.origin is None else int(prev.origin[j]))
        out[i] = replace(cur, origin=origin)
    return out
