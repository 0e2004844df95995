"""The first rows of Parquet row groups, kept so that a piece's halo does not decode a row group.

A piece that ends at a row-group cut needs the ``window + horizon - 1`` rows past it (its halo):
the first rows of the next row group. Decoding that row group whole for them costs what the
piece's own rows cost (a row group is decompressed page by page, and files written with the
default 1 MiB pages often hold a column chunk in one page). So every row group decoded keeps
its first ``halo`` rows here (``HeadCache``: at most ``HEAD_CACHE_BYTES``, oldest dropped first),
and a halo that finds its rows here reads nothing; one that does not reads only the row group's
first batch (``read_head``: the pages holding those rows, on files of many pages per chunk).

The trade-off: ``halo x columns`` values per row group held (8 KiB for 511 rows of 4 float32
columns), against one row-group decode per piece ending at a cut. The values are those a whole
read gives (a copy of its first rows), so which windows a batch holds, and their values, do not
depend on what the cache held. A pickled cache (DataLoader workers) starts empty.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.tuning import HEAD_CACHE_BYTES

__all__ = ["HEAD_CACHE_BYTES", "HeadCache", "read_head"]


class HeadCache:
    """``(path, row group, columns) -> {column: first rows}``, bounded in bytes, thread-safe."""

    def __init__(self, limit: int = HEAD_CACHE_BYTES) -> None:
        self.limit = limit
        self._heads: dict[tuple, dict[Any, np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        """The lock, a fresh one in a forked process (one held by a thread at the fork stays held)."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def __reduce__(self) -> tuple:
        return (HeadCache, (self.limit,))  # another process starts empty

    def get(self, key: tuple, rows: int) -> dict[Any, np.ndarray] | None:
        """The first ``rows`` rows kept under ``key``, or ``None`` when fewer (or none) are kept."""
        with self._locked():
            head = self._heads.get(key)
        if head is None or any(len(v) < rows for v in head.values()):
            return None
        return {col: values[:rows] for col, values in head.items()}

    def put(self, key: tuple, columns: dict[Any, np.ndarray], rows: int) -> None:
        """Keep a copy of the first ``rows`` rows of ``columns`` under ``key``."""
        head = {col: np.array(values[:rows]) for col, values in columns.items()}
        size = sum(v.nbytes for v in head.values())
        if size > self.limit:
            return
        with self._locked():
            old = self._heads.pop(key, None)
            self._bytes -= 0 if old is None else sum(v.nbytes for v in old.values())
            while self._heads and self._bytes + size > self.limit:  # oldest first
                dropped = self._heads.pop(next(iter(self._heads)))
                self._bytes -= sum(v.nbytes for v in dropped.values())
            self._heads[key] = head
            self._bytes += size


def read_head(file: Any, metadata: Any, group: int, rows: int, columns: Sequence, verify: bool) -> dict:
    """The first ``rows`` rows of row group ``group`` of a local Parquet file: its first batch only.

    Args:
        file: The file's path (or an open file).
        metadata: Its footer (``pyarrow.parquet.FileMetaData``).
        group: The row group.
        rows: Rows wanted (the batch size).
        columns: Columns to read.
        verify: Check page checksums where the file has them.

    Returns:
        ``{column: numpy array}`` of ``rows`` rows (fewer when the row group holds fewer).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_windows.sources.arrow import numpy_column

    reader = pq.ParquetFile(file, metadata=metadata, pre_buffer=False, page_checksum_verification=verify)
    batches = reader.iter_batches(batch_size=max(rows, 1), row_groups=[group], columns=list(columns), use_threads=False)
    try:
        batch = next(iter(batches))
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    table = pa.Table.from_batches([batch])
    return {col: numpy_column(table.column(col)) for col in columns}
