"""A dataset reader's window stream entered at any window, and batches re-cut from such streams.

Mixtures read their members as one stream each and an elastic resume reads the rest of old readers'
streams: ``reader_windows`` enters a stream at window ``lo`` without reading the units before it,
``Chunks`` re-cuts batches into pieces of any size and ``concat`` joins pieces into one batch. A
stream is read from frozen values (``StreamValues``), never from the dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dask_windows.planning.budget import plan_for
from dask_windows.planning.pool import PoolPlan
from dask_windows.planning.world import World
from dask_windows.runtime.pool import pool_batches
from dask_windows.runtime.values import PassValues

__all__ = ["Chunks", "StreamValues", "concat", "elastic_batches", "reader_windows"]


@dataclass(frozen=True, eq=False)
class StreamValues:
    """What a dataset's reader streams are read from (``WindowDataset._stream_values``): pass values that
    count nothing and read nothing ahead, and the units per partition (``planning.budget.unit_bounds``)."""

    values: PassValues
    unit_bounds: Sequence[np.ndarray]

    @property
    def batch_size(self) -> int:
        return int(self.values.reads.spec.batch_size)

    def without_drop_last(self) -> StreamValues:
        """The same streams with every reader's final partial batch (a mixture reads its members so)."""
        reads = self.values.reads
        spec = dataclasses.replace(reads.spec, drop_last=False)
        values = dataclasses.replace(self.values, reads=dataclasses.replace(reads, spec=spec))
        return StreamValues(values, self.unit_bounds)

    def plan(self, reader: World, skip_batches: int, epoch: int) -> PoolPlan:
        """``reader``'s pool plan of ``epoch`` after ``skip_batches``."""
        reads = self.values.reads
        return plan_for(reads.spec, reads.grid, self.unit_bounds, reads.row_bytes, reader, skip_batches, epoch)

    def batches(self, plan: PoolPlan) -> Iterator[Any]:
        """The batches of ``plan`` (a generator: ``close`` ends its reads)."""
        return pool_batches(self.values, plan)


def reader_windows(
    ds: StreamValues, epoch: int, reader: World, lo: int, hi: int, names: list | None = None
) -> Iterator[tuple]:
    """Windows ``[lo, hi)`` of the stream ``reader`` yields in ``epoch`` of a dataset, in chunks.

    ``names``: filled with the keys of named batches (a workflow's), whose values are yielded;
    ``None``: named batches raise. Yields tuples of tensors as ``ds`` yields them.
    """
    if hi <= lo:
        return
    # the epoch goes to the plan, never into the shared epoch word; nothing counts these batches
    chunk = ds.batch_size
    drop, left = lo % chunk, hi - lo
    batches: Any = ds.batches(ds.plan(reader, lo // chunk, epoch))  # a generator
    try:
        for batch in batches:
            if isinstance(batch, dict):  # a workflow's named batch: its values, in key order
                if names is None:
                    raise TypeError(
                        "named batches (workflow=wf.named()) reached a reader of tuples; use the tuple (workflow=wf)"
                    )
                names[:] = list(batch)
                batch = tuple(batch.values())
            parts = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
            if drop:
                parts, drop = tuple(p[drop:] for p in parts), 0
            parts = tuple(p[:left] for p in parts)
            left -= len(parts[0])
            yield parts
            if left <= 0:
                return
    finally:
        batches.close()


def concat(pieces: list[tuple]) -> tuple:
    """One tuple of tensors from consecutive pieces."""
    if len(pieces) == 1:
        return pieces[0]
    return tuple(torch.cat(column) for column in zip(*pieces))


class Chunks:
    """Takes windows from a stream of tuples of tensors in counts of any size."""

    def __init__(self, chunks: Iterable[tuple]) -> None:
        self._chunks = iter(chunks)
        self._pending: list[tuple] = []

    def take(self, count: int) -> tuple:
        """The next ``count`` windows, as one tuple of tensors."""
        got, pieces = 0, []
        while got < count:
            part = self._pending.pop() if self._pending else next(self._chunks)
            need = count - got
            if len(part[0]) > need:
                self._pending.append(tuple(p[need:] for p in part))
                part = tuple(p[:need] for p in part)
            pieces.append(part)
            got += len(part[0])
        return concat(pieces)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def elastic_batches(
    ds: StreamValues,
    epoch: int,
    pieces: Sequence,
    origin: tuple[int, int],
    sizes: Sequence[int],
    step: Callable[[], Any],
    end: Callable[[int], Any],
) -> Iterator[Any]:
    """The batches of an elastic resume: ``pieces`` of old readers' streams, cut into ``sizes``.

    ``origin``: ``(world_size, num_workers)`` of the old readers; ``step`` is called before each batch
    is yielded, ``end(epoch)`` once the batches end, however they end.
    """
    names: list = []  # the keys of named batches (a workflow's), else empty

    def windows() -> Iterator[tuple]:
        for rank, worker, lo, hi in pieces:
            yield from reader_windows(ds, epoch, World(rank, origin[0], worker, origin[1]), lo, hi, names)

    stream = Chunks(windows())
    try:
        for size in sizes:
            batch = stream.take(size)
            step()
            yield dict(zip(names, batch)) if names else batch[0] if len(batch) == 1 else batch
    finally:
        stream.close()
        end(epoch)
