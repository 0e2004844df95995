"""Reading a pool plan: each unit decoded once into the pool's rows, each step's windows cut into batches.

``pool_batches``: a reader thread (``Prefetcher``; the fill on ``fill_threads`` threads remotely) decodes
units in plan order into their pool rows, a builder thread (``Ahead``) turns each step into its windows'
shuffled pool rows, ``pipeline.stream`` gathers. Windows across a cut are read with the later unit, the
earlier keeping their rows (``_Edges``); an unreadable unit's windows (``on_error="skip"``) are replaced
by other windows of their steps, so the batch count never changes. The next pass's first units may be
read ahead (``UnitReads``, ``speedups.nextpass``); the arithmetic is ``planning.pool``'s and ``budget``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from dask_windows.errors import SourceReadError
from dask_windows.errors.faults import REPLACEMENT_TAG, record_skip, replacement_picks, skip_allowed
from dask_windows.planning.budget import PoolWarning
from dask_windows.planning.plan import Segment, rng_for
from dask_windows.planning.pool import PoolPlan, PoolUnits, live_units, shuffle_step, shuffle_unit, unit_steps
from dask_windows.planning.windows import window_starts
from dask_windows.runtime.batch import Gatherer
from dask_windows.runtime.buffer import Part, _fill_starts, decode_pieces
from dask_windows.runtime.pipeline import _Built, stream
from dask_windows.runtime.prefetch import Ahead, Prefetcher
from dask_windows.runtime.telemetry import timed_output, timed_parts
from dask_windows.runtime.values import PassValues, ReadValues
from dask_windows.runtime.window_table import WindowTable, build_table, worth_building
from dask_windows.settings.tuning import BUFFER_BYTES, FILL_THREADS, POOL_FIRST_BYTES

# (``BUFFER_BYTES`` and ``PoolWarning``: re-exported from their homes, ``settings.tuning`` and ``planning.budget``)
__all__ = ["BUFFER_BYTES", "PoolWarning", "UnitReads", "pool_batches"]


class _Edges:
    """Rows an earlier unit kept for a later one, by ``(partition, lo, hi)``; ``None`` for an unreadable unit's."""

    def __init__(self) -> None:
        self._kept: dict[tuple, dict | None] = {}
        self._ready = threading.Condition()

    def put(self, key: tuple, columns: dict | None) -> None:
        with self._ready:
            self._kept[key] = columns
            self._ready.notify_all()

    def take(self, key: tuple) -> dict | None:
        with self._ready:  # kept by an earlier unit: read before this one, or being read
            self._ready.wait_for(lambda: key in self._kept)
            return self._kept.pop(key)


class _Pool:
    """The pass's pool arrays and the reads that fill them."""

    def __init__(self, reads: ReadValues, plan: PoolPlan, reader: Any, sample: bool = False) -> None:
        spec = reads.spec
        self.reads, self.plan, self.reader = reads, plan, reader
        rows = max(plan.pool_rows, 1)
        self.x = np.empty(
            (len(spec.features), rows) if spec.layout == "NCL" else (rows, len(spec.features)), np.float32
        )
        y_dtype = reads.y_dtype or np.float32
        self.y = np.empty((len(spec.targets), rows), y_dtype) if spec.targets else None
        # (K, rows) the last K features as integer codes (``WindowSpec.code_features``), cast as each unit lands
        self.codes = np.empty((spec.code_features, rows), spec.code_dtype) if spec.code_features else None
        # normalize="sample": per pool row, the mean and inverse std of the window starting there (window_table),
        # built once per unit as it lands
        self.table = np.empty((rows, 2 * len(spec.features)), np.float32) if sample else None
        self.edges = _Edges()
        self.kept = kept_rows(plan)  # partition -> the (partition, lo, hi) its units keep for later ones
        self.telemetry = reads.telemetry  # where reads are reported (``None`` while read ahead of the pass)

    def _rows(self, p: int, lo: int, hi: int) -> dict:
        return self.reader.read_rows(p, lo, hi)

    def read(self, i: int) -> Part | None:
        """Read unit ``i`` into its pool rows; ``None`` when unreadable and skipped."""
        ds, unit = self.reads, self.plan.units[i]
        p, (r0, r1), (fa, fb) = unit.partition, unit.rows, unit.fresh
        name = ds.source.partitions[p].name
        clock = time.perf_counter_ns
        started = clock()
        handed = 0  # row ranges kept for later units handed over so far
        try:
            fresh = self._rows(p, fa, fb) if fb > fa else None
            for a, b in unit.keep:  # copies: a view would hold the whole decoded read
                self.edges.put((p, a, b), {c: np.array(v[a - fa : b - fa]) for c, v in fresh.items()})  # type: ignore[union-attr]
                handed += 1
        except BaseException as exc:
            # a later unit on another reader thread may wait for these rows: it reads them itself
            for a, b in unit.keep[handed:]:
                self.edges.put((p, a, b), None)
            if not isinstance(exc, SourceReadError) or not skip_allowed(ds.spec.on_error, exc):
                raise
            record_skip(ds.skipped, name, "read", exc)
            return None
        if r1 <= r0:  # a unit read only for the rows it keeps
            return Part(p, name, np.zeros((0, 0), np.float32), None, np.zeros(0, np.int64), np.zeros(0, np.int64))
        pieces, rows0 = [], []
        try:
            if r0 < fa:  # the rows before this read: kept by the unit before it
                kept = self.edges.take((p, r0, fa)) if (p, r0, fa) in self.kept.get(p, ()) else None
                pieces.append(kept or self._rows(p, r0, fa))
                rows0.append(r0)
            a, b = max(r0, fa), min(r1, fb)
            if b > a and fresh is not None:
                pieces.append({c: v[a - fa : b - fa] for c, v in fresh.items()})
                rows0.append(a)
            if r1 > fb:  # the rows after it: kept by the unit after it, else read here
                kept = self.edges.take((p, fb, r1)) if (p, fb, r1) in self.kept.get(p, ()) else None
                pieces.append(kept or self._rows(p, fb, r1))
                rows0.append(fb)
        except SourceReadError as exc:
            if not skip_allowed(ds.spec.on_error, exc):
                raise
            record_skip(ds.skipped, name, "read", exc)
            return None
        del fresh
        fetched = clock()
        arena = (self.x, self.y, unit.offset)
        part = decode_pieces(p, name, pieces, rows0, ds.spec, ds.scale, ds.y_dtype, arena)
        telemetry = self.telemetry
        if telemetry is not None:  # the same stages the buffer order reports (see telemetry)
            telemetry.add_read(fetched - started, clock() - fetched, (r1 - r0) * len(ds.spec.columns) * 4)
        if part.arena is None:  # decoded beside the pool (a dtype only these rows have): copied in
            n = r1 - r0
            if ds.spec.layout == "NCL":
                self.x[:, unit.offset : unit.offset + n] = part.x
            else:
                self.x[unit.offset : unit.offset + n] = part.x
            if self.y is not None and part.y is not None:
                self.y[:, unit.offset : unit.offset + n] = part.y
        if self.codes is not None:  # once per row here, where each window's gather would cast L rows
            at, n = unit.offset, r1 - r0
            np.copyto(
                self.codes[:, at : at + n], self.x[len(self.x) - len(self.codes) :, at : at + n], casting="unsafe"
            )
        if self.table is not None:
            self._tabulate(unit.offset, r1 - r0, unit.num_windows)
        return part

    def _tabulate(self, at: int, n: int, windows: int) -> None:
        """The window statistics of the unit at pool rows ``[at, at + n)`` (``NaN`` where the table does not
        repay its cost); a function of the unit's rows alone, so values never depend on timing or resume."""
        window, channel_major = self.reads.spec.window, self.reads.spec.layout == "NCL"
        count = max(n - window + 1, 0)
        if worth_building(windows, n, window):
            x = self.x[:, at : at + n] if channel_major else self.x[at : at + n]
            self.table[at : at + count] = build_table(x, window, channel_major)  # type: ignore[index]
        else:
            self.table[at : at + count] = np.nan  # type: ignore[index]


def kept_rows(plan: PoolPlan) -> dict[int, set[tuple[int, int, int]]]:
    """Per partition, ``(partition, lo, hi)`` of every row range its units keep for a later unit (only
    units from ``first_unit`` on: after a resume, the unit needing rows reads them itself)."""
    kept: dict[int, set[tuple[int, int, int]]] = {}
    for p, a, b in zip(*(v.tolist() for v in PoolUnits.of(plan.units)[plan.first_unit :].kept())):
        kept.setdefault(p, set()).add((p, a, b))
    return kept


class _Step:
    """One step's windows as ``pipeline.stream`` drains a buffer: pool rows, permuted, and the gatherer."""

    def __init__(self, starts: np.ndarray, gatherer: Gatherer, table: np.ndarray) -> None:
        self.starts = starts
        self.gatherer = gatherer
        self.table = table  # (k, 3) [pool row, rows, dataset row] of the resident units, by pool row
        self.nbytes = starts.nbytes

    def global_rows(self, starts: np.ndarray) -> np.ndarray:
        """Dataset rows of windows at pool rows ``starts``."""
        k = np.searchsorted(self.table[:, 0], starts, side="right") - 1
        return starts - self.table[k, 0] + self.table[k, 2]


def _steps(
    ds: ReadValues, plan: PoolPlan, parts: Iterator[Part | None], gatherer: Gatherer, statistics: Any = None
) -> Iterator[_Built]:
    """The plan's steps, each as a built buffer of pool rows (on the builder thread); ``table``: the pool's
    window statistics (``normalize="sample"``: a ``WindowTable``), used at every position."""
    spec, grid = ds.spec, ds.grid
    dtype = np.int32 if plan.pool_rows < 2**31 else np.int64
    buckets: dict[int, list[np.ndarray]] = {}  # step -> pool rows of its windows, a slice per unit
    lost: dict[int, int] = {}  # step -> windows of unreadable units it loses
    readable: set[int] = set()  # units read (for the rows of ``return_index``)
    skip, owed = plan.skip, 0
    admitted = plan.first_unit
    last = None  # (step, windows, table) of the last step drawn
    for step in range(plan.start, plan.last_step + 1, plan.group):  # a block of steps at a time
        end = min(step + plan.group, plan.last_step + 1)
        for i in range(admitted, end):  # the units read for this block (all of the pool's at the first)
            part = next(parts)
            unit = plan.units[i]
            steps, lo, hi = unit_steps(plan, i)
            if part is None:
                for t, a, b in zip(steps.tolist(), lo.tolist(), hi.tolist()):
                    lost[t] = lost.get(t, 0) + b - a
                continue
            readable.add(i)
            p = unit.partition
            if spec.nan == "raise" and (len(part.nan_x) or len(part.nan_y)):  # its windows checked as listed
                starts = np.empty(unit.num_windows, dtype)
                seg = (Segment(p, unit.lo, unit.hi),)
                _fill_starts(starts, 0, part, seg, grid, spec, unit.offset, part.block_table())
            else:  # the part holds rows [r0, r1) at pool row ``offset``
                rows = window_starts(grid.first[p], grid.counts[p], grid.stride, unit.lo, unit.hi)
                starts = (rows + (unit.offset - unit.rows[0])).astype(dtype)
            shuffle_unit(plan, i, starts)  # (in place: the order ``unit_permutation`` gives)
            drawn = starts
            del part, starts
            for t, a, b in zip(steps.tolist(), lo.tolist(), hi.tolist()):
                if t >= plan.start:
                    buckets.setdefault(t, []).append(drawn[a:b])
        admitted = end
        picks = [piece for t in range(step, end) for piece in buckets.pop(t, [])]
        window = np.concatenate(picks) if picks else np.zeros(0, dtype)
        del picks
        missing = sum(lost.pop(t, 0) for t in range(step, end)) + owed
        owed = 0
        if missing:
            if not len(window):  # nothing readable in this block: a later one stands in for its windows
                owed = missing
                # an empty step all the same: the builder stays one step ahead of the consumer, so the
                # reader (one unit ahead of the builder) never overwrites pool rows a drawn step still uses
                yield _Built(_Step(window, gatherer, np.zeros((0, 3), np.int64)), 0, statistics)
                continue
            rng = rng_for(*plan.entropy, REPLACEMENT_TAG, step)
            window = np.concatenate([window, window[replacement_picks(len(window), missing, rng)]])
        shuffle_step(plan, step, window)  # (in place: the order ``step_order`` gives)
        table = np.zeros((0, 3), np.int64)
        if spec.return_index:  # where each resident unit lies in the pool and in the dataset
            units = [plan.units[i] for i in range(plan.resident(step).start, end) if i in readable]
            placed = sorted((u.offset, u.num_rows, int(ds.row_offsets[u.partition]) + u.rows[0]) for u in units)
            table = np.array(placed, np.int64).reshape(-1, 3)
        readable.difference_update(range(step - plan.spread + 1, end - plan.spread + 1))  # drawn for the last time
        yield _Built(_Step(window, gatherer, table), min(skip, len(window)), statistics)
        skip -= min(skip, len(window))
        last = (step, window, table)
    if owed and last is not None:  # every unit after the last drawn step unreadable: its windows stand in
        # (their pool rows still hold them: an unreadable unit writes no row of the pool)
        step, window, table = last
        rng = rng_for(*plan.entropy, REPLACEMENT_TAG, step, 1)
        yield _Built(_Step(window[replacement_picks(len(window), owed, rng)], gatherer, table), 0, statistics)
    elif owed:
        raise SourceReadError(
            f"every partition of this reader's share left to read ({len({u.partition for u in plan.units})} partitions, "
            f"{len(plan.units)} units) was unreadable and skipped; it cannot yield its remaining "
            f"{owed} windows, so ranks would disagree on the batch count; fix the data or its access, or pass "
            "on_error='raise' to see the first error"
        )


def fill_threads(reads: ReadValues, plan: PoolPlan, burst: int) -> int:
    """Threads reading the pool's fill (its first ``burst + 1`` units): up to ``FILL_THREADS`` on a remote store,
    within ``POOL_FIRST_BYTES`` in flight; 1 on local files (decoded under the GIL) and without a burst."""
    if burst <= 0 or getattr(reads.source, "local", True):
        return 1
    units = PoolUnits.of(plan.units)
    fill = slice(plan.first_unit, plan.first_unit + burst + 1)
    held = (units.r1[fill] - units.r0[fill]) + (units.f1[fill] - units.f0[fill])  # rows a read holds at most
    in_flight = int(POOL_FIRST_BYTES // max(int(held.max(initial=0)) * reads.row_bytes, 1))
    return max(1, min(FILL_THREADS, in_flight, burst + 1))


class UnitReads:
    """A pass's pool arrays and the reads filling them, in plan order (``reader``: a ``Prefetcher``);
    what the next pass's read-ahead (``speedups.nextpass``) starts early and hands to the pass."""

    def __init__(self, values: PassValues, plan: PoolPlan, first_units: int | None = None) -> None:
        ds = values.reads
        self.plan = plan
        keys = range(plan.first_unit, len(plan.units))
        partitions = PoolUnits.of(plan.units).partition[plan.first_unit :]  # (A',) in reading order
        self.source_reader = ds.source.reader(partitions.tolist(), ds.columns)
        self.device = None if values.device is None else values.device.pool(plan)
        sample = values.normalize == "sample" and self.device is None  # (on the device: standardised there)
        self.pool = _Pool(ds, plan if self.device is None else self.device.staging, self.source_reader, sample)
        if first_units is not None:  # read ahead during another pass: counted in neither pass's figures
            self.pool.telemetry = None
        self.background = ds.spec.prefetch_partitions >= 1
        read = self.pool.read if self.device is None else self.device.landing(self.pool)
        # the first live units are read at once while the pool fills or several threads read (device: one)
        live = live_units(plan) - 1 if self.device is None else 0
        threads = fill_threads(ds, plan, live)
        self.burst = live if plan.first_step < plan.spread - 1 or threads > 1 else 0
        burst = self.burst if first_units is None else min(first_units, len(keys)) - 1
        self.reader = Prefetcher(
            read, keys, 1 if self.background else 0, name="dask-windows-pool", threads=threads, burst=burst
        )

    def widen(self) -> None:
        """Read the pass's whole burst (after a read-ahead of its first units only)."""
        self.reader.widen(self.burst)

    def partitions_read(self) -> list[int]:
        """Partitions of the units whose reads have begun."""
        return sorted({self.plan.units[i].partition for i in self.reader.keys[: self.reader.started]})

    def close(self) -> None:
        self.reader.close()
        self.source_reader.close()
        if self.device is not None:
            self.device.close()


def pool_batches(
    values: PassValues, plan: PoolPlan, progress: Any = None, this_pass: tuple | None = None
) -> Iterator[Any]:
    """The batches of a pool plan, each counted (``values.step(progress)``) before it is yielded.

    ``this_pass``: ``(epoch, reader's World)`` of a pass ``iter(ds)`` started, whose first units may
    have been read ahead and which reads the next pass's ahead once its last step is taken.
    """
    ds = values.reads
    ahead = values.next_pass if this_pass is not None else None
    claimed = ahead.claim(plan, this_pass) if ahead is not None else None
    reads: UnitReads = claimed if claimed is not None else UnitReads(values, plan)
    reads.pool.telemetry = ds.telemetry  # (the units still to read, when they were read ahead)
    reads.widen()
    pool = reads.pool
    gatherer = Gatherer(pool.x, pool.y, ds.spec.window, ds.spec.horizon, ds.spec.layout, codes=pool.codes)
    telemetry = ds.telemetry
    if telemetry is not None:
        telemetry.order = "pool"
    statistics = None if pool.table is None else WindowTable(pool.table, ds.spec.layout == "NCL")
    steps = _steps(ds, plan, timed_parts(telemetry, iter(reads.reader)), gatherer, statistics)  # (waits timed)
    if reads.device is not None:
        steps = reads.device.stage(steps)
    # (``prefetch_partitions=0``: the steps built on the consumer's thread)
    started: Any = Ahead(steps, 1, "dask-windows-build") if reads.background else steps
    last = None
    begun: list[Any] = []  # the next pass's read-ahead, once this pass's last step is taken
    if ahead is not None and this_pass is not None and ahead.wanted(reads, plan):
        epoch, world = this_pass
        last = lambda: begun.append(ahead.begin(epoch, world))
    try:
        batches = stream(
            plan.num_windows, started, ds.spec, timed_output(telemetry, values.output), values.normalize,
            waits=None if telemetry is None else telemetry.waits, allocator=values.allocator,
            device=values.device, last=last,
        )  # fmt: skip
        yield from values.counted(batches, progress)
    finally:
        if reads.background:  # an ``Ahead`` (not isinstance: no module globals at exit); a waiting builder wakes
            started.close(reads.reader.close)
        else:
            started.close()
        reads.close()
        for pending in begun:  # (no module globals here: this may run while the interpreter exits)
            try:
                if pending is not None:
                    pending.arm()  # the next pass's first units wait from now on (``next_pass_seconds``)
            except Exception:  # pragma: no cover - the interpreter is exiting
                pass
