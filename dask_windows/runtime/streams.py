"""A dataset reader's window stream entered at any window, and batches re-cut from such streams.

In one epoch a reader (rank, DataLoader worker) of a ``WindowDataset``
yields a fixed sequence of windows: its plan's buffers, each permuted. A
mixture reads its members as one such stream each (``world_size=1``), and an
elastic resume reads the rest of the old readers' streams. ``reader_windows``
enters a stream at window ``lo``: the plan skips the buffers before it
without reading them (the buffer holding ``lo`` is read whole, and its
windows before ``lo`` are dropped). ``Chunks`` re-cuts streamed batches into
pieces of any size; ``concat`` joins pieces into one batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from dask_windows.planning.world import World

__all__ = ["Chunks", "concat", "elastic_batches", "reader_windows"]


def reader_windows(ds: Any, epoch: int, reader: World, lo: int, hi: int, names: list | None = None) -> Iterator[tuple]:
    """Windows ``[lo, hi)`` of the stream ``reader`` yields in ``epoch`` of ``ds``, in chunks.

    Args:
        ds: A ``WindowDataset`` (its ``spec`` decides batch size, order and ``drop_last``).
        epoch: The dataset epoch.
        reader: Whose stream: rank, world size, worker and number of workers.
        lo: First window of the stream wanted.
        hi: One past the last.
        names: Filled with the keys of named batches (a workflow's), whose values are yielded;
            ``None``: named batches raise (the caller takes tuples only).

    Yields:
        Tuples of tensors (features, then targets and start rows as ``ds`` yields them).
    """
    if hi <= lo:
        return
    # Epoch `epoch` whatever the dataset's own passes do: the epoch is passed to the plan, never
    # written into the epoch word the dataset shares with other DataLoader workers; and the batches
    # are not counted as the dataset's pass (``counted=False``: no resume count, no read-ahead).
    chunk = ds.spec.batch_size
    drop, left = lo % chunk, hi - lo
    batches = ds._batches(ds._plan(reader, lo // chunk, epoch), counted=False)
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
    ds: Any, pieces: Sequence, origin: tuple[int, int], sizes: Sequence[int], step: Any
) -> Iterator[Any]:
    """The batches of an elastic resume: ``pieces`` of old readers' streams, cut into ``sizes``.

    Args:
        ds: The ``WindowDataset``.
        pieces: ``(rank, worker, lo, hi)`` of old readers (of the ``origin`` topology), in order.
        origin: ``(world_size, num_workers)`` the old readers divided the epoch by.
        sizes: Windows of each batch to yield.
        step: Called once per batch before it is yielded (the resume count).
    """

    epoch = ds.epoch  # the pass's epoch, read once: a later pass may advance the dataset's

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
        ds._resumer.end_elastic(epoch)  # len() is the full epoch's again
