"""The source interface: what the loader asks of any kind of data.

A source exposes ``partitions`` (name and row count, known from metadata) and reads columns of
one partition, or of row ranges of it (the loader's pieces), as numpy arrays. This module
imports none of the concrete sources (they import it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import SchemaError
from dask_windows.errors.faults import SkippedPartition
from dask_windows.planning.windows import find_runs, join_runs
from dask_windows.settings.tuning import DEFAULT_PARTITION_BYTES, DEFAULT_PARTITION_ROWS

__all__ = [
    "DEFAULT_PARTITION_BYTES",
    "DEFAULT_PARTITION_ROWS",
    "Partition",
    "PartitionReader",
    "Source",
    "partition_names",
    "rows_per_partition",
]


@dataclass(frozen=True, slots=True)  # one per partition: no per-instance dict
class Partition:
    """One unit of reading: ``name`` for messages (``path[row groups 2-3]``), ``num_rows``, and ``key``,
    what the source needs to read it."""

    name: str
    num_rows: int
    key: Any


def rows_per_partition(partitions: Sequence[Partition]) -> np.ndarray:
    """``(P,)`` rows of each partition: a columnar sequence's ``num_rows`` array as it is, else one per item."""
    rows = getattr(partitions, "num_rows", None)
    if isinstance(rows, np.ndarray):
        return rows
    return np.fromiter((p.num_rows for p in partitions), np.int64, len(partitions))


def partition_names(partitions: Sequence[Partition]) -> Sequence[str]:
    """Each partition's name, for messages: a columnar sequence's lazy ``names``, else a list."""
    names = getattr(partitions, "names", None)
    return names if names is not None else [p.name for p in partitions]


class PartitionReader:
    """Reads the partitions ``indices`` of one iteration, in that order; a source that can start work
    early (``DaskSource``) returns its own."""

    def __init__(self, source: Source, indices: Sequence[int], columns: Sequence) -> None:
        self.source = source
        self.indices = list(indices)
        self.columns = list(columns)

    def read(self, index: int) -> dict:
        """The columns of partition ``index`` as 1-D numpy arrays."""
        return self.source.read(index, self.columns)

    def read_rows(self, index: int, lo: int, hi: int) -> dict:
        """Rows ``[lo, hi)`` of partition ``index`` (partition rows, halo included)."""
        return self.source.read_rows(index, self.columns, lo, hi)

    def read_ranges(self, index: int, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        """Rows ``[lo, hi)`` of partition ``index`` for each of ``ranges``, in one read where the source can."""
        return self.source.read_ranges(index, self.columns, ranges)

    def close(self) -> None:
        """Give up partitions started early (idempotent)."""


class Source:
    """Base of all sources: ``partitions`` in canonical order, and reads of them.

    Attributes:
        description: What the data is, for messages.
        skipped: Partitions left out when the source was opened (``on_error="skip"``).
    """

    description: str = "<source>"
    partitions: list[Partition]
    skipped: Sequence[SkippedPartition] = ()
    #: ``pieces_per_partition`` when the dataset is not told: ``None`` lets the dataset pick enough
    #: pieces for good mixing; a source that computes a whole partition per read (Dask) says 1.
    default_pieces_per_partition: int | None = None

    def column_names(self) -> list:
        """Columns every partition holds."""
        raise NotImplementedError

    def read(self, index: int, columns: Sequence) -> dict:
        """Read ``columns`` of partition ``index`` as 1-D numpy arrays of equal length."""
        raise NotImplementedError

    def readable_rows(self, index: int) -> int:
        """Rows ``read_rows`` can return for partition ``index``: its own, plus any halo past its end."""
        return self.partitions[index].num_rows

    def unchanged(self, indices: Sequence[int]) -> bool:
        """Whether partitions ``indices`` are still what the source opened, by a cheap check; default ``True``."""
        return True

    def decode_units(self, index: int) -> np.ndarray | None:
        """``(G+1,)`` partition rows where each unit the source decodes whole (Parquet row groups) begins,
        then its row count; ``None`` where any rows cost only those rows, or the whole partition."""
        return None

    def read_rows(self, index: int, columns: Sequence, lo: int, hi: int) -> dict:
        """Rows ``[lo, hi)`` of partition ``index``, counted from its first row, maybe reaching into its
        halo; default: read the partition and slice it."""
        columns = list(columns)
        data = self.read(index, columns)
        if lo == 0 and all(len(v) == hi for v in data.values()):
            return data
        return {col: values[lo:hi] for col, values in data.items()}

    def read_ranges(self, index: int, columns: Sequence, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        """Rows ``[lo, hi)`` of partition ``index`` for each of ``ranges``; default: one read covering them all."""
        lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
        data = self.read_rows(index, columns, lo, hi)
        return [{col: values[a - lo : b - lo] for col, values in data.items()} for a, b in ranges]

    def continues(self, index: int) -> bool:
        """Whether partition ``index`` directly follows partition ``index - 1`` in one file cut into partitions."""
        return False

    def reader(self, indices: Sequence[int], columns: Sequence) -> PartitionReader:
        """A reader of partitions ``indices`` (in that order) for one iteration; close it after."""
        return PartitionReader(self, indices, columns)

    def set_window(self, span: int, stride: int) -> None:
        """Learn the rows one window needs (``window + horizon``) and the stride, before runs are scanned
        (sources cut out of longer series overlap their partitions by it)."""

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, ...]:
        """``(run_starts, run_lengths, run_keys)`` of partition ``index``, from its series column alone (one
        run for ``series=None``); runs that are pieces of longer series add ``(origin, owned)``."""
        rows = self.partitions[index].num_rows
        if series is None:
            return np.zeros(1, np.int64), np.array([rows], np.int64), np.array([index])
        pieces = []
        offset = 0
        for chunk in self.read_chunks(index, [series]):
            keys = chunk[series]
            starts, lengths = find_runs(keys)
            pieces.append((starts + offset, lengths, keys[starts]))
            offset += len(keys)
        return join_runs(pieces)

    def read_chunks(self, index: int, columns: Sequence) -> Iterator[dict]:
        """Read partition ``index`` in consecutive row chunks (bounded memory); default: one chunk."""
        yield self.read(index, columns)

    def check_columns(self, columns: Sequence, what: dict) -> None:
        """Raise ``SchemaError`` naming the first column of ``columns`` that is missing."""
        names = self.column_names()
        for col in columns:
            if col not in names:
                role = what.get(col, "column")
                raise SchemaError(
                    f"{role} {col!r} is not a column of {self.description}; "
                    f"available columns: {list(names)}; check the spelling or pass the right {role.split()[0]} list"
                )
