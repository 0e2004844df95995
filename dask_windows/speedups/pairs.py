"""Two buffers' pieces of a partition from one read: each row group decoded once per pair of buffers.

With the stratified piece order (``plan.piece_order``) every buffer holds one piece of every
stratum, so two consecutive buffers need the same row groups of every file; read apart, each row
group is decoded once per buffer (``partitions / buffer_partitions`` times per epoch on a small
dataset). ``PairedReads`` reads buffer ``2i``'s pieces of a partition with buffer ``2i + 1``'s in
one call (``read_ranges_chunks`` locally, one coalesced ``read_ranges`` request remotely) and
decodes each row group's rows into the buffer that needs them (``buffer.ChunkDecoder`` per unit);
the partner's parts wait here until the prefetcher asks for them.

The trade-off: buffer ``2i + 1``'s rows are in memory from the time buffer ``2i`` is read, while
buffer ``2i - 1`` may still be drained: up to a third buffer's rows at the start of an even
buffer's reads (the stream of pieces decoded a row group at a time leaves that room below the 0.1
order's peak, which decodes whole files), for half the decoding, requests and bytes. Which windows
a buffer holds, and their values, are those of reads apart; so pairing is only where no value can
differ (``pairs_allowed``: columns that convert alike in any read) and off with
``prefetch_partitions=0`` (one buffer in memory at a time).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_windows.errors import SourceReadError
from dask_windows.faults import skip_allowed
from dask_windows.runtime import reading
from dask_windows.runtime.buffer import ChunkDecoder, Part, decode_pieces
from dask_windows.sources import PartitionReader

if TYPE_CHECKING:
    from dask_windows.runtime.reading import BufferArena
    from dask_windows.runtime.values import ReadValues

__all__ = ["PairedReads", "paired_reads", "pairs_allowed"]


def paired_reads(ds: ReadValues, units: list[tuple], reader: PartitionReader, arena: BufferArena) -> Any:
    """The read of a pass's units where they may be read in pairs (``pairs_allowed``), else ``None``:
    the ``pairing`` of the read backend ``seams.ThreadReads``, wired by the dataset for the piece order."""
    return PairedReads(ds, units, reader, arena).read if pairs_allowed(ds, units) else None


def pairs_allowed(ds: ReadValues, units: list[tuple]) -> bool:
    """Whether buffer ``2i``'s pieces of a partition may be read with buffer ``2i + 1``'s (``PairedReads``).

    Only where it changes no value and no memory bound: pieces (``pieces_per_partition > 1``) of a
    source with decode units whose columns convert alike in any read (``Source.stable_dtypes``), and a
    read-ahead of at least one partition (with ``prefetch_partitions=0`` a buffer is read only once the
    previous ones are gone).
    """
    spec = ds.spec
    if spec.pieces_per_partition <= 1 or spec.prefetch_partitions < 1 or len(units) < 2:
        return False
    columns = list(spec.columns)
    parts = {unit[0].partition for unit in units}
    return all(ds.source.decode_units(p) is not None and ds.source.stable_dtypes(p, columns) for p in parts)


class _Pending:
    """The parts of a unit read with its partner's, once that read is done (``None``: read it alone)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.parts: list[Part | None] | None = None


class PairedReads:
    """Reads of units in which buffer ``2i``'s pieces of a partition bring buffer ``2i + 1``'s along
    (pairs counted from the pass's first buffer, so a resumed pass pairs its own buffers).

    Args:
        ds: What the pass's readers need (``runtime.values.ReadValues``).
        units: The pass's units in reading order (``buffer.piece_units``).
        reader: The pass's partition reader.
        arena: The pass's ``reading.BufferArena`` (each unit's blocks and place).
    """

    def __init__(self, ds: ReadValues, units: list[tuple], reader: PartitionReader, arena: BufferArena) -> None:
        self.ds, self.reader, self.arena = ds, reader, arena
        by: dict[tuple[int, int], tuple] = {}  # (buffer, partition) -> its unit
        for unit in units:
            by.setdefault((arena.buffer_of.get(unit, -1), unit[0].partition), unit)
        first = min((g for g, _ in by), default=0)  # pairs counted from the pass's first buffer
        self.partner: dict[tuple, tuple] = {}
        self.pending: dict[tuple, _Pending] = {}
        for (g, p), unit in by.items():
            other = by.get((g + 1, p))
            if g >= 0 and (g - first) % 2 == 0 and other is not None and by.get((g, p)) is unit:
                self.partner[unit] = other
                self.pending[other] = _Pending()

    def read(self, unit: tuple) -> list[Part | None]:
        """The parts of ``unit``: read alone, with its partner's, or kept from its partner's read."""
        waiting = self.pending.get(unit)
        if waiting is not None:
            waiting.done.wait()  # the partner's read was asked for first (the prefetcher reads in order)
            del self.pending[unit]
            if waiting.parts is not None:
                return waiting.parts
            return reading.read_unit(self.ds, unit, self.reader, self.arena)
        other = self.partner.get(unit)
        if other is None:
            return reading.read_unit(self.ds, unit, self.reader, self.arena)
        later = self.pending[other]
        try:
            both = self._read_both(unit, other)
            if both is None:
                return reading.read_unit(self.ds, unit, self.reader, self.arena)
            later.parts = both[1]
            return both[0]
        finally:
            later.done.set()

    def _read_both(self, u: tuple, v: tuple) -> tuple[list[Part | None], list[Part | None]] | None:
        """The parts of ``u`` and ``v`` (one partition) from one read; ``None``: read them apart."""
        ds, arena = self.ds, self.arena
        index = u[0].partition
        name = ds.source.partitions[index].name
        bu, bv = arena.blocks(u), arena.blocks(v)
        pu, pv = arena.place(u), arena.place(v)
        if pu is None or pv is None:
            return None
        ranges = [(int(a), int(b)) for a, b in np.concatenate([bu, bv])]
        y_known = ds.y_dtype
        y_dtype = y_known or np.float32
        scale = ds.scale
        try:
            chunks = self.reader.read_ranges_chunks(index, ranges)
            if chunks is not None:  # a row group at a time, each into the buffer that needs it
                sizes_u, sizes_v = bu[:, 1] - bu[:, 0], bv[:, 1] - bv[:, 0]
                du = ChunkDecoder(index, name, bu[:, 0], sizes_u, ds.spec, y_dtype, pu)
                dv = ChunkDecoder(index, name, bv[:, 0], sizes_v, ds.spec, y_dtype, pv)
                n = len(bu)
                for i, row, columns in chunks:
                    if not (du.feed(i, row, columns) if i < n else dv.feed(i - n, row, columns)):
                        return None
                part_u, part_v = du.finish(scale), dv.finish(scale)
                if part_u is None or part_v is None:
                    return None
                return [part_u] * len(u), [part_v] * len(v)
            pieces = self.reader.read_ranges(index, ranges)
        except SourceReadError as exc:
            if not skip_allowed(ds.on_error, exc):
                raise
            # Read them apart: a damaged row group in one unit's rows must not cost the other its own
            # (reads apart skip only the unit that fails, and record it once).
            return None
        n = len(bu)
        part_u = decode_pieces(index, name, pieces[:n], bu[:, 0], ds.spec, scale, y_known, pu)
        part_v = decode_pieces(index, name, pieces[n:], bv[:, 0], ds.spec, scale, y_known, pv)
        return [part_u] * len(u), [part_v] * len(v)
