"""Where rows come from: the source interface, and picking a source for what the user passed.

The sources are the only modules that open files. A source exposes
``partitions`` (name and row count, known from metadata without reading data)
and ``read(i, columns)`` returning one numpy array per column; ``reader()``
gives the reader of one iteration (a source that can start work early, like
the Dask one, keeps the next partitions in flight). The concrete sources live
in their own modules:

* ``parquet_source.ParquetSource``: Parquet on local disk, ``s3://``, ``gs://``,
  ``az://``, ``memory://`` or any fsspec URL; listing and footers read once,
  coalesced column-chunk reads, retries, ``on_error``;
* ``dask_source.DaskSource``: any Dask DataFrame, computed on a
  ``dask.distributed`` cluster when a client is active;
* ``array_source.ArraySource``: numpy arrays and ``.npy`` memmaps, or one 2-D
  array cut into series by an id vector.

``open_source`` picks one from the type of the data.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError
from dask_windows.faults import SkippedPartition, check_on_error
from dask_windows.retry import RetryPolicy
from dask_windows.windows import find_runs, join_runs

__all__ = [
    "Partition",
    "PartitionReader",
    "Source",
    "is_series_vector",
    "open_source",
]

DEFAULT_PARTITION_BYTES = 256 * 2**20
DEFAULT_PARTITION_ROWS = 1_000_000


@dataclass(frozen=True)
class Partition:
    """One unit of reading.

    Attributes:
        name: Where it lives, for messages (``path`` or ``path[row groups 2-3]``).
        num_rows: Rows it holds.
        key: What the source needs to read it (path and row groups, array ids, ...).
    """

    name: str
    num_rows: int
    key: Any


class PartitionReader:
    """Reads the partitions of one iteration, in the order given when it was made.

    The base reader reads each partition when asked; a source that can start
    work early (``DaskSource`` keeps the next partitions computing on the
    cluster) returns its own reader.

    Args:
        source: The source to read from.
        indices: Partitions in the order they will be asked for.
        columns: Columns to read.
    """

    def __init__(self, source: Source, indices: Sequence[int], columns: Sequence) -> None:
        self.source = source
        self.indices = list(indices)
        self.columns = list(columns)

    def read(self, index: int) -> dict:
        """The columns of partition ``index`` as 1-D numpy arrays."""
        return self.source.read(index, self.columns)

    def close(self) -> None:
        """Give up partitions started early (idempotent)."""


class Source:
    """Base of all sources: a list of partitions and a way to read one.

    Attributes:
        description: What the data is, for messages.
        partitions: Partitions in canonical order.
        skipped: Partitions left out when the source was opened (``on_error="skip"``).
    """

    description: str = "<source>"
    partitions: list[Partition]
    skipped: Sequence[SkippedPartition] = ()

    def column_names(self) -> list:
        """Columns every partition holds."""
        raise NotImplementedError

    def read(self, index: int, columns: Sequence) -> dict:
        """Read ``columns`` of partition ``index`` as 1-D numpy arrays of equal length."""
        raise NotImplementedError

    def reader(self, indices: Sequence[int], columns: Sequence) -> PartitionReader:
        """A reader of partitions ``indices`` (in that order) for one iteration; close it after."""
        return PartitionReader(self, indices, columns)

    def set_window(self, span: int, stride: int) -> None:
        """Learn the rows one window needs (``window + horizon``) and the stride, before runs are scanned.

        Sources whose partitions are cut out of longer series (arrays) use it to
        overlap neighbouring partitions so no window is lost at a cut.
        """

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(run_starts, run_lengths, run_keys)`` of partition ``index``: its runs of one series.

        With ``series=None`` the whole partition is one run. Only the series column is read.
        """
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


def is_series_vector(series: Any) -> bool:
    """Whether ``series`` is a per-row id vector (for one 2-D array) rather than a column name."""
    return isinstance(series, (np.ndarray, list, tuple)) or (
        hasattr(series, "__array__") and hasattr(series, "__len__") and not isinstance(series, str)
    )



def open_source(
    data: Any,
    storage_options: dict | None = None,
    *,
    series: Any = None,
    retry: int | RetryPolicy | None = None,
    on_error: str = "raise",
    **options: Any,
) -> Source:
    """Pick the source for ``data``: a path/URL/list of paths, a Dask DataFrame, or numpy arrays.

    Args:
        data: What to read, or a ready ``Source`` (returned as is).
        storage_options: Passed to fsspec for paths and URLs.
        series: The series column (a hint: a Dask source scans it while counting rows), or for one
            2-D array a ``(rows,)`` series id vector.
        retry: Retries of transient storage errors.
        on_error: ``"raise"`` or ``"skip"`` for partitions unreadable when the source is opened.
        **options: ``partition_bytes`` (Parquet), ``partition_rows`` (arrays), ``threads``.
    """
    check_on_error(on_error)
    threads = options.pop("threads", None)
    if isinstance(data, Source):
        return data
    if series is not None and is_series_vector(series) and not isinstance(data, np.ndarray):
        raise ConfigError(
            f"series was given as a vector of {len(series)} ids, which only works with one 2-D numpy array; "
            f"for {type(data).__name__} data pass the name of the series column"
        )
    if isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data)
    ):
        from dask_windows.parquet_source import ParquetSource

        options.pop("partition_rows", None)
        if threads is not None:
            options["threads"] = threads
        return ParquetSource(data, storage_options, retry=retry, on_error=on_error, **options)
    if type(data).__module__.startswith("dask"):
        from dask_windows.dask_source import DaskSource

        options.pop("partition_bytes", None)
        options.pop("partition_rows", None)
        return DaskSource(data, series=series, retry=retry, on_error=on_error, **options)
    from dask_windows.array_source import ArraySource

    options.pop("partition_bytes", None)
    if isinstance(data, np.ndarray) and series is not None and is_series_vector(series):
        return ArraySource.from_series(data, series, **options)
    if isinstance(data, np.ndarray):
        return ArraySource([data], **options)
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, np.ndarray) for d in data):
        return ArraySource(data, **options)
    raise TypeError(
        f"cannot read windows from {type(data).__name__}; pass a Parquet path/URL/glob or a list of them, "
        "a Dask DataFrame, a list of (rows, C) numpy arrays, or one 2-D array with series=<id per row>"
    )


def __getattr__(name: str) -> Any:
    """``ParquetSource`` and ``ArraySource`` stay importable from here (their modules import this one)."""
    if name == "ParquetSource":
        from dask_windows.parquet_source import ParquetSource

        return ParquetSource
    if name == "ArraySource":
        from dask_windows.array_source import ArraySource

        return ArraySource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
