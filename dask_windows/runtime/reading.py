"""How a pass of the buffer order (whole partitions) reads: reader threads of this process.

``plan`` is a reader's plan of an epoch; ``batches`` connects a reader's plan
to its reader threads and to ``pipeline.stream``; ``read_unit`` and
``read_part`` read and decode one partition's pieces, recording unreadable
ones with ``on_error="skip"``. Each function takes the frozen values of its
pass (``runtime.values``), never the dataset. (A reader's share of an epoch may begin
or end inside a partition: that partition is read as a piece of it, its windows'
rows and their halo.)

``open_reads`` starts a plan's readers; ``batches`` takes those the next-pass
hook (``PassValues.next_pass``: ``speedups.nextpass``, wired by the dataset)
started ahead for this very plan when there are, and starts the next pass's
once the consumer takes this pass's last buffer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from dask_windows.errors import SourceReadError
from dask_windows.faults import record_skip, skip_allowed
from dask_windows.planning.plan import plan_reader
from dask_windows.planning.world import World
from dask_windows.runtime.blocks import merge_rows
from dask_windows.runtime.buffer import (
    Part,
    PlannedStarts,
    decode,
    decode_chunks,
    decode_pieces,
    piece_rows,
    piece_units,
    plan_starts,
    unit_rows,
)
from dask_windows.runtime.memory import small_pages_map
from dask_windows.runtime.pipeline import stream
from dask_windows.runtime.prefetch import Prefetcher
from dask_windows.runtime.telemetry import timed_output, timed_parts
from dask_windows.runtime.values import PassValues, ReadValues
from dask_windows.sources import PartitionReader
from dask_windows.tuning import READ_THREADS

__all__ = [
    "READ_THREADS",
    "BufferArena",
    "Reads",
    "batches",
    "open_reads",
    "plan",
    "read_ahead",
    "read_part",
    "read_unit",
    "small_pages",
]


def batches(values: PassValues, plan: Any, progress: Any = None, this_pass: tuple | None = None) -> Iterator[Any]:
    """The batches of ``plan``, read ahead by the pass's read backend.

    Args:
        values: The pass's values (``runtime.values``).
        plan: This reader's plan (``WindowDataset._plan``).
        progress: This pass's resume counter, or ``None``.
        this_pass: ``(epoch, reader's World)`` of a pass that ``iter(ds)`` started: its first buffer
            may have been read ahead (``values.next_pass.claim``), and once its last buffer is taken the
            next pass's is read ahead (``values.next_pass.begin``); ``None``: neither.

    Yields:
        The batches, each counted (``values.step(progress)``) before it is yielded.
    """
    ds, ahead = values.reads, values.next_pass if this_pass is not None else None
    claimed = ahead.claim(plan, this_pass) if ahead is not None else None
    reads, started = claimed if claimed is not None else (open_reads(values, plan), None)
    parts = _flat(reads.reader) if started is None else iter(())
    telemetry = ds.telemetry
    if telemetry is not None:
        telemetry.order = "buffer"
    parts = timed_parts(telemetry, parts)  # the builder's waits for the readers (see telemetry)

    def reread(seg: Any) -> Part | None:
        return read_part(ds, seg, PartitionReader(ds.source, [seg.partition], ds.columns))

    last = None
    begun: list[Any] = []  # the next pass's read-ahead, once this pass's last buffer is taken
    if ahead is not None and this_pass is not None and ahead.wanted(reads, plan):
        epoch, world = this_pass
        last = lambda: begun.append(ahead.begin(epoch, world))
    arena = reads.arena
    try:
        batches = stream(
            plan, parts, ds.grid, ds.row_offsets, ds.spec, timed_output(telemetry, values.output), values.normalize, reread,
            background=reads.background, interrupt=reads.reader.close,
            release=None if arena is None else arena.release,
            prepare=None if arena is None else arena.planned_starts, started=started, last=last,
            device=values.device, waits=None if telemetry is None else telemetry.waits,
            allocator=values.allocator,
        )  # fmt: skip
        yield from values.counted(batches, progress)
    finally:
        reads.close()
        for pending in begun:  # (no module globals here: this may run while the interpreter exits)
            try:
                if pending is not None:
                    pending.arm()  # the next pass's first buffer waits from now on (``next_pass_seconds``)
            except Exception:  # pragma: no cover - the interpreter is exiting
                pass


class Reads:
    """What reads a pass's pieces: the reader the builder takes parts from, and what it needs.

    Attributes:
        reader: A ``Prefetcher`` of the plan's units.
        source_reader: The pass's reader of its partitions.
        arena: The arrays buffers are decoded into (``BufferArena``).
        background: Whether buffers are built on a builder thread (``prefetch_partitions >= 1``).
    """

    def __init__(self, reader: Any, source_reader: Any, arena: BufferArena | None, background: bool) -> None:
        self.reader, self.source_reader, self.arena, self.background = reader, source_reader, arena, background

    def close(self) -> None:
        """Stop the reads and join their threads."""
        self.reader.close()
        self.source_reader.close()


def open_reads(values: PassValues, plan: Any) -> Reads:
    """The reads of ``plan``, started now on reader threads."""
    ds = values.reads
    units = piece_units(plan)  # a buffer's pieces of one partition are read together
    source_reader = ds.source.reader([unit[0].partition for unit in units], ds.columns)
    arena = BufferArena(ds, plan, units)  # the reader threads decode a buffer's units into one array
    threads = READ_THREADS if ds.source.reads_in_processes else 1  # file/object-store reads release the GIL
    depth = read_ahead(ds, plan, units, threads)
    reader = Prefetcher(lambda unit: read_unit(ds, unit, source_reader, arena), units, depth, threads=threads)
    return Reads(reader, source_reader, arena, depth > 0)


def read_ahead(ds: ReadValues, plan: Any, units: list[tuple], threads: int) -> int:
    """Units the reader threads may hold read (or being read) beyond those the builder has taken.

    ``prefetch_partitions`` partitions' worth of ``units`` (the plan's units in reading order), and at
    least one per thread, so that all threads read at once; ``0`` (no thread) with
    ``prefetch_partitions=0``. The builder takes the units of the buffer after the one being drained
    as they arrive, so the reads run that buffer plus this depth ahead of the consumer: the next
    buffer is read while the current one is drained, whatever ``prefetch_partitions`` is
    (tests/runtime/test_read_ahead.py), and the memory formula's ``pf`` term is this depth.
    """
    ahead = ds.spec.prefetch_partitions * len(units)
    depth = -(-ahead // max(len(plan.segments), 1))
    return max(depth, threads) if depth else 0


def plan(ds: ReadValues, world: World, skip_batches: int, epoch: int) -> Any:
    """The plan of ``world``'s reader for ``epoch``, after ``skip_batches``."""
    s = ds.spec
    return plan_reader(
        ds.grid.windows_per_partition,
        world,
        seed=s.seed,
        epoch=epoch,
        shuffle=s.shuffle,
        batch_size=s.batch_size,
        drop_last=s.drop_last,
        buffer_partitions=s.buffer_partitions,
        skip_batches=skip_batches,
    )


def read_part(ds: ReadValues, segment: Any, reader: PartitionReader) -> Part | None:
    """Read and decode a segment's piece; ``None`` when it is unreadable and ``on_error="skip"``."""
    index = segment.partition
    name = ds.source.partitions[index].name
    r0, r1 = piece_rows(ds.grid, segment, ds.spec.span)
    telemetry, clock = ds.telemetry, time.perf_counter_ns
    started = clock()
    try:
        columns = reader.read_rows(index, r0, r1)
    except SourceReadError as exc:
        if not skip_allowed(ds.on_error, exc):
            raise
        record_skip(ds.skipped, name, "read", exc)
        return None
    fetched = clock()
    part = decode(index, name, columns, ds.spec, ds.scale, r0, ds.y_dtype)
    if telemetry is not None:
        telemetry.add_read(fetched - started, clock() - fetched, (r1 - r0) * len(ds.spec.columns) * 4)
    return part


def read_unit(
    ds: ReadValues, unit: tuple, reader: PartitionReader, arena: BufferArena | None = None
) -> list[Part | None]:
    """Read one partition's pieces of a buffer in one call and decode them together; ``None``s when unreadable.

    Pieces whose rows overlap or touch are read as one row block (their shared halo once); the
    blocks are decoded into one ``Part`` (``decode_pieces``), returned once per segment of ``unit``;
    with an ``arena``, into the rows of the buffer's shared arrays that it assigns to ``unit``.
    """
    index = unit[0].partition
    name = ds.source.partitions[index].name
    blocks = arena.blocks(unit) if arena is not None else _blocks(ds, unit)
    y_dtype = ds.y_dtype
    place = arena.place(unit) if arena is not None else None
    ranges = [(int(a), int(b)) for a, b in blocks]
    telemetry, clock = ds.telemetry, time.perf_counter_ns
    started = clock()
    try:
        chunks = reader.read_ranges_chunks(index, ranges) if place is not None else None
        if chunks is not None and place is not None:  # a row group at a time, decoded into the buffer as it comes
            sizes = blocks[:, 1] - blocks[:, 0]
            part = decode_chunks(
                index, name, chunks, blocks[:, 0], sizes, ds.spec, ds.scale, y_dtype or np.float32, place
            )
            if part is not None:
                if telemetry is not None:  # read and decoded together: counted as fetch
                    telemetry.add_read(clock() - started, 0, int(sizes.sum()) * len(ds.spec.columns) * 4)
                return [part] * len(unit)
        pieces = reader.read_ranges(index, ranges)
    except SourceReadError as exc:
        if not skip_allowed(ds.on_error, exc):
            raise
        record_skip(ds.skipped, name, "read", exc)
        return [None] * len(unit)
    fetched = clock()
    part = decode_pieces(index, name, pieces, blocks[:, 0], ds.spec, ds.scale, y_dtype, place)
    if telemetry is not None:
        rows = sum(b - a for a, b in ranges)
        telemetry.add_read(fetched - started, clock() - fetched, rows * len(ds.spec.columns) * 4)
    return [part] * len(unit)


def _blocks(ds: ReadValues, unit: tuple) -> np.ndarray:
    """``(m, 2)`` disjoint row blocks, in row order, holding the pieces of ``unit``."""
    blocks = merge_rows(unit_rows(ds.grid, unit, ds.spec.span))
    return blocks if len(blocks) else np.zeros((1, 2), np.int64)


def _flat(reader: Iterable[list[Part | None]]) -> Iterator[Part | None]:
    """The parts of each unit in turn, holding none of a unit's parts while the next unit is read.

    (A generator expression keeps the last unit's list, and so views of its buffer's array, until
    the next read returns: with ``prefetch_partitions=0`` that kept a drained buffer alive through
    the next buffer's read.)
    """
    for unit_parts in reader:
        yield from unit_parts
        del unit_parts


def small_pages(shape: tuple, dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` in the kernel's small pages, for the arrays of the first buffer.

    numpy asks for transparent huge pages on large arrays (``MADV_HUGEPAGE``); where the kernel
    compacts memory to find them on first touch (``defrag`` set to ``madvise``, the common default)
    and free memory is fragmented (a page cache full of files), that first touch stalls: 0.6-0.9 s
    for the 256 MiB of two 128 MiB partitions on the 2-core test machine, more than the rest of
    the way to the first batch. The first buffer's arrays are therefore mapped without that advice
    (an anonymous ``mmap``, freed with the array); its gathers were 5-11% slower than from huge
    pages in the same measurement, the later buffers' arrays, filled off the way to a batch, keep
    numpy's default.
    """
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    if size < 4 << 20:  # below numpy's huge-page threshold: nothing to avoid
        return np.empty(shape, dtype)
    # Private: a shared anonymous mapping is shmem, whose first touch cost 1.6-5x that of private
    # memory here (0.17-0.55 against 0.10 s for 256 MiB); moved to huge pages after its first batches.
    return np.frombuffer(small_pages_map(size), dtype).reshape(shape)


class BufferArena:
    """One features (and targets) array per buffer, which the buffer's units are decoded into.

    ``Buffer`` then uses it as it is instead of joining the parts: one copy of the buffer's rows
    less, in time and in peak memory. The arrays of a buffer are allocated when its first unit is
    decoded (on a reader thread); they are referenced here until the builder releases the buffer
    (``release``), the parts keep theirs.
    A unit whose rows differ from those planned (a source returning fewer) gets arrays of its own,
    and a buffer with a skipped unit is joined as before (``Buffer`` checks that its parts tile).
    """

    def __init__(self, ds: ReadValues, plan: Any, units: list[tuple]) -> None:
        self.ds = ds
        self.buffer_of: dict[tuple, int] = {}  # unit -> its buffer's number
        self.members: list[list[tuple]] = []  # units of each buffer, in reading order
        k = 0
        for group in plan.buffers:
            mine, covered = [], 0
            while covered < len(group) and k < len(units):
                mine.append(units[k])
                covered += len(units[k])
                self.buffer_of[units[k]] = len(self.members)
                k += 1
            self.members.append(mine)
        self.usable = not (ds.spec.targets and ds.y_dtype is None)
        # Per buffer: its units' (blocks, first row) and its arrays. Reader threads (several at once)
        # may work on two buffers; the builder releases a buffer once it holds its parts.
        self._buffers: dict[int, tuple[dict[tuple, tuple[np.ndarray, int]], tuple | None]] = {}
        self._released = -1  # buffers up to this one are released
        self._lock = threading.Lock()

    def _state(self, unit: tuple) -> tuple[dict[tuple, tuple[np.ndarray, int]], tuple | None]:
        g = self.buffer_of.get(unit, -1)
        with self._lock:
            state = self._buffers.get(g) if g >= 0 else None
            if state is not None:
                return state
            table, at = {}, 0
            for member in self.members[g] if g >= 0 else [unit]:
                blocks = _blocks(self.ds, member)
                table[member] = (blocks, at)
                at += int((blocks[:, 1] - blocks[:, 0]).sum())
            arrays = None
            if self.usable and g > self._released:
                spec = self.ds.spec
                c = len(spec.features)
                # The first buffer, on the way to the first batch, in small pages; the later ones by numpy.
                empty = small_pages if g == 0 else np.empty
                x = empty((c, at) if spec.layout == "NCL" else (at, c), np.float32)
                y = empty((len(spec.targets), at), self.ds.y_dtype) if spec.targets else None
                arrays = (x, y)
            if g > self._released:
                self._buffers[g] = (table, arrays)
                for old in [b for b in self._buffers if b < g - 2]:  # no read goes that far back
                    del self._buffers[old]
            return table, arrays

    def blocks(self, unit: tuple) -> np.ndarray:
        """``(m, 2)`` the row blocks of ``unit`` (``_blocks``), computed with its buffer's."""
        return self._state(unit)[0][unit][0]

    def place(self, unit: tuple) -> tuple | None:
        """``(x, y, row)``: the buffer's arrays and the row where ``unit``'s rows go; ``None`` without."""
        table, arrays = self._state(unit)
        if arrays is None:
            return None
        return (*arrays, table[unit][1])

    def layout(self, buffer: int) -> list[tuple[tuple, np.ndarray, int]] | None:
        """Per unit of ``buffer``, in order: its segments, its row blocks and the buffer row where they
        go; ``None`` when its pieces are not decoded into shared arrays (``buffer.plan_starts``)."""
        members = self.members[buffer] if buffer < len(self.members) else []
        if not members:
            return None
        table, arrays = self._state(members[0])
        if arrays is None:
            return None
        return [(unit, *table[unit]) for unit in members]

    def planned_starts(self, buffer: int) -> PlannedStarts | None:
        """``buffer``'s window starts, listed before its pieces are read (``None``: listed by ``Buffer``)."""
        layout = self.layout(buffer)
        if layout is None:
            return None
        return plan_starts(layout, self.ds.grid, self.ds.spec, small_pages if buffer == 0 else np.empty)

    def release(self, buffer: int) -> None:
        """Forget the arrays of buffers up to ``buffer`` (their parts hold them now)."""
        with self._lock:
            self._released = max(self._released, buffer)
            for old in [b for b in self._buffers if b <= buffer]:
                del self._buffers[old]
