"""From decoded pieces to batches: buffers built off the consumer's thread, then cut into batches.

``stream`` walks a reader's plan, buffer by buffer. With ``background=True``
the buffers are built on a builder thread (``prefetch.Ahead``, one buffer
ahead) while the consumer gathers batches from the previous one, so neither
the reads nor the building of a buffer (assembly, window starts,
permutation) run on the consumer's thread.

Assembly: the pieces of a buffer are copied, as each arrives, into one array
allocated for the whole buffer (its rows are known from the plan), and each
piece's own array is dropped at once: a buffer never coexists with a full
second copy of its pieces (a concatenation would hold both).

Permutation (``buffer.permute_head`` / ``permute_tail``): forward
Fisher-Yates steps fix the first ``HEAD`` positions, then the rest of the
buffer is shuffled. The first buffer is handed over after its head, and its
tail is shuffled on the builder thread while the consumer gathers the first
batches; later buffers are shuffled whole before they are handed over. The
order is the same either way: a function of the buffer's seed alone, so
batches are bit-for-bit the same per ``(seed, epoch)`` and a resume (the
plan's ``skip``) finds them where it expects.

The trade-off: one buffer built ahead means two buffers in memory (the one
being drained and the next), which is what keeps the reads going while
batches are gathered; see docs/memory.md for the formula. A batch may take
its first windows from one buffer and the rest from the next, so only the
plan's final batch can be partial. A partition skipped as unreadable arrives
as ``None``; its windows are replaced as ``faults`` describes, so the batch
count never changes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from dask_windows.batch import OutputPool, normalize_per_sample
from dask_windows.buffer import Buffer, Part, permute_head, permute_tail, permute_windows, piece_rows
from dask_windows.errors import SourceReadError
from dask_windows.faults import REPLACEMENT_TAG
from dask_windows.index import WindowGrid
from dask_windows.memory import trim
from dask_windows.plan import EpochPlan, Segment, rng_for
from dask_windows.prefetch import Ahead
from dask_windows.spec import WindowSpec

__all__ = ["Assembly", "stream", "unit_places"]

_TRIM_BYTES = 8 << 20  # buffers at least this large hand their memory back when dropped


@dataclass
class _Built:
    """A buffer ready to drain: windows ``[0, head)`` are in their final order; the rest once
    ``shuffled`` is set (``None``: all of them already)."""

    buffer: Buffer
    skip: int
    head: int
    shuffled: threading.Event | None = None
    failure: list[BaseException] = field(default_factory=list)

    def wait(self, upto: int) -> None:
        """Block until windows ``[0, upto)`` are in their final order."""
        if self.shuffled is None or upto <= self.head:
            return
        self.shuffled.wait()
        self.shuffled = None
        if self.failure:
            raise self.failure[0]


class Assembly:
    """The arrays of the buffers being read, allocated when the first of their pieces is decoded.

    Reader threads decode each piece straight into its place (``places``); the builder then takes
    the buffer's arrays (``take``) and nothing is copied again. ``np.empty`` touches no page, so a
    buffer's memory grows as its pieces arrive.

    Args:
        plan: The reader's plan.
        grid: The dataset's window grid.
        spec: Window settings.
        y_dtype: The dataset's target dtype (``None``: no place for targets, they are copied).
    """

    def __init__(self, plan: EpochPlan, grid: WindowGrid, spec: WindowSpec, y_dtype: type | None) -> None:
        self._spec = spec
        self._y_dtype = y_dtype
        self._offsets = [
            np.cumsum([0, *(b - a for a, b in (piece_rows(grid, seg, spec.span) for seg in group))]).tolist()
            for group in plan.buffers
        ]  # per buffer: (segments+1,) buffer row where each piece goes
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._taken: set[int] = set()
        self._lock = threading.Lock()

    def places(self, buffer: int, first: int, count: int) -> list[tuple[np.ndarray, np.ndarray | None]] | None:
        """``(x, y)`` views where segments ``first .. first+count-1`` of buffer ``buffer`` go."""
        offsets = self._offsets[buffer]
        if len(offsets) <= 2:  # a buffer of one piece is that piece's own array
            return None
        with self._lock:
            if buffer in self._taken:
                return None
            if buffer not in self._arrays:
                rows, channels = offsets[-1], len(self._spec.features)
                ncl = self._spec.layout == "NCL"
                x = np.empty((channels, rows) if ncl else (rows, channels), np.float32)
                y = (
                    np.empty((len(self._spec.targets), rows), self._y_dtype)
                    if self._spec.targets and self._y_dtype
                    else None
                )
                self._arrays[buffer] = (x, y)
            x, y = self._arrays[buffer]
        out = []
        for k in range(first, first + count):
            a, b = offsets[k], offsets[k + 1]
            xs = x[:, a:b] if self._spec.layout == "NCL" else x[a:b]
            out.append((xs, None if y is None else y[:, a:b]))
        return out

    def take(self, buffer: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The arrays of ``buffer`` (``None`` if no piece was placed); forgotten here."""
        with self._lock:
            self._taken.add(buffer)
            return self._arrays.pop(buffer, None)


def unit_places(plan: EpochPlan) -> list[tuple[int, int]]:
    """``(buffer, first segment)`` of each reading unit of ``buffer.piece_units(plan)``, in order."""
    places = []
    for b, group in enumerate(plan.buffers):
        k = 0
        while k < len(group):
            places.append((b, k))
            j = k + 1
            while j < len(group) and group[j].partition == group[k].partition:
                j += 1
            k = j
    return places


def _assemble(
    segments: tuple[Segment, ...],
    parts: Iterator[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    arrays: Callable[[], tuple[np.ndarray, np.ndarray | None] | None] | None = None,
) -> tuple[Buffer | None, int]:
    """Take the group's pieces from ``parts`` and build its buffer; also the windows lost to skips.

    ``arrays`` gives the buffer's arrays where readers decoded the pieces in place (``Assembly``);
    pieces found elsewhere are copied into place.
    """
    axis = 1 if spec.layout == "NCL" else 0
    sizes = [b - a for a, b in (piece_rows(grid, seg, spec.span) for seg in segments)]
    offsets = np.cumsum([0, *sizes])  # (segments+1,) buffer row where each piece goes
    placed = None
    if arrays is not None:  # pieces decoded in place: take them all, then the arrays they sit in
        parts = iter([next(parts) for _ in segments])
        placed = arrays()
    x, y = placed if placed is not None else (None, None)
    exact = len(segments) > 1  # a piece's rows as the plan says: copied into place
    kept: list[tuple[Part, Segment]] = []
    kept_offsets: list[int] = []
    lost = 0
    for seg, at, rows in zip(segments, offsets.tolist(), sizes):
        part = next(parts)  # one at a time: a piece copied into place is dropped before the next
        if part is None:
            lost += seg.num_windows
            continue
        if (
            exact
            and part.x.shape[axis] == rows
            and (x is None or part.x.dtype == x.dtype)
            and (y is None or part.y is None or part.y.dtype == y.dtype)
        ):
            if x is None:
                shape = list(part.x.shape)
                shape[axis] = int(offsets[-1])
                x = np.empty(shape, part.x.dtype)
            if y is None and part.y is not None:
                y = np.empty((part.y.shape[0], int(offsets[-1])), part.y.dtype)
            if part.x.base is not x:  # not decoded in place: copy it there, drop its own array
                dest = x[:, at : at + rows] if axis == 1 else x[at : at + rows]
                dest[...] = part.x
                part.x = dest
            if y is not None and part.y is not None and part.y.base is not y:
                y[:, at : at + rows] = part.y
                part.y = y[:, at : at + rows]
        else:
            exact = False  # another size or dtype than planned: concatenate instead
        kept.append((part, seg))
        kept_offsets.append(at)
    if not kept:
        return None, lost
    pieces, segs = [p for p, _ in kept], tuple(s for _, s in kept)
    if exact and x is not None and (y is None) == (not spec.targets):
        assembled = (x, y, np.array([*kept_offsets, int(offsets[-1])], np.int64))
        return Buffer(pieces, segs, grid, row_offsets, spec, scale, assembled=assembled), lost
    return Buffer(pieces, segs, grid, row_offsets, spec, scale), lost


def _dtype(values: np.ndarray | None) -> object:
    return None if values is None else values.dtype


def _builds(
    plan: EpochPlan,
    parts: Iterator[Part | None],
    grid: WindowGrid,
    row_offsets: np.ndarray,
    spec: WindowSpec,
    scale: tuple[np.ndarray, np.ndarray] | None,
    reread: Callable[[Segment], Part | None] | None,
    lazy: bool,
    assembly: Assembly | None = None,
) -> Generator[_Built, None, None]:
    """The plan's buffers, replacements added and permuted; the first one lazily when ``lazy``."""
    skip = plan.skip
    owed = 0  # windows of skipped partitions not yet replaced
    remaining = plan.num_windows  # windows the consumer has still to drain after the buffers built so far
    first = True
    for b, (segments, entropy) in enumerate(zip(plan.buffers, plan.buffer_seeds)):
        arrays = None if assembly is None else functools.partial(assembly.take, b)
        buffer, lost = _assemble(segments, parts, grid, row_offsets, spec, scale, arrays)
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
        yield built
        if built.shuffled is not None:  # resumed once the consumer holds the first buffer
            try:
                permute_tail(built.buffer.starts, rng, built.head)
            except BaseException as exc:  # pragma: no cover - relayed to the consumer's wait
                built.failure.append(exc)
            finally:
                built.shuffled.set()
        del built  # the consumer alone holds the buffer now
        first = False
        skip = 0
    if owed and remaining > 0:
        yield _last_buffer(plan, min(owed, remaining), grid, row_offsets, spec, scale, reread)


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
            f"every partition of this reader's share ({len(every)} partitions) was unreadable and skipped; "
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
    emit: Callable[[np.ndarray, np.ndarray | None, np.ndarray | None], object],
    normalize: tuple[np.ndarray, np.ndarray] | str | None = None,
    reread: Callable[[Segment], Part | None] | None = None,
    background: bool = False,
    interrupt: Callable[[], None] | None = None,
    assembly: Assembly | None = None,
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
            ``None`` unless ``spec.return_index``).
        normalize: ``(mean, std)`` per feature, ``"sample"`` (per window and channel) or ``None``.
        reread: Reads a segment's piece again (``None`` if unreadable), for windows still owed at the
            end because every piece of the last buffers was skipped.
        background: Build buffers on a builder thread, one buffer ahead of the consumer.
        interrupt: Stops whatever ``parts`` reads from (the prefetcher's ``close``), so that a builder
            thread waiting for a piece wakes up when the stream is closed early.
        assembly: Where the readers decode pieces in place (``None``: the builder copies them).
    """
    scale = normalize if isinstance(normalize, tuple) else None
    builds = _builds(plan, iter(parts), grid, row_offsets, spec, scale, reread, background, assembly)
    source: Iterator[_Built] = Ahead(builds, 1, "dask-windows-build") if background else builds
    batch = spec.batch_size
    remaining = plan.num_windows
    carry: list[tuple] = []  # pieces of a batch begun in the previous buffer
    carried = 0
    pool = OutputPool()  # full batches' feature arrays, reused once no caller holds them
    try:
        for built in source:
            buffer, pos, total = built.buffer, built.skip, len(built.buffer.starts)
            while pos < total and remaining > 0:
                take = min(batch - carried, total - pos, remaining)
                built.wait(pos + take)
                starts = buffer.starts[pos : pos + take]
                x = buffer.gatherer.features(starts, pool if take == batch else None)
                y = buffer.gatherer.targets(starts) if spec.targets else None
                rows = buffer.global_rows(starts) if spec.return_index else None  # only yielded with the index
                pos += take
                remaining -= take
                if carried or (take < batch and remaining > 0):
                    carry.append((x, y, rows))
                    carried += take
                    if carried < batch and remaining > 0:
                        continue
                    x = np.concatenate([c[0] for c in carry])
                    y = np.concatenate([c[1] for c in carry]) if spec.targets else None
                    rows = np.concatenate([c[2] for c in carry]) if spec.return_index else None
                    carry, carried = [], 0
                if normalize == "sample":
                    normalize_per_sample(x, spec.layout == "NCL")
                yield emit(x, y, rows)
            built.wait(total)  # the tail's shuffle is done before the buffer is dropped
            large = buffer.nbytes >= _TRIM_BYTES
            del buffer, built  # drop the buffer before the next one is taken
            if large:
                trim()
    finally:
        if isinstance(source, Ahead):
            source.close(interrupt)
        else:
            builds.close()
