"""Temporal train/valid splits per series, as filters of the unsplit window grid.

With a series' rows numbered from 0 and ``n`` rows, a window at position ``p`` is in train when
``p + window + horizon <= cut``, in valid when ``p >= cut + embargo``; ``cut`` is ``floor(n * (1 - valid))``
or the first row whose time is ``>= at``. A split moves each run's first window and count
(``WindowGrid.restrict``), so both parts stream, shard and resume like the parent at no memory cost;
only a split by time reads data (the time column, once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.planning.index import PartitionRuns, WindowGrid

__all__ = ["SeriesTable", "cut_positions", "fraction_cuts", "split_grid", "time_cuts"]


@dataclass(frozen=True)
class SeriesTable:
    """Which series each run belongs to and where in the series it lies: ``(S,)`` ``rows_per_series`` (all
    partitions together) and, per partition, ``(R,)`` per run of ``ds.runs`` its ``series`` number and
    ``base`` (row ``r`` of run ``j`` lies at position ``base[j] + r`` of its series), and ``(Q,)`` per
    series run (before NaN cuts) its ``whole_series`` number, ``whole_starts`` row and ``whole_base``."""

    rows_per_series: np.ndarray
    series: tuple[np.ndarray, ...]
    base: tuple[np.ndarray, ...]
    whole_series: tuple[np.ndarray, ...]
    whole_starts: tuple[np.ndarray, ...]
    whole_base: tuple[np.ndarray, ...]

    @classmethod
    def from_runs(
        cls, runs: Sequence[PartitionRuns], one_series: bool = False, num_rows: Sequence[int] | None = None
    ) -> SeriesTable:
        """Number the series of every run in canonical order (``one_series``: no series column); rows a
        run reads past its partition's ``num_rows`` belong to the next partition and are not counted."""
        import pandas as pd

        whole = [r.series_runs for r in runs]
        sizes = [len(w.starts) for w in whole]
        keys = np.concatenate([np.asarray(w.keys) for w in whole])  # (Q,) series key of each series run
        if one_series:
            codes = np.zeros(len(keys), np.int64)
        else:
            codes = pd.factorize(keys, use_na_sentinel=False)[0].astype(np.int64)  # (Q,) series number
        owned = [
            w.lengths if num_rows is None else np.clip(num_rows[i] - w.starts, 0, w.lengths)
            for i, w in enumerate(whole)
        ]
        lengths = np.concatenate(owned).astype(np.int64)  # (Q,) rows each run owns
        num_series = int(codes.max()) + 1
        # Rows of the same series in earlier runs: stable sort by series, cumulative sum inside each.
        order = np.argsort(codes, kind="stable")
        csum = np.cumsum(lengths[order])
        group_start = np.searchsorted(codes[order], codes[order], side="left")
        before_sorted = csum - lengths[order] - np.concatenate([[0], csum])[group_start]
        before = np.empty_like(before_sorted)
        before[order] = before_sorted  # (Q,) series position of each run's first row
        if whole and all(w.origin is not None for w in whole):  # chunks of a converted dataset place themselves
            before = np.concatenate([w.origin for w in whole]).astype(np.int64)
            lengths = np.concatenate([w.lengths if w.owned is None else w.owned for w in whole]).astype(np.int64)
        rows_per_series = np.bincount(codes, weights=lengths, minlength=num_series).astype(np.int64)
        bounds = np.cumsum([0, *sizes])
        series, base, whole_series, whole_starts, whole_base = [], [], [], [], []
        for i, (r, w) in enumerate(zip(runs, whole)):
            s_codes = codes[bounds[i] : bounds[i + 1]]
            s_base = before[bounds[i] : bounds[i + 1]] - w.starts
            owner = np.searchsorted(w.starts, r.starts, side="right") - 1  # (R,) series run of each run
            series.append(s_codes[owner])
            base.append(s_base[owner])
            whole_series.append(s_codes)
            whole_starts.append(w.starts)
            whole_base.append(s_base)
        parts = (series, base, whole_series, whole_starts, whole_base)
        return cls(rows_per_series, *(tuple(p) for p in parts))


def cut_positions(
    table: SeriesTable,
    *,
    valid: float | None,
    at: Any,
    time: Any,
    read_time: Callable[[int], np.ndarray],
    threads: int = 8,
) -> np.ndarray:
    """``(S,)`` cut of each series for ``split(valid=...)`` or ``split(at=..., time=...)``.

    ``read_time``: ``i -> (rows,)`` time column of partition ``i``, called only for a split by time.
    """
    if (valid is None) == (at is None):
        raise ConfigError("split needs exactly one of valid=<fraction> or at=<time> (with time=<column>)")
    if valid is not None:
        if time is not None:
            raise ConfigError(f"time={time!r} is only used with at=<time>; drop it or split by at=")
        return fraction_cuts(table, valid)
    if time is None:
        raise ConfigError(f"at={at!r} needs time=<column>: the column holding each row's time")
    return time_cuts(table, read_time, at, threads)


def fraction_cuts(table: SeriesTable, valid: float) -> np.ndarray:
    """``(S,)`` cut position of each series: ``floor(n * (1 - valid))``."""
    if isinstance(valid, bool) or not isinstance(valid, (int, float, np.floating)) or not 0 < valid < 1:
        raise ConfigError(f"valid={valid!r} must be a fraction strictly between 0 and 1, e.g. valid=0.2")
    return np.floor(table.rows_per_series * (1.0 - float(valid))).astype(np.int64)


def time_cuts(table: SeriesTable, read_time: Callable[[int], np.ndarray], at: Any, threads: int = 8) -> np.ndarray:
    """``(S,)`` cut position of each series: its first row whose time is ``>= at`` (``n`` when none);
    ``read_time``: ``i -> (rows,)`` time column of partition ``i``, the only data read."""
    num_partitions = len(table.whole_starts)

    def first_hits(i: int) -> tuple[np.ndarray, np.ndarray]:
        values = np.asarray(read_time(i))
        hits = np.flatnonzero(_at_or_after(values, at))  # rows with time >= at (NaN/NaT never)
        starts = table.whole_starts[i]
        ends = np.append(starts[1:], len(values))
        k = np.searchsorted(hits, starts)  # (Q,) first hit at or after each series run's start
        found = k < len(hits)
        found[found] &= hits[k[found]] < ends[found]
        positions = table.whole_base[i][found] + hits[k[found]]
        return table.whole_series[i][found], positions

    cuts = table.rows_per_series.copy()
    with ThreadPoolExecutor(max(1, min(threads, num_partitions))) as pool:
        for series, positions in pool.map(first_hits, range(num_partitions)):
            np.minimum.at(cuts, series, positions)
    return cuts


def _at_or_after(values: np.ndarray, at: Any) -> np.ndarray:
    """``values >= at`` with ``at`` converted to the column's kind, or a clear error."""
    try:
        if values.dtype.kind == "M":
            import pandas as pd

            stamp = pd.Timestamp(at)
            if stamp.tzinfo is not None:
                stamp = stamp.tz_convert("UTC").tz_localize(None)
            # compared at ns: casting at to a coarser column unit (date32 is days) would cut it to the day
            return values >= np.datetime64(stamp.to_datetime64(), "ns")
        return values >= at
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"at={at!r} cannot be compared with the time column (dtype {values.dtype}): {exc}; "
            "pass a value of the column's type (a timestamp for datetime columns, a number for numeric ones)"
        ) from exc


def split_grid(
    grid: WindowGrid, table: SeriesTable, cuts: np.ndarray, span: int, embargo: int
) -> tuple[WindowGrid, WindowGrid]:
    """``(train, valid)`` grids: the windows of ``grid`` before each series' ``cuts`` and after cut + embargo."""
    if isinstance(embargo, bool) or not isinstance(embargo, (int, np.integer)) or embargo < 0:
        raise ConfigError(f"embargo={embargo!r} must be an int >= 0 (rows between train's end and valid's start)")
    stride = grid.stride
    train_hi, valid_lo = [], []
    for first, series, base in zip(grid.first, table.series, table.base):
        p0 = base + first  # (R,) series position of each run's first window
        cut = cuts[series]  # (R,) cut of each run's series
        train_hi.append((cut - span - p0) // stride + 1)  # windows k with p0 + k*stride + span <= cut
        valid_lo.append(-((p0 - cut - int(embargo)) // stride))  # ceil((cut + embargo - p0) / stride)
    no_limit = [np.full(len(c), np.iinfo(np.int64).max // 2, np.int64) for c in grid.counts]
    zero = [np.zeros(len(c), np.int64) for c in grid.counts]
    return grid.restrict(zero, train_hi), grid.restrict(valid_lo, no_limit)
