"""Decoded pieces of partitions in memory and the shuffled windows being drawn from them.

A plan segment (windows ``[lo, hi)`` of a partition) is read as one *piece*:
the rows from its first window's start to its last window's end
(``piece_rows``), so a piece carries the halo its last windows need and
nothing else. ``decode`` turns a piece's columns into the arrays the gather
wants (features channel-major for ``NCL``); it runs on the prefetch thread so
the conversion overlaps the training step, and ``decode_pieces`` does it once
for all of a partition's pieces in a buffer (``blocks``), into the buffer's one
array when the reader provides it. ``Buffer`` holds the pieces of one plan
group (many partitions' worth of places, about ``buffer_partitions``
partitions' worth of rows; joined only when not decoded in place), lists the start rows of the group's windows
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

from dask_windows.checks import value_problem
from dask_windows.errors import DataError
from dask_windows.faults import replacement_picks
from dask_windows.normalize import standardize
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.plan import EpochPlan, Segment
from dask_windows.planning.windows import window_starts
from dask_windows.runtime.batch import Gatherer
from dask_windows.runtime.blocks import decode_blocks, segment_runs, segment_starts
from dask_windows.spec import WindowSpec
from dask_windows.tuning import PERMUTATION_HEAD as HEAD

__all__ = [
    "HEAD",
    "Buffer",
    "ChunkDecoder",
    "Part",
    "PlannedStarts",
    "decode",
    "decode_chunks",
    "decode_pieces",
    "permute_head",
    "permute_tail",
    "permute_windows",
    "piece_rows",
    "piece_units",
    "plan_starts",
    "unit_rows",
]


_CHUNK = 1 << 18  # windows whose starts are computed at once
_GROUP_ROWS = 1 << 17  # most rows of read chunks decoded in one call (decode_chunks)
_RAMP_WINDOWS = 1024  # windows per run of starts from which each run is written in one call (_ramp_starts)


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
        blocks: ``(m, 2)`` int64 ``[partition row, part row]`` where each of the part's row blocks
            begins, when it holds several disjoint row ranges laid end to end (``decode_pieces``);
            ``None``: one block, ``[[row0, 0]]``.
        arena: ``(x, y, row)`` when ``x`` and ``y`` are views of arrays shared by a buffer's parts,
            from ``row`` on (``reading.BufferArena``): a buffer of parts tiling them uses them as they are.
    """

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
) -> Part:
    """Stack a piece's columns (partition rows from ``row0``) into the buffer layout (one copy per
    column), standardised with ``scale = (mean, std)`` per feature when given.

    ``y_dtype`` is the dataset's one target dtype (``checks.output_dtype``, from the schema at
    open); ``None`` decides it from this piece's columns.
    """
    return decode_pieces(index, name, [columns], [row0], spec, scale, y_dtype)


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

    ``arena = (x, y, row)``: write into rows ``row ..`` of a buffer's shared arrays when they fit.
    """
    if spec.targets and y_dtype is None:
        y_dtype = _target_dtype([p[c] for p in pieces[:1] for c in spec.targets])
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


def decode_chunks(
    index: int,
    name: str,
    chunks: Iterator[tuple[int, int, dict]],
    rows0: np.ndarray,
    sizes: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    y_dtype: type,
    arena: tuple,
) -> Part | None:
    """``decode_pieces`` of pieces that arrive in chunks (a row group at a time), each written into the
    buffer's arrays (``arena = (x, y, row)``) as it comes; ``None`` if the chunks cannot stand in for it.

    The same values, bad rows and blocks as ``decode_pieces`` of the joined pieces: the decode is
    elementwise, so decoding ``chunks[k]`` into its rows is decoding the whole. ``None`` when a
    column's dtype changes between chunks (integers with nulls in one row group: the whole read
    would convert every row that way) or the chunks do not tile the pieces; the caller then reads
    the pieces whole. (``ChunkDecoder`` does it a chunk at a time, for reads that feed two.)

    Args:
        index, name: The partition.
        chunks: ``(piece, row, columns)``: rows ``row ..`` of piece number ``piece``, in row order.
        rows0: ``(m,)`` partition row where each piece begins, in row order.
        sizes: ``(m,)`` rows of each piece.
        spec, scale, y_dtype: As ``decode_pieces``.
        arena: ``(x, y, row)``: the buffer's arrays and the row where the first piece goes.
    """
    decoder = ChunkDecoder(index, name, rows0, sizes, spec, y_dtype, arena)
    for piece, row, columns in chunks:
        if not decoder.feed(piece, row, columns):
            return None
    return decoder.finish(scale)


class ChunkDecoder:
    """``decode_chunks`` one chunk at a time: ``feed`` each, then ``finish`` (arguments as there)."""

    def __init__(
        self, index: int, name: str, rows0: np.ndarray, sizes: np.ndarray, spec: WindowSpec, y_dtype: type,
        arena: tuple,
    ) -> None:  # fmt: skip
        self.index, self.name, self.rows0, self.sizes, self.spec = index, name, rows0, sizes, spec
        self.y_dtype, self.arena = y_dtype, arena
        self.offsets = np.cumsum([0, *sizes.tolist()]).astype(np.int64)  # (m+1,) part row where each piece begins
        self.filled = np.zeros(len(sizes), np.int64)  # rows of each piece written so far
        self.dtypes: dict | None = None
        self.bad_x: list[np.ndarray] = []
        self.bad_y: list[np.ndarray] = []
        self.group: list[dict] = []  # chunks of one read that land end to end in the arena, decoded in one call
        self.start = self.end = 0  # part rows ``[start, end)`` of the group
        self.owner: Any = None  # the array the group's columns are views of (one read)

    def _flush(self) -> None:
        if not self.group:
            return
        spec, (base_x, base_y, at) = self.spec, self.arena
        p, q = at + self.start, at + self.end
        channel_major = spec.layout == "NCL"
        out = (base_x[:, p:q] if channel_major else base_x[p:q], None if base_y is None else base_y[:, p:q])
        _, _, nan_x, nan_y, _ = decode_blocks(
            self.group, spec.features, spec.targets, channel_major, spec.nan == "raise", self.y_dtype, out
        )
        self.bad_x.append(nan_x + self.start)
        self.bad_y.append(nan_y + self.start)
        self.group.clear()

    def feed(self, piece: int, row: int, columns: dict) -> bool:
        """Decode (or group) rows ``row ..`` of piece ``piece``; ``False``: the chunks cannot stand in."""
        kinds = {col: values.dtype for col, values in columns.items()}
        if self.dtypes is None:
            self.dtypes = kinds
        first = columns[self.spec.features[0]]
        n = len(first)
        if kinds != self.dtypes or row != self.filled[piece] or row + n > self.sizes[piece]:
            return False
        p = int(self.offsets[piece]) + row
        base = first.base
        # One decode per read instead of per chunk (a read holds many small pieces): a constant
        # number of numpy calls per column, fewer GIL hand-offs to the consumer. Bounded in rows so
        # that a float64 column joined before its cast (``blocks._fill``) stays a small temporary.
        if p != self.end or base is None or base is not self.owner or self.end - self.start >= _GROUP_ROWS:
            self._flush()
            self.start, self.owner = p, base
        self.group.append(columns)
        self.end = p + n
        self.filled[piece] += n
        return True

    def finish(self, scale: tuple[np.ndarray, np.ndarray] | None) -> Part | None:
        """The ``Part`` of the pieces fed; ``None`` when they were not all fed whole."""
        self._flush()
        self.owner = None
        if not np.array_equal(self.filled, self.sizes):
            return None
        base_x, base_y, at = self.arena
        rows = int(self.offsets[-1])
        x = base_x[:, at : at + rows] if self.spec.layout == "NCL" else base_x[at : at + rows]
        y = None if base_y is None else base_y[:, at : at + rows]
        if scale is not None:
            standardize(x, *scale, self.spec.layout == "NCL")
        nan_x = np.concatenate(self.bad_x).astype(np.int64)  # chunks in row order: sorted
        nan_y = np.concatenate(self.bad_y).astype(np.int64)
        blocks = None if len(self.sizes) == 1 else np.stack([self.rows0, self.offsets[:-1]], axis=1)  # (m, 2)
        return Part(self.index, self.name, x, y, nan_x, nan_y, int(self.rows0[0]), blocks, self.arena)


@dataclass
class PlannedStarts:
    """A buffer's window starts listed from where its parts will be decoded, before they arrive.

    Listing 16.7M starts (two 128 MiB partitions at stride 1) takes 0.05-0.2 s, most of it the
    first touch of their array; listed on the builder thread while the readers read, it is off
    the way to the first batch. ``Buffer`` uses them only where its parts landed as planned.

    Attributes:
        starts: ``(windows,)`` buffer rows, as ``Buffer`` lists them.
        segments: The segments they are the windows of, in order.
        rows: Buffer row of each unit's part.
        tables: Each unit's ``(m, 2)`` ``[partition row, part row]`` where its blocks begin.
    """

    starts: np.ndarray
    segments: tuple[Segment, ...]
    rows: list[int]
    tables: list[np.ndarray]

    def fits(
        self, segments: tuple[Segment, ...], held: list[Part], offsets: np.ndarray, tables: list, spec: WindowSpec
    ) -> bool:
        """Whether these are the starts of ``held`` (the parts of ``segments`` at buffer rows ``offsets``)."""
        if spec.nan == "raise" and any(len(p.nan_x) or len(p.nan_y) for p in held):
            return False  # their windows are checked as the starts are listed
        return (
            segments == self.segments
            and offsets[:-1].tolist() == self.rows
            and len(tables) == len(self.tables)
            and all(np.array_equal(a, b) for a, b in zip(tables, self.tables))
        )


def plan_starts(
    layout: list[tuple[tuple, np.ndarray, int]], grid: WindowGrid, spec: WindowSpec, empty: Any = np.empty
) -> PlannedStarts:
    """The starts of a buffer whose units will be decoded as ``layout`` says, before they are.

    Args:
        layout: Per unit, in order: its segments, its ``(m, 2)`` partition row blocks, and the buffer
            row where they go end to end (``reading.BufferArena.layout``).
        grid: The dataset's window grid.
        spec: Window settings.
        empty: Allocates the starts (``np.empty`` or ``reading.small_pages``).
    """
    segments = tuple(seg for unit, _, _ in layout for seg in unit)
    unit, blocks, row = layout[-1]
    total = row + int((blocks[:, 1] - blocks[:, 0]).sum())  # rows of the buffer
    starts = empty(sum(seg.num_windows for seg in segments), np.int32 if total < 2**31 else np.int64)
    at, rows, tables = 0, [], []
    for unit, blocks, row in layout:
        sizes = blocks[:, 1] - blocks[:, 0]
        table = np.stack([blocks[:, 0], np.cumsum(sizes) - sizes], axis=1).astype(np.int64)  # as Part.block_table
        at = _fill_starts(starts, at, None, unit, grid, spec, row, table)
        rows.append(row)
        tables.append(table)
    return PlannedStarts(starts, segments, rows, tables)


class Buffer:
    """The partitions of one plan group and their windows.

    Args:
        parts: Decoded pieces, one per segment, in segment order.
        segments: Which windows of each partition this reader yields.
        grid: The dataset's window grid.
        row_offsets: ``(P,)`` global row of each partition's first row.
        spec: Window settings.
        scale: ``(mean, std)`` per feature for global standardisation, or ``None``.
        planned: The window starts listed before the parts arrived (``plan_starts``), used when the
            parts are where they were planned; else the starts are listed here.
    """

    def __init__(
        self,
        parts: list[Part],
        segments: tuple[Segment, ...],
        grid: WindowGrid,
        row_offsets: np.ndarray,
        spec: WindowSpec,
        scale: tuple[np.ndarray, np.ndarray] | None = None,
        planned: PlannedStarts | None = None,
    ) -> None:
        axis = 1 if spec.layout == "NCL" else 0
        # A part serving several segments (one decode of a partition's pieces) is held once.
        unique: dict[int, int] = {}  # id(part) -> its number among the distinct parts
        held: list[Part] = []
        for part in parts:
            if id(part) not in unique:
                unique[id(part)] = len(held)
                held.append(part)
        offsets = np.cumsum([0, *(p.x.shape[axis] for p in held)])  # (held+1,) buffer row of each part
        shared = _shared_arena(held, offsets, axis)
        if shared is not None:  # the parts were decoded into one buffer's arrays: nothing to join
            x, y = shared
        else:
            x = held[0].x if len(held) == 1 else np.concatenate([p.x for p in held], axis=axis)
            y = None
            if spec.targets:
                y = held[0].y if len(held) == 1 else np.concatenate([p.y for p in held], axis=1)
        tables = [p.block_table() for p in held]  # per part (m, 2) [partition row, part row] of its blocks
        self.part_offsets = np.concatenate(
            [*(t[:, 1] + o for t, o in zip(tables, offsets)), offsets[-1:]]
        )  # (blocks+1,) buffer row where each block begins, then the total
        partition_of = {id(part): seg.partition for part, seg in zip(parts, segments)}
        self.part_rows = np.concatenate(
            [t[:, 0] + row_offsets[partition_of[id(p)]] for t, p in zip(tables, held)]
        ).astype(np.int64)  # (blocks,) dataset row of each block's first row
        # One allocation for the buffer's window starts; int32 halves it when rows allow.
        dtype = np.int32 if self.part_offsets[-1] < 2**31 else np.int64
        if planned is not None and shared is not None and planned.fits(segments, held, offsets, tables, spec):
            self.starts = planned.starts  # listed while the parts were read
            run = len(parts)
        else:
            self.starts = np.empty(sum(seg.num_windows for seg in segments), dtype)  # (windows,) buffer rows
            run = 0
        at = 0
        while run < len(parts):  # consecutive segments of one part: their starts in one pass
            end = run + 1
            while end < len(parts) and parts[end] is parts[run]:
                end += 1
            k = unique[id(parts[run])]
            at = _fill_starts(self.starts, at, parts[run], segments[run:end], grid, spec, int(offsets[k]), tables[k])
            run = end
        codes = None
        if spec.code_features:  # (K, rows) the last K channels as integer codes: cast once a row, not once a window
            codes = x[len(x) - spec.code_features :].astype(spec.code_dtype)
        mean, std = scale or (None, None)
        self.gatherer = Gatherer(x, y, spec.window, spec.horizon, spec.layout, mean, std, codes=codes)
        self.nbytes = x.nbytes + (0 if y is None else y.nbytes) + self.starts.nbytes
        self.nbytes += 0 if codes is None else codes.nbytes

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


def _shared_arena(held: list[Part], offsets: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The arrays that ``held`` were decoded into, when they tile them exactly in order; else ``None``."""
    if held[0].arena is None:
        return None
    base_x, base_y, _ = held[0].arena
    for part, offset in zip(held, offsets):
        if part.arena is None or part.arena[0] is not base_x or part.arena[2] != offset:
            return None
    return (base_x, base_y) if int(offsets[-1]) == base_x.shape[axis] else None


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
    """``_fill_starts`` for long runs of windows: each run of starts written into ``out`` in one call.

    The vectorised path builds every start in int64 temporaries (about ten passes over them); a run
    of ``take[p]`` windows is ``first + stride * arange`` and is written straight in ``out``'s dtype
    from one ramp, one pass. Worth it when runs are long (``_RAMP_WINDOWS``): one call per run.

    Args:
        out: The buffer's starts; ``out[at:]`` is written.
        at: Position of the first start to write.
        row: ``(q,)`` partition row of each run's first window (``blocks.segment_runs``).
        take: ``(q,)`` windows of each run, at most ``_CHUNK``.
        table: ``(m, 2)`` ``[partition row, part row]`` where each of the part's blocks begins.
        offset: Buffer row of the part's first row.
        stride: Rows between consecutive windows of a run.

    Returns:
        The position after the last start written.
    """
    block = np.searchsorted(table[:, 0], row, side="right") - 1  # (q,) block holding each run (one piece's rows)
    begin = row - (table[block, 0] - table[block, 1]) + offset  # (q,) buffer row of each run's first window
    ramp = np.arange(int(take.max()), dtype=out.dtype) * stride  # buffer rows fit out's dtype, so the ramp does
    for first, count in zip(begin.tolist(), take.tolist()):
        np.add(ramp[:count], first, out=out[at : at + count])
        at += count
    return at


def _check_nan(part: Part, rows: np.ndarray, spec: WindowSpec, shift: int) -> None:
    """Raise ``DataError`` if a window at part rows ``rows`` holds a NaN it would yield.

    ``shift`` turns those part rows into partition rows (for the message).
    """
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
            f"{problem} in {role} column {column!r} of {part.name} at row {row + shift} of that partition, inside the "
            f"window starting at row {start + shift}; clean the data, or pass nan='drop' to leave out windows "
            "that contain NaN or inf"
        )
