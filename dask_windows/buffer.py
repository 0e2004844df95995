"""Decoded pieces of partitions in memory and the shuffled windows being drawn from them.

A plan segment (windows ``[lo, hi)`` of a partition) is read as one *piece*:
the rows from its first window's start to its last window's end
(``piece_rows``), so a piece carries the halo its last windows need and
nothing else. ``decode`` turns a piece's columns into the arrays the gather
wants (features channel-major for ``NCL``); it runs on the prefetch thread so
the conversion overlaps the training step. ``Buffer`` concatenates the
pieces of one plan group (many partitions' worth of places, about
``buffer_partitions`` partitions' worth of rows), lists the start rows of the group's windows
(O(windows in the buffer)) and permutes them (``permute_windows``: a head of
``HEAD`` positions drawn first, so the first batches need not wait for the
whole shuffle). ``stream`` (in ``pipeline``) walks a reader's plan, buffer by
buffer, and cuts the permuted windows into batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.batch import Gatherer
from dask_windows.checks import bad_value_rows, value_problem
from dask_windows.errors import DataError
from dask_windows.faults import replacement_picks
from dask_windows.index import WindowGrid
from dask_windows.normalize import standardize
from dask_windows.plan import EpochPlan, Segment
from dask_windows.spec import WindowSpec
from dask_windows.windows import window_starts

__all__ = [
    "HEAD",
    "Buffer",
    "Part",
    "decode",
    "permute_head",
    "permute_tail",
    "permute_windows",
    "piece_rows",
    "piece_units",
    "stream",
    "unit_rows",
]

_CHUNK = 1 << 18  # windows whose starts are computed at once
HEAD = 4096  # leading positions of a buffer's permutation drawn before the rest (see permute_head)


@dataclass
class Part:
    """One decoded partition.

    Attributes:
        index: Partition number.
        name: Partition name, for messages.
        x: Features ``(C, rows)`` (``NCL``) or ``(rows, C)`` (``NLC``), float32.
        y: Targets ``(T, rows)`` or ``None``.
        nan_x: Rows where a feature is NaN (only computed with ``nan="raise"``).
        nan_y: Rows where a target is NaN.
        row0: Partition row of the part's first row (a piece starts inside its partition).
    """

    index: int
    name: str
    x: np.ndarray
    y: np.ndarray | None
    nan_x: np.ndarray
    nan_y: np.ndarray
    row0: int = 0


def piece_rows(grid: WindowGrid, segment: Segment, span: int) -> tuple[int, int]:
    """Partition rows ``[r0, r1)`` that windows ``segment.lo .. hi-1`` of its partition need."""
    if segment.hi <= segment.lo:
        return 0, 0
    first, counts = grid.first[segment.partition], grid.counts[segment.partition]
    r0 = int(window_starts(first, counts, grid.stride, segment.lo, segment.lo + 1)[0])
    r1 = int(window_starts(first, counts, grid.stride, segment.hi - 1, segment.hi)[0]) + span
    return r0, r1


def piece_units(plan: EpochPlan) -> list[tuple[Segment, ...]]:
    """The plan's segments in reading order, consecutive segments of one partition in a buffer grouped.

    A unit is read with one call (``read_ranges``): one request of its row groups on an object store.
    """
    units: list[tuple[Segment, ...]] = []
    for group in plan.buffers:
        run: list[Segment] = []
        for seg in group:
            if run and seg.partition != run[0].partition:
                units.append(tuple(run))
                run = []
            run.append(seg)
        if run:
            units.append(tuple(run))
    return units


def unit_rows(grid: WindowGrid, unit: tuple[Segment, ...], span: int) -> np.ndarray:
    """``(n, 2)`` partition rows ``[r0, r1)`` that each segment of ``unit`` (one partition) needs."""
    p = unit[0].partition
    counts = np.asarray(grid.counts[p], np.int64)
    ends = np.cumsum(counts)  # (R,) window number just past each run
    k = np.array([s.lo for s in unit] + [s.hi - 1 for s in unit], np.int64)  # (2n,) first and last windows
    run = np.searchsorted(ends, k, side="right")
    rows = np.asarray(grid.first[p], np.int64)[run] + (k - (ends[run] - counts[run])) * grid.stride
    n = len(unit)
    return np.stack([rows[:n], rows[n:] + span], axis=1)


def _target_dtype(columns: list[np.ndarray]) -> type:
    return np.int64 if all(c.dtype.kind in "iub" for c in columns) else np.float32


def decode(
    index: int,
    name: str,
    columns: dict,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None = None,
    row0: int = 0,
    y_dtype: type | None = None,
    out: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> Part:
    """Stack a piece's columns (partition rows from ``row0``) into the buffer layout (one copy per
    column), standardised with ``scale = (mean, std)`` per feature when given.

    ``y_dtype`` is the dataset's one target dtype (``checks.output_dtype``, from the schema at
    open); ``None`` decides it from this piece's columns. ``out``: ``(x, y)`` arrays to write into
    (the piece's place in its buffer, see ``pipeline``), used when their shape and dtype fit.
    """
    feats = [columns[c] for c in spec.features]
    rows = len(feats[0])
    channel_major = spec.layout == "NCL"
    shape = (len(feats), rows) if channel_major else (rows, len(feats))
    fits = out is not None and out[0].shape == shape and out[0].dtype == np.float32
    x = out[0] if fits and out is not None else np.empty(shape, np.float32)
    for c, values in enumerate(feats):
        if channel_major:
            x[c] = values
        else:
            x[:, c] = values
    if scale is not None:
        standardize(x, *scale, channel_major)
    y: np.ndarray | None = None
    if spec.targets:
        targ = [columns[c] for c in spec.targets]
        dtype = y_dtype or _target_dtype(targ)
        into = out[1] if out is not None else None
        fit = into is not None and into.shape == (len(targ), rows) and into.dtype == dtype
        y = into if fit and into is not None else np.empty((len(targ), rows), dtype)
        for t, values in enumerate(targ):
            with np.errstate(invalid="ignore"):  # NaN rows of an int target: in no window (nan= policy)
                y[t] = values
    check = spec.nan == "raise"
    nan_x = bad_value_rows({c: columns[c] for c in spec.features}) if check else np.zeros(0, np.int64)
    nan_y = bad_value_rows({c: columns[c] for c in spec.targets}) if check else np.zeros(0, np.int64)
    return Part(index, name, x, y, nan_x, nan_y, row0)


class Buffer:
    """The partitions of one plan group and their windows.

    Args:
        parts: Decoded pieces, one per segment, in segment order.
        segments: Which windows of each partition this reader yields.
        grid: The dataset's window grid.
        row_offsets: ``(P,)`` global row of each partition's first row.
        spec: Window settings.
        scale: ``(mean, std)`` per feature for global standardisation, or ``None``.
        assembled: ``(x, y, part_offsets)`` when the parts are views of one array already
            (``pipeline`` copies each piece into place as it arrives); ``part_offsets`` is
            ``(parts+1,)``, the buffer row where each part begins and the buffer's end.
    """

    def __init__(
        self,
        parts: list[Part],
        segments: tuple[Segment, ...],
        grid: WindowGrid,
        row_offsets: np.ndarray,
        spec: WindowSpec,
        scale: tuple[np.ndarray, np.ndarray] | None = None,
        assembled: tuple[np.ndarray, np.ndarray | None, np.ndarray] | None = None,
    ) -> None:
        channel_major = spec.layout == "NCL"
        axis = 1 if channel_major else 0
        if assembled is not None:  # the pieces already sit in one array (views of it): no concatenation
            x, y, self.part_offsets = assembled
        else:
            x = parts[0].x if len(parts) == 1 else np.concatenate([p.x for p in parts], axis=axis)
            y = None
            if spec.targets:
                y = parts[0].y if len(parts) == 1 else np.concatenate([p.y for p in parts], axis=1)
            sizes = [p.x.shape[axis] for p in parts]
            self.part_offsets = np.cumsum([0, *sizes])  # (parts+1,) buffer row where each part begins
        self.part_rows = np.array(
            [row_offsets[seg.partition] + part.row0 for part, seg in zip(parts, segments)], dtype=np.int64
        )  # (parts,) dataset row of each part's first row
        # One allocation for the buffer's window starts; int32 halves it when rows allow.
        dtype = np.int32 if self.part_offsets[-1] < 2**31 else np.int64
        self.starts = np.empty(sum(seg.num_windows for seg in segments), dtype)  # (windows,) buffer rows
        at = 0
        for part, seg, offset in zip(parts, segments, self.part_offsets):
            first, counts = grid.first[seg.partition], grid.counts[seg.partition]
            for lo in range(seg.lo, seg.hi, _CHUNK):  # chunks keep int64 temporaries small
                rows = window_starts(first, counts, grid.stride, lo, min(lo + _CHUNK, seg.hi))
                rows -= part.row0
                _check_nan(part, rows, spec)
                rows += offset
                self.starts[at : at + len(rows)] = rows
                at += len(rows)
        self.gatherer = Gatherer(x, y, spec.window, spec.horizon, spec.layout, *(scale or (None, None)))
        self.nbytes = x.nbytes + (0 if y is None else y.nbytes) + self.starts.nbytes

    def permute(self, rng: np.random.Generator | None) -> None:
        """Shuffle the windows in place with ``rng`` (``permute_windows``); ``None`` keeps row order."""
        if rng is not None:
            permute_windows(self.starts, rng)

    def global_rows(self, starts: np.ndarray) -> np.ndarray:
        """Dataset rows of windows at buffer rows ``starts``."""
        part = np.searchsorted(self.part_offsets, starts, side="right") - 1  # (B,) part of each window
        return starts - self.part_offsets[part] + self.part_rows[part]

    def replace(self, lost: int, rng: np.random.Generator, keep: bool = True) -> None:
        """Stand in for ``lost`` windows of unreadable partitions with windows of this buffer.

        Args:
            lost: Windows to add, drawn by ``faults.replacement_picks``.
            rng: Generator derived from the buffer's seed.
            keep: Keep this buffer's own windows (``False``: only the replacements remain).
        """
        picks = self.starts[replacement_picks(len(self.starts), lost, rng)]
        self.starts = np.concatenate([self.starts, picks]) if keep else picks


def permute_head(starts: np.ndarray, rng: np.random.Generator) -> int:
    """Fix the first ``min(HEAD, n - 1)`` positions of a uniform permutation of ``starts``, in place.

    Forward Fisher-Yates steps: position ``i`` swaps with a uniform position of ``[i, n)``. With
    ``permute_tail`` after it, the whole is a uniform permutation drawn from ``rng`` alone, and the
    first batches can be gathered before the tail is shuffled.

    Returns:
        The number of positions fixed.
    """
    head = max(0, min(HEAD, len(starts) - 1))
    if head:
        picks = rng.integers(np.arange(head), len(starts)).tolist()  # (head,) j_i uniform in [i, n)
        for i, j in enumerate(picks):
            starts[i], starts[j] = starts[j], starts[i]
    return head


def permute_tail(starts: np.ndarray, rng: np.random.Generator, head: int) -> None:
    """Shuffle ``starts[head:]`` in place (after ``permute_head``, with the same ``rng``)."""
    if len(starts) - head > 1:
        rng.shuffle(starts[head:])


def permute_windows(starts: np.ndarray, rng: np.random.Generator) -> None:
    """The buffer permutation: ``permute_head`` then ``permute_tail``, in place."""
    permute_tail(starts, rng, permute_head(starts, rng))


def _check_nan(part: Part, rows: np.ndarray, spec: WindowSpec) -> None:
    """Raise ``DataError`` if a window at partition rows ``rows`` holds a NaN it would yield."""
    if spec.nan != "raise" or (len(part.nan_x) == 0 and len(part.nan_y) == 0) or len(rows) == 0:
        return
    hits = []
    if len(part.nan_x):
        # First NaN row at or after each start: inside the window when it is before start + L.
        k = np.searchsorted(part.nan_x, rows)
        inside = (k < len(part.nan_x)) & (part.nan_x[np.minimum(k, len(part.nan_x) - 1)] < rows + spec.window)
        if inside.any():
            w = int(np.flatnonzero(inside)[0])
            hits.append(("feature", int(rows[w]), int(part.nan_x[k[w]])))
    if len(part.nan_y):
        lo = rows + (spec.window if spec.horizon else spec.window - 1)
        hi = lo + max(spec.horizon, 1)
        k = np.searchsorted(part.nan_y, lo)
        inside = (k < len(part.nan_y)) & (part.nan_y[np.minimum(k, len(part.nan_y) - 1)] < hi)
        if inside.any():
            w = int(np.flatnonzero(inside)[0])
            hits.append(("target", int(rows[w]), int(part.nan_y[k[w]])))
    if hits:
        role, start, row = hits[0]
        names, values = (spec.features, part.x) if role == "feature" else (spec.targets, part.y)
        assert values is not None  # a target hit means the part has targets
        by_column = values[:, row] if role == "target" or spec.layout == "NCL" else values[row, :]
        found = np.flatnonzero(~np.isfinite(by_column.astype(np.float64)))
        column_at = int(found[0]) if len(found) else 0  # none found: a null of an integer target
        column = names[column_at] if len(found) or len(names) == 1 else list(names)
        problem = value_problem(float(by_column[column_at])) if len(found) else "null (missing value)"
        raise DataError(
            f"{problem} in {role} column {column!r} of {part.name} at row {row + part.row0} of that partition, inside the "
            f"window starting at row {start + part.row0}; clean the data, or pass nan='drop' to leave out windows "
            "that contain NaN or inf"
        )


def stream(*args: Any, **kwargs: Any) -> Iterator[object]:
    """Yield the batches of a plan: ``pipeline.stream`` (the same arguments), kept importable from here."""
    from dask_windows.pipeline import stream as pipeline_stream

    return pipeline_stream(*args, **kwargs)
