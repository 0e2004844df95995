"""From decoded pieces to batches: buffers built off the consumer's thread, then cut into batches.

``stream`` walks a reader's plan, buffer by buffer. With ``background=True``
the buffers are built on a builder thread (``prefetch.Ahead``, one buffer
ahead) while the consumer gathers batches from the previous one, so neither
the reads nor the building of a buffer (assembly, window starts,
permutation) run on the consumer's thread.

Assembly: the reader threads decode each buffer's pieces straight into one
array allocated for the whole buffer (``reading.BufferArena``), so a buffer
never coexists with a second copy of its pieces; the builder releases the
arena's reference once it holds the buffer. While the readers read, the
builder lists the buffer's window starts from where the pieces will land
(``prepare``, ``buffer.plan_starts``), so the first batch waits for the reads
and the head of the permutation only.

Permutation (``buffer.permute_head`` / ``permute_tail``): forward
Fisher-Yates steps fix the first ``HEAD`` positions, then the rest of the
buffer is shuffled. The first buffer is handed over after its head, and its
tail is shuffled on the builder thread while the consumer gathers the first
batches; later buffers are shuffled whole before they are handed over. The
order is the same either way: a function of the buffer's seed alone, so
batches are bit-for-bit the same per ``(seed, epoch)`` and a resume (the
plan's ``skip``) finds them where it expects.

``normalize="sample"`` (``_per_sample``): where windows overlap, each buffer
gets a table of its windows' statistics (``window_table``), built before the
buffer is handed over, or for the first buffer after its tail's shuffle; the
positions from ``_table_from`` on use it, the earlier ones (which the first
buffer's consumer drains while its table is built) are standardised batch by
batch, the same positions in every buffer whatever the timing.

The trade-off: one buffer built ahead means two buffers in memory (the one
being drained and the next), which is what keeps the reads going while
batches are gathered; see docs/memory.md for the formula. A batch may take
its first windows from one buffer and the rest from the next, so only the
plan's final batch can be partial. A partition skipped as unreadable arrives
as ``None``; its windows are replaced as ``faults`` describes, so the batch
count never changes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.random  # (numpy 2 loads it on first use: 0.05-0.14 s of extension modules in the first plan)

from dask_windows.errors import SourceReadError
from dask_windows.faults import REPLACEMENT_TAG
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.plan import EpochPlan, Segment, rng_for
from dask_windows.runtime.batch import OutputPool, normalize_per_sample
from dask_windows.runtime.buffer import HEAD, Buffer, Part, PlannedStarts, permute_head, permute_tail, permute_windows
from dask_windows.runtime.memory import trim
from dask_windows.runtime.prefetch import Ahead
from dask_windows.spec import WindowSpec
from dask_windows.tuning import TRIM_BYTES as _TRIM_BYTES

__all__ = ["start_builder", "stream"]


@dataclass
class _Built:
    """A buffer ready to drain: windows ``[0, head)`` are in their final order; the rest once
    ``shuffled`` is set (``None``: all of them already)."""

    buffer: Buffer
    skip: int
    head: int
    shuffled: threading.Event | None = None
    failure: list[BaseException] = field(default_factory=list)
    table: Any = None  # window statistics (``window_table.WindowTable``), once ``tabled`` is set
    table_from: int = sys.maxsize  # the first position whose windows use ``table`` (if it has one)
    tabled: threading.Event | None = None  # set once ``table`` is built (``None``: it is, or never will be)
    device: Any = None  # its rows on the training device (``ondevice.DeviceFeed``), once sent

    def wait(self, upto: int) -> None:
        """Block until windows ``[0, upto)`` are in their final order."""
        if self.shuffled is None or upto <= self.head:
            return
        self.shuffled.wait()
        self.shuffled = None
        if self.failure:
            raise self.failure[0]

    def wait_table(self) -> None:
        """Block until ``table`` is built (or known not to be)."""
        if self.tabled is None:
            return
        self.tabled.wait()
        self.tabled = None
        if self.failure:
            raise self.failure[0]


def _assemble(
    segments: tuple[Segment, ...],
    parts: Iterator[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    planned: PlannedStarts | None = None,
) -> tuple[Buffer | None, int]:
    """Take the group's pieces from ``parts`` and build its buffer; also the windows lost to skips.

    Pieces decoded into their buffer's one array (``reading.BufferArena``) are used in place;
    others are joined by ``Buffer``. ``planned``: the starts listed before the pieces arrived.
    """
    loaded = [next(parts) for _ in segments]
    kept = [(part, seg) for part, seg in zip(loaded, segments) if part is not None]
    lost = sum(seg.num_windows for part, seg in zip(loaded, segments) if part is None)
    del loaded
    if not kept:
        return None, lost
    return Buffer([p for p, _ in kept], tuple(s for _, s in kept), grid, row_offsets, spec, scale, planned), lost


def _builds(
    plan: EpochPlan,
    parts: Iterator[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    reread: Callable[[Segment], Part | None] | None,
    lazy: bool,
    release: Callable[[int], None] | None = None,
    prepare: Callable[[int], PlannedStarts | None] | None = None,
    tables: bool = False,
) -> Generator[_Built, None, None]:
    """The plan's buffers, replacements added and permuted; the first one lazily when ``lazy``.

    ``prepare(b)`` lists buffer ``b``'s window starts before its pieces are taken: on the builder
    thread, while the readers read them. ``tables``: each buffer's window statistics for
    ``normalize="sample"`` (``_add_table``), the first buffer's after its head is handed over.
    """
    skip = plan.skip
    owed = 0  # windows of skipped partitions not yet replaced
    remaining = plan.num_windows  # windows the consumer has still to drain after the buffers built so far
    first = True
    for b, (segments, entropy) in enumerate(zip(plan.buffers, plan.buffer_seeds)):
        planned = prepare(b) if prepare is not None else None
        buffer, lost = _assemble(segments, parts, grid, row_offsets, spec, scale, planned)
        del planned
        if release is not None:
            release(b)  # the readers' arrays of this buffer are held by its parts only
        if buffer is None:  # nothing of this buffer could be read: the next readable buffer stands in
            owed += lost - skip
            skip = 0
            continue
        if lost or owed:
            buffer.replace(lost + owed, rng_for(*entropy, REPLACEMENT_TAG))
            owed = 0
        if not spec.shuffle:
            built = _Built(buffer, skip, len(buffer.starts))
        elif lazy and first:
            rng = rng_for(*entropy)
            built = _Built(buffer, skip, permute_head(buffer.starts, rng), threading.Event())
        else:
            permute_windows(buffer.starts, rng_for(*entropy))
            built = _Built(buffer, skip, len(buffer.starts))
        del buffer
        remaining -= min(remaining, len(built.buffer.starts) - skip)
        if tables:  # before the consumer sees it: a position's way never depends on timing
            built.table_from = _table_from(len(built.buffer.starts))
            if built.shuffled is None:
                _add_table(built, spec)
            else:
                built.tabled = threading.Event()
        yield built
        if built.shuffled is not None:  # resumed once the consumer holds the first buffer
            try:
                permute_tail(built.buffer.starts, rng, built.head)
            except BaseException as exc:  # pragma: no cover - relayed to the consumer's wait
                built.failure.append(exc)
            finally:
                built.shuffled.set()
            if built.tabled is not None:  # while the consumer drains the positions before the table's
                try:
                    if not built.failure:
                        _add_table(built, spec)
                except BaseException as exc:  # pragma: no cover - relayed to the consumer's wait_table
                    built.failure.append(exc)
                finally:
                    built.tabled.set()
        if lazy and first:  # small pages on the way to the first batch (reading.small_pages); now huge ones
            built.buffer.gatherer.settle_pages(len(built.buffer.starts))
        del built  # the consumer alone holds the buffer now
        first = False
        skip = 0
    if owed and remaining > 0:
        yield _last_buffer(plan, min(owed, remaining), grid, row_offsets, spec, scale, reread)


def start_builder(
    plan: EpochPlan,
    parts: Iterable[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    normalize: tuple[np.ndarray, np.ndarray] | str | None = None,
    reread: Callable[[Segment], Part | None] | None = None,
    release: Callable[[int], None] | None = None,
    prepare: Callable[[int], PlannedStarts | None] | None = None,
    device: Any = None,
) -> Ahead:
    """The builder thread of ``stream(..., background=True)``, started now: it builds the plan's first
    buffer and waits for a consumer (``stream(..., started=...)``). Arguments as ``stream``'s."""
    scale = normalize if isinstance(normalize, tuple) else None
    tables = normalize == "sample" and device is None
    builds = _builds(plan, iter(parts), grid, row_offsets, spec, scale, reread, True, release, prepare, tables)
    return Ahead(builds if device is None else device.stage(builds))


def _table_from(windows: int) -> int:
    """The first position of a buffer of ``windows`` windows served by its table.

    ``HEAD`` at least, and a 32nd of the buffer: the first buffer's table is built on the builder
    thread while the consumer standardises those windows batch by batch (about the time the table
    takes: 50 ns a window against 1.5 µs), so the consumer seldom waits long for it; later
    buffers' tables are built ahead.
    """
    return max(HEAD, windows // 32)


def _add_table(built: _Built, spec: WindowSpec) -> None:
    """Give ``built`` its window statistics (``window_table``) where they repay their cost.

    The table serves positions from ``built.table_from`` on in every buffer (``_table_from``), so
    a window's values depend on its position alone, not on which buffer a stream begins or
    resumes with or on the threads' timing; buffers of at most ``HEAD`` windows have none.
    """
    from dask_windows.runtime.window_table import WindowTable, build_table, worth_building

    buffer = built.buffer
    x = buffer.gatherer.source
    channel_major = spec.layout == "NCL"
    rows = x.shape[1] if channel_major else x.shape[0]
    if len(buffer.starts) > built.table_from and worth_building(len(buffer.starts), rows, spec.window):
        table = WindowTable(build_table(x, spec.window, channel_major), channel_major)
        buffer.nbytes += table.nbytes
        built.table = table


def _per_sample(x: np.ndarray, starts: np.ndarray, at: int, built: _Built, channel_major: bool) -> None:
    """Standardise the batch of windows at buffer positions ``[at, at + len(x))`` in place, per window.

    From ``built.table_from`` on with the buffer's table, before it (or without a table) from the
    windows' values (``normalize_per_sample``): which one depends on the position alone.
    """
    split = built.table_from - at  # windows of the batch before the table's first position
    if split >= len(x):
        normalize_per_sample(x, channel_major)
        return
    built.wait_table()
    table = built.table
    if table is None:  # not worth building for this buffer
        normalize_per_sample(x, channel_major)
        return
    if split > 0:
        normalize_per_sample(x[:split], channel_major)
    split = max(split, 0)
    table.apply(x[split:], starts[split:])


def _last_buffer(
    plan: EpochPlan,
    owed: int,
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    reread: Callable[[Segment], Part | None] | None,
) -> _Built:
    """Windows still owed because every piece of the last buffers was skipped: from a piece read again."""
    every = [seg for group in plan.buffers for seg in group]
    for seg in reversed(every):
        part = reread(seg) if reread is not None else None
        if part is not None:
            break
    else:
        raise SourceReadError(
            f"every partition of this reader's share ({len({seg.partition for seg in every})} partitions, "
            f"{len(every)} pieces) was unreadable and skipped; "
            f"it cannot yield its remaining {owed} windows, so ranks would disagree on the batch count; "
            "fix the data or its access, or pass on_error='raise' to see the first error"
        )
    buffer = Buffer([part], (seg,), grid, row_offsets, spec, scale)
    buffer.replace(owed, rng_for(*plan.buffer_seeds[-1], REPLACEMENT_TAG, 1), keep=False)
    return _Built(buffer, 0, len(buffer.starts))


def stream(
    plan: EpochPlan,
    parts: Iterable[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    emit: Callable[..., object],
    normalize: tuple[np.ndarray, np.ndarray] | str | None = None,
    reread: Callable[[Segment], Part | None] | None = None,
    background: bool = False,
    interrupt: Callable[[], None] | None = None,
    release: Callable[[int], None] | None = None,
    prepare: Callable[[int], PlannedStarts | None] | None = None,
    started: Ahead | None = None,
    last: Callable[[], None] | None = None,
    device: Any = None,
    waits: Callable[[Iterator[_Built], str], Iterator[_Built]] | None = None,
    allocator: Callable[[], Any] | None = None,
) -> Iterator[object]:
    """Yield ``emit(x, y, rows)`` for each batch of ``plan``.

    Args:
        plan: The reader's epoch plan.
        parts: Decoded pieces, one per segment in ``plan.segments`` order (typically a
            ``Prefetcher``); ``None`` for a piece that was skipped as unreadable (see ``faults``).
        grid: The dataset's window grid.
        row_offsets: ``(P,)`` global row of each partition's first row.
        spec: Window settings.
        emit: Wraps one batch's numpy arrays (features, targets or ``None``, global start rows or
            ``None`` unless ``spec.return_index``); with ``spec.code_features``, a fourth: the
            ``(B, K, L)`` codes (``spec.code_dtype``), the features then being the other ``C - K`` channels.
        normalize: ``(mean, std)`` per feature, ``"sample"`` (per window and channel) or ``None``.
        reread: Reads a segment's piece again (``None`` if unreadable), for windows still owed at the
            end because every piece of the last buffers was skipped.
        background: Build buffers on a builder thread, one buffer ahead of the consumer.
        interrupt: Stops whatever ``parts`` reads from (the prefetcher's ``close``), so that a builder
            thread waiting for a piece wakes up when the stream is closed early.
        release: Called with a buffer's number once its pieces are taken (the readers' arena).
        prepare: Lists a buffer's window starts from where its pieces will be decoded, before they
            are (``reading.BufferArena.planned_starts``); ``None``: ``Buffer`` lists them.
        started: The builder thread of this very plan, already started (``start_builder``, the next
            pass read ahead: ``nextpass``); ``parts``, ``reread``, ``release`` and ``prepare`` are then
            those it was started with and are not used here.
        last: Called once, on the consumer's thread, when it takes the buffer holding the plan's
            final windows (the builder and the readers have nothing left to do then).
        waits: Wraps the buffers' iterator to time the consumer's waits for them (``telemetry``).
        allocator: Makes the pool full batches' features are gathered into (the allocator seam,
            ``seams``: shared slots in a DataLoader worker); ``None``: a plain ``batch.OutputPool``.
        device: An ``ondevice.DeviceFeed``: each buffer's rows are sent to its device as the buffer
            is built, and the batches are gathered there (the same windows in the same order);
            ``emit`` is then not used.
    """
    scale = normalize if isinstance(normalize, tuple) else None
    builds, ahead, staged = None, started, None
    if started is None:
        tables = normalize == "sample" and device is None  # on the device each batch is standardised there
        builds = _builds(
            plan, iter(parts), grid, row_offsets, spec, scale, reread, background, release, prepare, tables
        )
        staged = builds if device is None else device.stage(builds)  # rows sent on the builder thread
        ahead = Ahead(staged, 1, "dask-windows-build") if background else None
    source: Iterator[_Built] = ahead if ahead is not None else staged  # type: ignore[assignment]
    if waits is not None:
        source = waits(source, "buffer_wait_ns")
    batch = spec.batch_size
    remaining = plan.num_windows
    carry: list[tuple] = []  # pieces of a batch begun in the previous buffer
    carried = 0
    # Full batches' feature arrays, reused once no caller holds them (the allocator seam: ``seams``).
    pool: Any = allocator() if allocator is not None else OutputPool()
    per_sample, channel_major = normalize == "sample", spec.layout == "NCL"
    want_y, want_rows = bool(spec.targets), spec.return_index
    coded = spec.code_features > 0  # ``emit(x, y, rows, codes)``: the codes gathered on their own (Gatherer.codes_at)
    try:
        if device is not None:  # cut on the training device from each buffer's rows (ondevice)
            yield from device.batches(source, plan.num_windows, last)
            return
        for built in source:
            buffer, pos, total = built.buffer, built.skip, len(built.buffer.starts)
            if last is not None and remaining <= total - pos:  # the plan's last buffer: readers idle from now
                last()
                last = None
            while pos < total and remaining > 0:
                if not carried and min(total - pos, remaining) >= batch:
                    # A run of full batches: the gather and the checks chosen once for the run.
                    k = min(total - pos, remaining) // batch
                    if built.shuffled is not None and pos < built.head:
                        k = max(1, min(k, (built.head - pos) // batch))  # the first batches need not wait
                    built.wait(pos + k * batch)
                    run = buffer.starts[pos : pos + k * batch]
                    at = pos  # the run's first position, for the per-window statistics
                    pos += k * batch
                    remaining -= k * batch
                    if not (want_y or want_rows or per_sample or coded):  # features only: one generator for the run
                        batches = buffer.gatherer.gather_run(run, batch, pool)
                        try:
                            for x in batches:
                                yield emit(x, None, None)
                        finally:
                            batches.close()  # its lane thread (``lanes``) ends with the run, however it ends
                        del x, run, batches  # (as below)
                        continue
                    gather = buffer.gatherer.gather_for(batch, pool)
                    for a in range(0, k * batch, batch):
                        starts = run[a : a + batch]
                        x = gather(starts)
                        y = buffer.gatherer.targets(starts) if want_y else None
                        rows = buffer.global_rows(starts) if want_rows else None
                        if per_sample:
                            _per_sample(x, starts, at + a, built, channel_major)
                        yield emit(x, y, rows, buffer.gatherer.codes_at(starts)) if coded else emit(x, y, rows)
                    # The pool may reuse x's array once the caller drops the batch; the run and the
                    # bound gather hold this buffer's arrays, which must go before the next is built.
                    del x, run, gather
                    continue
                take = min(batch - carried, total - pos, remaining)
                built.wait(pos + take)
                starts = buffer.starts[pos : pos + take]
                x = buffer.gatherer.features(starts, pool if take == batch else None)
                y = buffer.gatherer.targets(starts) if spec.targets else None
                rows = buffer.global_rows(starts) if spec.return_index else None  # only yielded with the index
                codes = buffer.gatherer.codes_at(starts) if coded else None
                pos += take
                remaining -= take
                if carried or (take < batch and remaining > 0):
                    carry.append((x, y, rows, codes))
                    carried += take
                    if carried < batch and remaining > 0:
                        continue
                    x = np.concatenate([c[0] for c in carry])
                    y = np.concatenate([c[1] for c in carry]) if spec.targets else None
                    rows = np.concatenate([c[2] for c in carry]) if spec.return_index else None
                    codes = np.concatenate([c[3] for c in carry]) if coded else None
                    carry, carried = [], 0
                if normalize == "sample":
                    normalize_per_sample(x, spec.layout == "NCL")
                yield emit(x, y, rows, codes) if coded else emit(x, y, rows)
            built.wait(total)  # the tail's shuffle is done before the buffer is dropped
            large = buffer.nbytes >= _TRIM_BYTES
            del buffer, built  # drop the buffer before the next one is taken
            if large:
                trim()
    finally:  # (no module globals here: this may run while the interpreter exits)
        if ahead is not None:
            ahead.close(interrupt)
        elif builds is not None:
            if staged is not builds and staged is not None:
                staged.close()
            builds.close()
