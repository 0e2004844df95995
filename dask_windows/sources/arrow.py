"""Arrow-world data as a source: pandas, pyarrow Tables and Datasets, Polars, Hugging Face, Delta.

A ``pyarrow.dataset.Dataset`` of files: a partition is a fragment, or a few row groups of a large
Parquet fragment. A table in memory: partitions are row ranges of about ``partition_rows`` cut at
series changes, a longer series cut into ranges reading ``window + horizon - 1`` rows past their end.
Pandas frames are converted once; spawned DataLoader workers get a pickled copy, except Hugging Face
cache files and ``memory_mapped`` tables, which travel as file names."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.planning.windows import find_runs
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES, DEFAULT_PARTITION_ROWS, Partition, Source
from dask_windows.sources.parquet.footers import split_sizes

__all__ = ["ArrowSource", "arrow_table", "is_arrow_like", "memory_mapped", "numpy_column"]

log = logging.getLogger(__name__)


def _module_of(data: Any) -> str:
    return type(data).__module__.split(".")[0]


def is_arrow_like(data: Any) -> bool:
    """Whether ``data`` is something ``ArrowSource`` reads (checked without importing any library)."""
    if isinstance(data, _MappedTable):
        return True
    module = _module_of(data)
    if module in ("pandas", "polars", "pyarrow"):
        return True
    if module == "datasets" and hasattr(data, "data") and hasattr(data, "cache_files"):
        return True
    return callable(getattr(data, "to_pyarrow_dataset", None))  # deltalake.DeltaTable and alike


def _column_numpy(column: Any) -> np.ndarray:
    """A (chunked) Arrow column as a 1-D numpy array; dictionary-encoded values decoded."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return numpy_column(column)


def numpy_column(column: Any) -> np.ndarray:
    """A (chunked) Arrow column as a 1-D numpy array, as ``to_numpy()`` gives it (which imports pandas):
    numbers without nulls are viewed (one chunk) or joined; anything else takes ``to_numpy``."""
    import pyarrow as pa

    kind = column.type
    signed = pa.types.is_signed_integer(kind) or pa.types.is_floating(kind)
    if not (signed or pa.types.is_unsigned_integer(kind)) or column.null_count:
        return np.asarray(column.to_numpy(zero_copy_only=False))
    dtype = np.dtype(f"{'f' if pa.types.is_floating(kind) else 'i' if signed else 'u'}{kind.bit_width // 8}")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    views = [
        np.frombuffer(c.buffers()[1], dtype, count=len(c), offset=c.offset * dtype.itemsize) for c in chunks if len(c)
    ]
    if len(views) == 1:
        return views[0]
    return np.concatenate(views) if views else np.empty(0, dtype)


class _MappedTable:
    """Arrow IPC files memory-mapped into one table; pickled as the file names."""

    def __init__(self, paths: Sequence[str], stream: bool = True) -> None:
        self.paths, self.stream = list(paths), stream
        self.table = self._open()

    def _open(self) -> Any:
        import pyarrow as pa

        tables = []
        for path in self.paths:
            source = pa.memory_map(path, "r")
            reader = pa.ipc.open_stream(source) if self.stream else pa.ipc.open_file(source)
            tables.append(reader.read_all())
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "stream": self.stream}

    def __setstate__(self, state: dict) -> None:
        self.paths, self.stream = state["paths"], state["stream"]
        self.table = self._open()


def memory_mapped(paths: str | Sequence[str], stream: bool = False) -> _MappedTable:
    """Arrow IPC (Feather v2) files (``paths``, concatenated) as one memory-mapped table, for
    ``WindowDataset``; DataLoader workers receive the names and map the files themselves.
    ``stream``: the files are in the IPC stream format (Hugging Face cache files)."""
    return _MappedTable([paths] if isinstance(paths, str) else paths, stream)


def _hf_table(data: Any) -> Any:
    """A Hugging Face ``datasets.Dataset`` as a memory-mapped table (or its in-memory table)."""
    if getattr(data, "_indices", None) is not None:
        raise ConfigError(
            "this Hugging Face dataset has an indices mapping (after shuffle/select/filter/sort), so its rows are "
            "not in its Arrow table's order; call dataset.flatten_indices() first, or pass it unshuffled "
            "(WindowDataset shuffles windows itself)"
        )
    files = [f["filename"] for f in data.cache_files]
    if files and _is_its_cache_files(data.data, files):
        mapped = _MappedTable(files, stream=True)
        if mapped.table.num_rows == data.num_rows and mapped.table.schema.names == list(data.column_names):
            return mapped
    if files:
        log.info("%s was changed in memory since its cache files were written; using the table in memory", data)
    return data.data.table


#: ``datasets`` table edits that leave the values and columns of the cache files as they are
_UNCHANGING_REPLAYS = frozenset({"replace_schema_metadata"})


def _is_its_cache_files(table: Any, files: list[str]) -> bool:
    """Whether a ``datasets`` table is ``files`` as written: edits such as ``rename_column`` or
    ``add_column`` live only in memory, as replays or blocks beside the memory-mapped ones."""
    rows = getattr(table, "blocks", None) or [[table]]  # a ConcatenationTable: rows of blocks side by side
    if any(len(row) != 1 for row in rows):  # columns joined side by side (add_column)
        return False
    blocks = [row[0] for row in rows]
    # a MemoryMappedTable has the path of its file and the edits made since; an InMemoryTable has neither
    return [getattr(b, "path", None) for b in blocks] == files and all(
        all(replay[0] in _UNCHANGING_REPLAYS for replay in getattr(b, "replays", None) or ()) for b in blocks
    )


def arrow_table(data: Any, series: Any = None) -> Any:
    """The ``pyarrow.Table``, ``_MappedTable`` or ``pyarrow.dataset.Dataset`` behind ``data`` (else ``TypeError``)."""
    import pyarrow as pa

    module = _module_of(data)
    if isinstance(data, _MappedTable):
        return data
    if module == "pyarrow":
        import pyarrow.dataset as pads

        if isinstance(data, pa.RecordBatch):
            return pa.Table.from_batches([data])
        if isinstance(data, (pa.Table, pads.Dataset)):
            return data
    if module == "pandas" and hasattr(data, "columns"):
        if series is not None and series not in data.columns and series in (data.index.names or []):
            data = data.reset_index()  # a series kept in the index, as groupby results often are
        return pa.Table.from_pandas(data, preserve_index=False)
    if module == "polars":
        if hasattr(data, "collect") and not hasattr(data, "to_arrow"):  # LazyFrame: collected once, here
            data = data.collect()
        if hasattr(data, "to_arrow"):
            return data.to_arrow()
    if module == "datasets" and hasattr(data, "cache_files"):
        return _hf_table(data)
    if callable(getattr(data, "to_pyarrow_dataset", None)):
        return data.to_pyarrow_dataset()
    raise TypeError(
        f"cannot read windows from {type(data).__name__}; pass a pandas/Polars DataFrame, a pyarrow Table or "
        "Dataset, a Hugging Face datasets.Dataset or an object with to_pyarrow_dataset()"
    )


class ArrowSource(Source):
    """Windows from an Arrow table in memory or a ``pyarrow.dataset.Dataset`` of files (what ``arrow_table``
    accepts): ``series`` cuts a table's partitions where it changes, ``partition_rows`` rows each;
    Parquet fragments over ``partition_bytes`` are split at row groups."""

    def __init__(
        self,
        data: Any,
        series: Any = None,
        partition_rows: int = DEFAULT_PARTITION_ROWS,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
    ) -> None:
        import pyarrow.dataset as pads

        if isinstance(partition_rows, bool) or not isinstance(partition_rows, int) or partition_rows < 1:
            raise ConfigError(f"partition_rows={partition_rows!r} must be an int >= 1")
        self.skipped = []
        self.series = series
        self.partition_rows = partition_rows
        table = arrow_table(data, series)
        kind = type(data).__name__
        self._fragments: list | None = None
        if isinstance(table, pads.Dataset):
            fragments = list(table.get_fragments())
            if all(isinstance(f, pads.FileFragment) for f in fragments) and fragments:
                self.schema = table.schema
                self._fragments = fragments
                self.description = f"{kind} of {len(fragments)} fragments"
                self._fragment_partitions(partition_bytes)
                return
            log.info("%s has no file fragments; reading it into memory", kind)
            table = table.to_table()
        self._table = table
        self.schema = self._arrow().schema
        self.description = f"{kind} of {self._arrow().num_rows:,} rows"
        self._span, self._stride = 1, 1
        self._run_bounds = self._table_runs()
        self._table_partitions()

    # -- partitions ---------------------------------------------------------------------------

    def _arrow(self) -> Any:
        return self._table.table if isinstance(self._table, _MappedTable) else self._table

    def _fragment_partitions(self, partition_bytes: int) -> None:
        """One partition per fragment; a Parquet fragment larger than ``partition_bytes`` split at row groups."""
        import pyarrow.dataset as pads

        self.partitions = []
        for k, fragment in enumerate(self._fragments or []):
            if isinstance(fragment, pads.ParquetFileFragment):
                fragment.ensure_complete_metadata()
                row_groups = fragment.row_groups
                groups = split_sizes(
                    [fragment.metadata.row_group(g.id).total_byte_size for g in row_groups], partition_bytes
                )
                for positions in groups:
                    rows = sum(row_groups[i].num_rows for i in positions)
                    ids = tuple(row_groups[i].id for i in positions)
                    name = fragment.path if len(groups) == 1 else f"{fragment.path}[row groups {ids[0]}-{ids[-1]}]"
                    if rows:
                        self.partitions.append(Partition(name, rows, (k, ids if len(groups) > 1 else None)))
            else:
                rows = fragment.count_rows()
                if rows:
                    self.partitions.append(Partition(fragment.path, rows, (k, None)))

    def _table_runs(self) -> np.ndarray:
        """``(R + 1,)`` row bounds of the table's series runs (one run without a series column)."""
        table = self._arrow()
        if self.series is None or self.series not in table.schema.names:
            return np.array([0, table.num_rows], dtype=np.int64)
        starts, _ = find_runs(_column_numpy(table.column(self.series)))
        return np.append(starts, table.num_rows).astype(np.int64)

    def _table_partitions(self) -> None:
        """Row ranges ``(first, owned, read)``: whole runs grouped, long runs cut with a halo of span - 1 rows."""
        halo = self._span - 1
        chunk = max(self._stride, self.partition_rows - self.partition_rows % self._stride)
        self.partitions = []
        group_start, group_rows = 0, 0

        def flush(end: int) -> None:
            nonlocal group_start, group_rows
            if group_rows:
                name = f"rows {group_start}-{end - 1}"
                self.partitions.append(Partition(name, group_rows, (group_start, group_rows, group_rows)))
            group_start, group_rows = end, 0

        bounds = self._run_bounds
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            n = hi - lo
            if n <= self.partition_rows:
                if group_rows and group_rows + n > self.partition_rows:
                    flush(lo)
                group_start = lo if not group_rows else group_start
                group_rows += n
                continue
            flush(lo)
            for a in range(lo, hi, chunk):
                own = min(chunk, hi - a)
                self.partitions.append(Partition(f"rows {a}-{a + own - 1}", own, (a, own, min(own + halo, hi - a))))
            group_start = hi
        flush(int(bounds[-1]))

    def set_window(self, span: int, stride: int) -> None:
        if self._fragments is None and (span, stride) != (self._span, self._stride):
            self._span, self._stride = span, stride
            self._table_partitions()

    # -- reading ------------------------------------------------------------------------------

    def column_names(self) -> list:
        return list(self.schema.names)

    def read(self, index: int, columns: Sequence) -> dict:
        key = self.partitions[index].key
        columns = list(columns)
        if self._fragments is None:
            first, _, count = key
            table = self._arrow().slice(first, count).select(columns)
        else:
            k, row_groups = key
            fragment = self._fragments[k]
            if row_groups is not None:
                fragment = fragment.subset(row_group_ids=list(row_groups))
            table = fragment.to_table(columns=columns, schema=self.schema, use_threads=False)
        return {col: _column_numpy(table.column(col)) for col in columns}

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, ...]:
        if self._fragments is None and series is None:
            _, _, count = self.partitions[index].key  # the whole range is one run (halo included)
            return np.zeros(1, np.int64), np.array([count], np.int64), np.array([index])
        if self._fragments is None and series != self.series:
            raise ConfigError(f"series={series!r} differs from the series column {self.series!r} the table was cut by")
        return super().read_runs(index, series)
