"""How a pass over a ``WindowDataset`` reads: the prefetch thread or the ``read_workers`` pool.

Moved out of ``dataset`` unchanged: ``plan`` is a reader's plan of an epoch; ``batches`` connects a reader's plan to the
``Prefetcher`` (one background thread) or to a ``ReadPool`` (``read_workers``
processes) and to ``buffer.stream``; ``read_unit`` and ``read_part`` read and
decode one partition's pieces, recording unreadable ones with
``on_error="skip"``. Each function takes the dataset whose pass it serves.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import get_worker_info

from dask_windows.buffer import Part, decode, piece_rows, piece_units, unit_rows
from dask_windows.errors import SourceReadError
from dask_windows.faults import SkippedPartition, record_skip, skip_allowed
from dask_windows.pipeline import Assembly, stream, unit_places
from dask_windows.plan import plan_reader
from dask_windows.prefetch import Prefetcher
from dask_windows.readpool import ReadPool
from dask_windows.sources import PartitionReader
from dask_windows.world import World

if TYPE_CHECKING:
    from dask_windows.dataset import WindowDataset

__all__ = ["READ_THREADS", "batches", "plan", "pool_workers", "read_part", "read_unit"]

READ_THREADS = 2  # pieces read at once by the prefetcher (Parquet files and object stores)


def batches(ds: WindowDataset, plan: Any, progress: Any = None) -> Iterator[Any]:
    """The batches of ``plan``, read ahead on the prefetch thread or by the ``read_workers`` pool.

    Args:
        ds: The dataset being iterated.
        plan: This reader's plan (``WindowDataset._plan``).
        progress: This pass's resume counter, or ``None``.

    Yields:
        The batches, each counted by the dataset's resumer before it is yielded.
    """
    units = piece_units(plan)  # a buffer's pieces of one partition are read together
    source_reader = ds.source.reader([unit[0].partition for unit in units], list(ds.spec.columns))
    # Read ahead about prefetch_partitions partitions' worth of pieces.
    ahead = ds.spec.prefetch_partitions * ds.spec.pieces_per_partition * len(units)
    depth = -(-ahead // max(len(plan.segments), 1))
    reader: Prefetcher | _PoolParts
    background = False  # buffers built on a builder thread (see pipeline)
    assembly: Assembly | None = None
    if pool_workers(ds):
        pool = ReadPool(functools.partial(_read_in_pool, ds), units, pool_workers(ds), max(depth, 1))
        reader = _PoolParts(pool, ds.skipped)
    else:
        threads = READ_THREADS if ds.source.reads_in_processes else 1  # file/object-store reads release the GIL
        background = depth > 0
        depth = max(depth, threads) if depth else 0
        if background:  # pieces decoded straight into their buffer's arrays
            assembly = Assembly(plan, ds.grid, ds.spec, getattr(ds, "_y_dtype", None))
            places = unit_places(plan)

            def read(i: int) -> list[Part | None]:
                out = assembly.places(places[i][0], places[i][1], len(units[i])) if assembly else None
                return read_unit(ds, units[i], source_reader, out)

            reader = Prefetcher(read, range(len(units)), depth, threads=threads)
        else:
            reader = Prefetcher(lambda unit: read_unit(ds, unit, source_reader), units, depth)
    parts = (part for unit_parts in reader for part in unit_parts)

    def reread(seg: Any) -> Part | None:
        return read_part(ds, seg, PartitionReader(ds.source, [seg.partition], list(ds.spec.columns)))

    try:
        batches = stream(
            plan, parts, ds.grid, ds.row_offsets, ds.spec, ds._emit, ds._per_batch_normalize(), reread,
            background=background, interrupt=reader.close, assembly=assembly,
        )  # fmt: skip
        for batch in batches:
            ds._resumer.step(progress)  # counted before the consumer gets it: a state then includes it
            yield batch
    finally:
        if progress is not None:
            ds._resumer.end(progress)
        reader.close()
        source_reader.close()


def plan(ds: WindowDataset, world: World, skip_batches: int = 0, epoch: int | None = None) -> Any:
    """The plan of ``world``'s reader for ``epoch`` (default: the dataset's), after ``skip_batches``."""
    s = ds.spec
    return plan_reader(
        ds.grid.windows_per_partition,
        world,
        seed=s.seed,
        epoch=ds.epoch if epoch is None else epoch,
        shuffle=s.shuffle,
        batch_size=s.batch_size,
        drop_last=s.drop_last,
        buffer_partitions=s.buffer_partitions,
        skip_batches=skip_batches,
        pieces_per_partition=s.pieces_per_partition,
        min_piece_windows=-(-s.span // s.stride),  # a piece's halo is at most as long as its rows
    )


def pool_workers(ds: WindowDataset) -> int:
    """Processes that read and decode for this pass (0: the prefetch thread does)."""
    if not ds.read_workers or not ds.source.reads_in_processes:
        return 0
    if get_worker_info() is not None:  # a DataLoader worker is daemonic: it cannot start processes
        warnings.warn(
            f"read_workers={ds.read_workers} is ignored inside DataLoader workers; use either "
            "read_workers (workers decode, this process gathers) or DataLoader(num_workers=...)",
            RuntimeWarning,
            stacklevel=3,
        )
        return 0
    return ds.read_workers


def read_part(ds: WindowDataset, segment: Any, reader: PartitionReader) -> Part | None:
    """Read and decode a segment's piece; ``None`` when it is unreadable and ``on_error="skip"``."""
    index = segment.partition
    name = ds.source.partitions[index].name
    r0, r1 = piece_rows(ds.grid, segment, ds.spec.span)
    try:
        columns = reader.read_rows(index, r0, r1)
    except SourceReadError as exc:
        if not skip_allowed(ds.on_error, exc):
            raise
        record_skip(ds.skipped, name, "read", exc)
        return None
    return decode(index, name, columns, ds.spec, ds._scale(), r0, getattr(ds, "_y_dtype", None))


def read_unit(ds: WindowDataset, unit: tuple, reader: PartitionReader, out: list | None = None) -> list[Part | None]:
    """Read one partition's pieces of a buffer in one call and decode each (into ``out``'s ``(x, y)``
    arrays when given); ``None``s when unreadable."""
    index = unit[0].partition
    name = ds.source.partitions[index].name
    rows = unit_rows(ds.grid, unit, ds.spec.span)
    try:
        pieces = reader.read_ranges(index, [(int(a), int(b)) for a, b in rows])
    except SourceReadError as exc:
        if not skip_allowed(ds.on_error, exc):
            raise
        record_skip(ds.skipped, name, "read", exc)
        return [None] * len(unit)
    scale = ds._scale()
    y_dtype = getattr(ds, "_y_dtype", None)
    places = out if out is not None else [None] * len(unit)
    return [
        decode(index, name, columns, ds.spec, scale, int(r0), y_dtype, place)
        for columns, (r0, _), place in zip(pieces, rows, places)
    ]


def _read_in_pool(ds: WindowDataset, unit: tuple) -> tuple[list[Part | None], list[SkippedPartition]]:
    """Read and decode one partition's pieces in a ReadPool worker; its skip records travel back."""
    before = len(ds.skipped)
    parts = read_unit(ds, unit, PartitionReader(ds.source, [unit[0].partition], list(ds.spec.columns)))
    return parts, ds.skipped[before:]


class _PoolParts:
    """A ReadPool's decoded pieces, with the workers' skip records added to this dataset's."""

    def __init__(self, pool: ReadPool, skipped: list) -> None:
        self.pool = pool
        self.skipped = skipped

    def __iter__(self) -> Iterator[list[Part | None]]:
        return self

    def __next__(self) -> list[Part | None]:
        parts, records = next(self.pool)
        self.skipped.extend(records)
        return parts

    def close(self) -> None:
        self.pool.close()
