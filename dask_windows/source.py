"""Where rows come from: list partitions, count their rows, read their columns.

This is the only module that opens files. A source exposes ``partitions``
(name and row count, known from metadata without reading data) and
``read(i, columns)`` returning one numpy array per column. Parquet is read
with pyarrow through any fsspec filesystem; footers are read once, in
parallel threads, when the dataset is opened; a file much larger than
``partition_bytes`` (uncompressed) is split at row-group boundaries.
Numpy arrays (and ``.npy`` memmaps) are a source too: each array is one
series; small arrays are grouped into partitions of about
``partition_rows`` rows.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError, SourceReadError
from dask_windows.windows import find_runs, join_runs

__all__ = ["ArraySource", "ParquetSource", "Partition", "Source", "open_source"]

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
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


class Source:
    """Base of all sources: a list of partitions and a way to read one."""

    description: str = "<source>"
    partitions: list[Partition]

    def column_names(self) -> list:
        """Columns every partition holds."""
        raise NotImplementedError

    def read(self, index: int, columns: Sequence) -> dict:
        """Read ``columns`` of partition ``index`` as 1-D numpy arrays."""
        raise NotImplementedError

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


def _fs_and_paths(data: Any, storage_options: dict | None) -> tuple[Any, list[str], str]:
    """Resolve a path, glob, URL or list of them to ``(fs, files, description)``."""
    import fsspec

    options = dict(storage_options or {})
    if isinstance(data, (str, os.PathLike)):
        url = os.fspath(data)
        fs, root = fsspec.core.url_to_fs(url, **options)
        if any(ch in root for ch in "*?["):
            files = sorted(p for p in fs.glob(root) if fs.isfile(p))
        elif fs.isdir(root):
            found = [p for p in fs.find(root) if not _hidden(p, root)]
            files = sorted(p for p in found if p.endswith(PARQUET_SUFFIXES)) or sorted(found)
        elif fs.exists(root):
            files = [root]
        else:
            raise FileNotFoundError(f"{url} does not exist; pass a Parquet file, a folder of them, a glob or a list")
        if not files:
            raise FileNotFoundError(f"no Parquet files under {url}; expected files ending in {PARQUET_SUFFIXES}")
        return fs, files, url
    paths = [os.fspath(p) for p in data]
    if not paths:
        raise ConfigError("an empty list of paths was given; pass at least one Parquet file")
    fs, _ = fsspec.core.url_to_fs(paths[0], **options)
    files = [fsspec.core.url_to_fs(p, **options)[1] for p in paths]
    return fs, files, f"{paths[0]} (+{len(paths) - 1} files)" if len(paths) > 1 else paths[0]


def _hidden(path: str, root: str) -> bool:
    rel = path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/")) else path
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


class ParquetSource(Source):
    """Partitioned Parquet on any fsspec filesystem.

    Args:
        data: A file, folder, glob or URL, or a list of them (taken in the given order).
        storage_options: Passed to fsspec (credentials, endpoint, ...).
        partition_bytes: Files with more uncompressed bytes are split at row-group boundaries.
        threads: Threads reading footers when the dataset is opened.
    """

    def __init__(
        self,
        data: Any,
        storage_options: dict | None = None,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
        threads: int = 16,
    ) -> None:
        import pyarrow.parquet as pq

        self.fs, self.files, self.description = _fs_and_paths(data, storage_options)
        self.storage_options = storage_options

        def footer(path: str) -> Any:
            try:
                with self.fs.open(path, "rb") as f:
                    return pq.ParquetFile(f).metadata
            except Exception as exc:
                raise SourceReadError(
                    f"cannot read the Parquet footer of {path}: {exc}; the file is not Parquet, "
                    "truncated or corrupt; rewrite it or remove it from the dataset"
                ) from exc

        with ThreadPoolExecutor(max(1, min(threads, len(self.files)))) as pool:
            metas = list(pool.map(footer, self.files))
        self._schemas = [m.schema.to_arrow_schema() for m in metas]
        self.partitions = []
        for path, meta in zip(self.files, metas):
            groups: list[list[int]] = [[]]
            size = 0
            for g in range(meta.num_row_groups):
                nbytes = meta.row_group(g).total_byte_size
                if groups[-1] and size + nbytes > partition_bytes:
                    groups.append([])
                    size = 0
                groups[-1].append(g)
                size += nbytes
            for rgs in groups:
                rows = sum(meta.row_group(g).num_rows for g in rgs)
                name = path if len(groups) == 1 else f"{path}[row groups {rgs[0]}-{rgs[-1]}]"
                if rows:
                    self.partitions.append(Partition(name, rows, (path, tuple(rgs))))

    def column_names(self) -> list:
        return list(self._schemas[0].names)

    def check_columns(self, columns: Sequence, what: dict) -> None:
        first = self._schemas[0]
        for path, schema in zip(self.files, self._schemas):
            for col in columns:
                role = what.get(col, "column")
                if col not in schema.names:
                    raise SchemaError(
                        f"{role} {col!r} is missing from {path} (its columns: {schema.names}); "
                        f"every file of {self.description} must hold the feature, target and series columns"
                    )
                if col in first.names and schema.field(col).type != first.field(col).type:
                    raise SchemaError(
                        f"schema mismatch: column {col!r} is {schema.field(col).type} in {path} but "
                        f"{first.field(col).type} in {self.files[0]}; rewrite the files with one schema"
                    )

    def read(self, index: int, columns: Sequence) -> dict:
        import pyarrow.parquet as pq

        part = self.partitions[index]
        path, row_groups = part.key
        try:
            with self.fs.open(path, "rb") as f:
                table = pq.ParquetFile(f).read_row_groups(list(row_groups), columns=list(columns), use_threads=False)
        except Exception as exc:
            raise SourceReadError(
                f"cannot read {part.name}: {type(exc).__name__}: {exc}; the file may be truncated or "
                "corrupt; rewrite it or remove it from the dataset"
            ) from exc
        if table.num_rows != part.num_rows:
            raise SourceReadError(
                f"{part.name} holds {table.num_rows} rows but its footer said {part.num_rows} when the dataset "
                "was opened; the file changed underneath the dataset; open the dataset again"
            )
        return {col: table.column(col).to_numpy() for col in columns}

    def read_chunks(self, index: int, columns: Sequence) -> Iterator[dict]:
        """One row group at a time, so scanning a column holds one row group in memory."""
        import pyarrow.parquet as pq

        part = self.partitions[index]
        path, row_groups = part.key
        try:
            with self.fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                for g in row_groups:
                    table = pf.read_row_group(g, columns=list(columns), use_threads=False)
                    yield {col: table.column(col).to_numpy() for col in columns}
        except Exception as exc:
            raise SourceReadError(
                f"cannot read {part.name}: {type(exc).__name__}: {exc}; the file may be truncated or "
                "corrupt; rewrite it or remove it from the dataset"
            ) from exc


class ArraySource(Source):
    """Numpy arrays or ``.npy`` memmaps, each ``(rows, C)`` and one series.

    Args:
        arrays: The series, in canonical order.
        partition_rows: Consecutive small arrays are grouped into partitions of about this many rows.
    """

    def __init__(self, arrays: Sequence[np.ndarray], partition_rows: int = DEFAULT_PARTITION_ROWS) -> None:
        arrays = list(arrays)
        if not arrays:
            raise ConfigError("an empty list of arrays was given; pass at least one (rows, C) array")
        width = None
        for i, a in enumerate(arrays):
            if not hasattr(a, "ndim") or a.ndim not in (1, 2):
                raise ConfigError(f"array {i} has shape {getattr(a, 'shape', None)}; each series must be (rows, C)")
            c = 1 if a.ndim == 1 else a.shape[1]
            if width is not None and c != width:
                raise SchemaError(f"schema mismatch: array {i} has {c} columns but array 0 has {width}")
            width = c
        self.arrays = [a if a.ndim == 2 else a[:, None] for a in arrays]
        self.width = width
        self.description = f"{len(arrays)} arrays"
        self.partitions = []
        group: list[int] = []
        rows = 0
        for i, a in enumerate(self.arrays):
            group.append(i)
            rows += len(a)
            if rows >= partition_rows or i == len(self.arrays) - 1:
                name = f"array[{group[0]}]" if len(group) == 1 else f"arrays[{group[0]}:{group[-1] + 1}]"
                self.partitions.append(Partition(name, rows, tuple(group)))
                group, rows = [], 0

    def column_names(self) -> list:
        return list(range(self.width))

    def read(self, index: int, columns: Sequence) -> dict:
        ids = self.partitions[index].key
        out = {}
        for col in columns:
            out[col] = np.concatenate([np.asarray(self.arrays[i][:, col]) for i in ids])
        return out

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if series is not None:
            raise ConfigError(f"series={series!r} cannot be used with arrays: each array is one series; pass series=None")
        ids = np.asarray(self.partitions[index].key, dtype=np.int64)
        lengths = np.array([len(self.arrays[i]) for i in ids], dtype=np.int64)
        return np.cumsum(lengths) - lengths, lengths, ids


def open_source(data: Any, storage_options: dict | None = None, **options: Any) -> Source:
    """Pick the source for ``data``: a path/URL/list of paths, a Dask DataFrame, or numpy arrays."""
    if isinstance(data, Source):
        return data
    if isinstance(data, (str, os.PathLike)):
        return ParquetSource(data, storage_options, **options)
    if isinstance(data, np.ndarray):
        return ArraySource([data], **options)
    if type(data).__module__.startswith("dask"):
        from dask_windows.dask_source import DaskSource

        return DaskSource(data, **options)
    if isinstance(data, (list, tuple)) and data:
        if all(isinstance(d, (str, os.PathLike)) for d in data):
            return ParquetSource(data, storage_options, **options)
        if all(isinstance(d, np.ndarray) for d in data):
            return ArraySource(data, **options)
    raise TypeError(
        f"cannot read windows from {type(data).__name__}; pass a Parquet path/URL/glob or a list of them, "
        "a Dask DataFrame, or a list of (rows, C) numpy arrays"
    )
