"""Decoded rows of a unit, and the pool rows of its windows: ``decode_pieces`` turns disjoint row ranges of
one partition into the gather's arrays, in the pool's rows when they fit (``blocks.decode_blocks``);
``_fill_starts`` lists the pool rows of a unit's windows where it holds a NaN, checking each window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_windows.errors import DataError
from dask_windows.opening.checks import value_problem
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.plan import Segment
from dask_windows.runtime.blocks import decode_blocks, segment_runs, segment_starts
from dask_windows.runtime.normalize import standardize
from dask_windows.settings.spec import WindowSpec

__all__ = ["Part", "decode_pieces"]


_CHUNK = 1 << 18  # windows whose starts are computed at once
_RAMP_WINDOWS = 1024  # windows per run of starts from which each run is written in one call (_ramp_starts)


@dataclass
class Part:
    """One decoded partition (``index``, ``name`` for messages): features ``x`` (``(C, rows)`` for ``NCL``,
    else ``(rows, C)``, float32), targets ``y`` ``(T, rows)`` or ``None``, the rows where a feature or
    target is NaN (``nan_x``, ``nan_y``: with ``nan="raise"`` only), the partition row of its first row
    (``row0``). ``blocks``: ``(m, 2)`` ``[partition row, part row]`` where each of its disjoint row
    ranges begins (``None``: one, ``[[row0, 0]]``). ``arena``: ``(x, y, row)`` when ``x`` and ``y`` are
    views of the pool's arrays from ``row`` on; ``None``: arrays of its own, to be copied in."""

    index: int
    name: str
    x: np.ndarray
    y: np.ndarray | None
    nan_x: np.ndarray
    nan_y: np.ndarray
    row0: int = 0
    blocks: np.ndarray | None = None
    arena: tuple | None = None

    def block_table(self) -> np.ndarray:
        """``(m, 2)`` ``[partition row, part row]`` where each block begins."""
        return np.array([[self.row0, 0]], np.int64) if self.blocks is None else self.blocks


def decode_pieces(
    index: int,
    name: str,
    pieces: list[dict],
    rows0: list[int] | np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None = None,
    y_dtype: type | None = None,
    arena: tuple | None = None,
) -> Part:
    """Decode disjoint row ranges of one partition (``pieces[i]`` from partition row ``rows0[i]``, in
    row order) into one ``Part`` holding them end to end: a few numpy calls per column in all
    (``blocks.decode_blocks``), so many small pieces cost about what one large piece costs.

    ``arena = (x, y, row)``: write into rows ``row ..`` of the pool's arrays when they fit.
    """
    if spec.targets and y_dtype is None:
        integers = all(p[c].dtype.kind in "iub" for p in pieces[:1] for c in spec.targets)
        y_dtype = np.int64 if integers else np.float32
    channel_major = spec.layout == "NCL"
    out = None
    if arena is not None:
        rows = sum(len(p[spec.features[0]]) for p in pieces)
        base_x, base_y, at = arena
        out = (base_x[:, at : at + rows] if channel_major else base_x[at : at + rows], None)
        out = (out[0], None if base_y is None else base_y[:, at : at + rows])
    x, y, nan_x, nan_y, offsets = decode_blocks(
        pieces, spec.features, spec.targets, channel_major, spec.nan == "raise", y_dtype or np.float32, out
    )
    if out is None or x is not out[0]:
        arena = None
    if scale is not None:
        standardize(x, *scale, channel_major)
    rows0 = np.asarray(rows0, np.int64)
    blocks = None if len(pieces) == 1 else np.stack([rows0, offsets[:-1]], axis=1)  # (m, 2)
    return Part(index, name, x, y, nan_x, nan_y, int(rows0[0]), blocks, arena)


def _fill_starts(
    out: np.ndarray,
    at: int,
    part: Part | None,
    segments: tuple[Segment, ...],
    grid: WindowGrid,
    spec: WindowSpec,
    offset: int,
    table: np.ndarray,
) -> int:
    """Write the buffer rows of the windows of ``segments`` (all of ``part``) into ``out[at:]``.

    Windows are taken in chunks of about ``_CHUNK`` (int64 temporaries stay small); a chunk's
    starts come from one ``segment_starts`` pass whatever its number of segments. Returns the
    position after the last window written.
    """
    p = segments[0].partition
    first, counts = grid.first[p], grid.counts[p]
    # Sub-ranges of at most _CHUNK windows, as the windows of each segment were always checked.
    lo, hi = [], []
    for seg in segments:
        for a in range(seg.lo, seg.hi, _CHUNK):
            lo.append(a)
            hi.append(min(a + _CHUNK, seg.hi))
    if not lo:
        return at
    lo_a, hi_a = np.array(lo, np.int64), np.array(hi, np.int64)  # (s,) sub-ranges
    sizes = hi_a - lo_a
    group = (np.cumsum(sizes) - sizes) // _CHUNK  # (s,) chunk each sub-range is computed in
    cuts = np.flatnonzero(np.diff(group)) + 1
    check = part is not None and spec.nan == "raise" and (len(part.nan_x) > 0 or len(part.nan_y) > 0)
    if not check:
        row, take, _ = segment_runs(first, counts, grid.stride, lo_a, hi_a)
        if len(take) * _RAMP_WINDOWS <= int(sizes.sum()):
            return _ramp_starts(out, at, row, take, table, offset, grid.stride)
    for g0, g1 in zip([0, *cuts.tolist()], [*cuts.tolist(), len(lo)]):
        rows = segment_starts(first, counts, grid.stride, lo_a[g0:g1], hi_a[g0:g1])  # partition rows
        ends = np.cumsum(sizes[g0:g1])
        block = np.searchsorted(table[:, 0], rows[ends - sizes[g0:g1]], side="right") - 1  # (s,) of each
        shift = table[block, 0] - table[block, 1]  # (s,) partition row minus part row, per sub-range
        rows -= np.repeat(shift, sizes[g0:g1])  # part rows
        if check:
            assert part is not None  # checked only with a part's bad rows
            for j, (a, b) in enumerate(zip((ends - sizes[g0:g1]).tolist(), ends.tolist())):
                _check_nan(part, rows[a:b], spec, int(shift[j]))
        rows += offset
        out[at : at + len(rows)] = rows
        at += len(rows)
    return at


def _ramp_starts(
    out: np.ndarray, at: int, row: np.ndarray, take: np.ndarray, table: np.ndarray, offset: int, stride: int
) -> int:
    """``_fill_starts`` for long runs of windows (``_RAMP_WINDOWS``): each run of ``take[p]`` starts from
    partition row ``row[p]`` (``blocks.segment_runs``) written into ``out[at:]`` from one ramp in ``out``'s
    dtype, without int64 temporaries; ``table`` as ``Part.block_table``, ``offset`` the buffer row of
    the part's first row. Returns the position after the last start written."""
    block = np.searchsorted(table[:, 0], row, side="right") - 1  # (q,) block holding each run (one piece's rows)
    begin = row - (table[block, 0] - table[block, 1]) + offset  # (q,) buffer row of each run's first window
    ramp = np.arange(int(take.max()), dtype=out.dtype) * stride  # buffer rows fit out's dtype, so the ramp does
    for first, count in zip(begin.tolist(), take.tolist()):
        np.add(ramp[:count], first, out=out[at : at + count])
        at += count
    return at


def _first_inside(bad: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int]]:
    """``[(w, row)]``: the first range ``[lo[w], hi[w])`` holding a row of ``bad`` (sorted), and that row."""
    if not len(bad):
        return []
    k = np.searchsorted(bad, lo)  # the first bad row at or after each range's start
    inside = (k < len(bad)) & (bad[np.minimum(k, len(bad) - 1)] < hi)
    if not inside.any():
        return []
    w = int(np.flatnonzero(inside)[0])
    return [(w, int(bad[k[w]]))]


def _check_nan(part: Part, rows: np.ndarray, spec: WindowSpec, shift: int) -> None:
    """Raise ``DataError`` if a window at part rows ``rows`` holds a NaN it would yield.

    ``shift`` turns those part rows into partition rows (for the message).
    """
    if spec.nan != "raise" or (len(part.nan_x) == 0 and len(part.nan_y) == 0) or len(rows) == 0:
        return
    lo_y = rows + (spec.window if spec.horizon else spec.window - 1)
    hits = [
        (role, int(rows[w]), row)
        for role, bad, lo, hi in (
            ("feature", part.nan_x, rows, rows + spec.window),
            ("target", part.nan_y, lo_y, lo_y + max(spec.horizon, 1)),
        )
        for w, row in _first_inside(bad, lo, hi)
    ]
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
            f"{problem} in {role} column {column!r} of {part.name} at row {row + shift} of that partition, inside the "
            f"window starting at row {start + shift}; clean the data, or pass nan='drop' to leave out windows "
            "that contain NaN or inf"
        )
