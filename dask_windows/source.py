"""Where rows come from: list partitions, count their rows, read their columns.

This is the only module that opens files. A source exposes ``partitions``
(name and row count, known from metadata without reading data) and
``read(i, columns)`` returning one numpy array per column.

Parquet is read with pyarrow through any fsspec filesystem. The listing is
one ``find`` (or ``glob``) and the footers are read once, when the dataset is
opened: concurrently in one ``cat_ranges`` call of file tails on an object
store, in a thread pool on local disk. Reading a partition then costs one
``cat_ranges`` call of its column chunks, merged when they lie close, and no
footer request, because pyarrow is handed the footer parsed at open. Local
files stay on pyarrow's own file reader. A file much larger than
``partition_bytes`` (uncompressed) is split at row-group boundaries.
Transient store errors are retried (``retry.RetryPolicy``); a file whose
footer cannot be read raises, or with ``on_error="skip"`` is left out and
recorded in ``skipped``.

Numpy arrays (and ``.npy`` memmaps) are a source too: each array is one
series, or one 2-D array is cut into series by an id vector. Small series
are grouped into partitions of about ``partition_rows`` rows; a longer one is
cut into partitions of ``partition_rows`` rows that overlap by
``window + horizon - 1`` rows, so no window is lost at a cut. Memmapped rows
are copied once and their pages released, so streaming a memmap larger than
memory keeps the resident set bounded.
"""
from __future__ import annotations

import bisect
import io
import logging
import mmap
import os
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError, SourceReadError
from dask_windows.faults import SkippedPartition, check_on_error, record_skip
from dask_windows.retry import RetryPolicy, describe_failure, error_text, is_transient, resolve_retry
from dask_windows.windows import find_runs

__all__ = [
    "ArraySource",
    "ParquetSource",
    "Partition",
    "PartitionReader",
    "Source",
    "is_series_vector",
    "open_source",
]

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
DEFAULT_PARTITION_BYTES = 256 * 2**20
DEFAULT_PARTITION_ROWS = 1_000_000
#: Bytes fetched from the end of each remote file to find its footer (one request when it fits).
FOOTER_BYTES = 64 * 2**10
#: Column chunks of one partition closer than this are fetched in one request.
MAX_GAP = 64 * 2**10


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
    skipped: list[SkippedPartition] = []

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
        keys = self.read(index, [series])[series]
        starts, lengths = find_runs(keys)
        return starts, lengths, keys[starts]

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


# -- Parquet on any fsspec filesystem ----------------------------------------------------------


def _list_files(data: Any, storage_options: dict | None) -> tuple[Any, list[str], list[int | None], str]:
    """Resolve a path, glob, URL or list of them to ``(fs, files, sizes, description)`` in one listing."""
    import fsspec

    options = dict(storage_options or {})
    if isinstance(data, (str, os.PathLike)):
        url = os.fspath(data)
        fs, root = fsspec.core.url_to_fs(url, **options)
        if any(ch in root for ch in "*?["):
            found = fs.glob(root, detail=True)
            infos = {p: i for p, i in found.items() if i.get("type", "file") == "file"}
        else:
            found = fs.find(root, detail=True)  # recursive, paginated: one listing however many files
            infos = {p: i for p, i in found.items() if i.get("type", "file") == "file"}
            if not infos and not fs.exists(root):
                raise FileNotFoundError(f"{url} does not exist; pass a Parquet file, a folder of them, a glob or a list")
            stripped = root.rstrip("/")
            if len(infos) > 1 or stripped not in {p.rstrip("/") for p in infos}:
                infos = {p: i for p, i in infos.items() if not _hidden(p, root)}
                parquet = {p: i for p, i in infos.items() if p.endswith(PARQUET_SUFFIXES)}
                infos = parquet or infos
        files = sorted(infos)
        if not files:
            raise FileNotFoundError(f"no Parquet files under {url}; expected files ending in {PARQUET_SUFFIXES}")
        return fs, files, [infos[p].get("size") for p in files], url
    paths = [os.fspath(p) for p in data]
    if not paths:
        raise ConfigError("an empty list of paths was given; pass at least one Parquet file")
    fs, _ = fsspec.core.url_to_fs(paths[0], **options)
    files = [fsspec.core.url_to_fs(p, **options)[1] for p in paths]
    description = f"{paths[0]} (+{len(paths) - 1} files)" if len(paths) > 1 else paths[0]
    return fs, files, [None] * len(files), description


def _hidden(path: str, root: str) -> bool:
    rel = path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/")) else path
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


def _map_in_blocks(fn: Any, items: list, threads: int) -> list:
    """``[fn(item) for item in items]`` on ``threads`` threads, a contiguous block of items per task.

    Blocks rather than one task per item: for thousands of small files the thread hand-offs
    would cost more than the footers.
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    bounds = np.linspace(0, len(items), min(len(items), threads * 4) + 1).astype(int)
    blocks = [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    with ThreadPoolExecutor(min(threads, len(blocks))) as pool:
        return [result for block in pool.map(lambda b: [fn(item) for item in b], blocks) for result in block]


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _parse_footer(tail: bytes, path: str) -> tuple[Any, int]:
    """``(metadata, bytes needed)`` from the last bytes of a Parquet file; metadata ``None`` if ``tail`` is short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(tail) < 12 or tail[-4:] != b"PAR1":
        raise SourceReadError(f"{path} does not end with the Parquet magic bytes: it is not Parquet or is truncated")
    needed = int.from_bytes(tail[-8:-4], "little") + 8
    if needed > len(tail):
        return None, needed
    return pq.read_metadata(pa.BufferReader(tail[-needed:])), needed


@dataclass(frozen=True)
class _Footer:
    """What was learnt of one file at open: its parsed footer and (a lower bound of) its size."""

    metadata: Any
    size: int


def _chunk_ranges(meta: Any, row_groups: Sequence[int], columns: Sequence) -> list[tuple[int, int]]:
    """Sorted ``[start, stop)`` byte ranges of the column chunks of ``columns`` in ``row_groups``."""
    wanted = {str(c) for c in columns}
    ranges = []
    for g in row_groups:
        group = meta.row_group(g)
        chunks = [group.column(j) for j in range(group.num_columns)]
        picked = [c for c in chunks if c.path_in_schema.split(".")[0] in wanted or c.path_in_schema in wanted]
        for chunk in picked or chunks:
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                start = chunk.dictionary_page_offset
            ranges.append((start, start + chunk.total_compressed_size))
    return sorted(ranges)


def _merge_ranges(ranges: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """Merge sorted ranges closer than ``max_gap`` bytes, so a partition costs few requests."""
    merged: list[list[int]] = []
    for start, stop in ranges:
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [(a, b) for a, b in merged]


class _FetchedFile(io.RawIOBase):
    """A read-only file made of the byte ranges already fetched; other reads fetch (and are logged)."""

    def __init__(self, fs: Any, path: str, size: int, ranges: list[tuple[int, int]], blobs: list[bytes]) -> None:
        super().__init__()
        self._fs, self._path, self._size = fs, path, size
        self._starts = [a for a, _ in ranges]
        self._blobs = [memoryview(b) for b in blobs]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._pos
        start, stop = self._pos, min(self._pos + size, self._size)
        k = bisect.bisect_right(self._starts, start) - 1
        if k >= 0 and stop <= self._starts[k] + len(self._blobs[k]):
            offset = start - self._starts[k]
            data = bytes(self._blobs[k][offset : offset + stop - start])
        else:
            log.debug("read of %s bytes %d-%d outside the prefetched ranges", self._path, start, stop)
            data = self._fs.cat_file(self._path, start=start, end=stop) if stop > start else b""
        self._pos = start + len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class ParquetSource(Source):
    """Partitioned Parquet on any fsspec filesystem.

    Args:
        data: A file, folder, glob or URL, or a list of them (taken in the given order).
        storage_options: Passed to fsspec (credentials, endpoint, ...).
        partition_bytes: Files with more uncompressed bytes are split at row-group boundaries.
        threads: Threads reading footers when the dataset is opened (local files).
        retry: Retries of transient store errors (an int of retries or a ``RetryPolicy``).
        on_error: ``"raise"`` on a file whose footer cannot be read, or ``"skip"`` it (recorded in ``skipped``).
        max_gap: Column chunks of a partition closer than this many bytes are fetched in one request.
    """

    def __init__(
        self,
        data: Any,
        storage_options: dict | None = None,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
        threads: int = 16,
        retry: int | RetryPolicy | None = None,
        on_error: str = "raise",
        max_gap: int = MAX_GAP,
    ) -> None:
        self.retry = resolve_retry(retry)
        self.on_error = check_on_error(on_error)
        self.max_gap = max_gap
        self.storage_options = storage_options
        self.skipped = []
        target = os.fspath(data) if isinstance(data, (str, os.PathLike)) else f"{len(data)} paths"
        self.fs, files, sizes, self.description = self.retry.call(lambda: _list_files(data, storage_options), target)
        self.local = _is_local(self.fs)
        self._pid = os.getpid()
        footers = self._read_footers(files, sizes, threads)
        self.files = [path for path in files if path in footers]
        self._footers = footers
        self._schemas = [footers[path].metadata.schema.to_arrow_schema() for path in self.files]
        if not self.files:
            raise SourceReadError(f"no readable Parquet file in {self.description}: every footer failed to read")
        self.partitions = []
        for path in self.files:
            meta = footers[path].metadata
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

    # -- opening ------------------------------------------------------------------------------

    def _read_footers(self, files: list[str], sizes: list[int | None], threads: int) -> dict[str, _Footer]:
        """Footers of ``files``; unreadable ones raise, or are recorded and left out with ``on_error="skip"``."""
        if self.local:
            results = self._local_footers(files, threads)
        else:
            results = self._remote_footers(files, sizes, threads)
        footers = {}
        for path, result in zip(files, results):
            if isinstance(result, _Footer):
                footers[path] = result
                continue
            if self.on_error == "raise":
                raise self._open_error(path, result) from result
            record_skip(self.skipped, self._url(path), "open", result)
        return footers

    def _local_footers(self, files: list[str], threads: int) -> list:
        import pyarrow.parquet as pq

        def footer(path: str) -> Any:
            try:
                meta = self.retry.call(lambda: pq.read_metadata(path), path)
                return _Footer(meta, os.path.getsize(path))
            except Exception as exc:
                return exc

        return _map_in_blocks(footer, files, threads)

    def _remote_footers(self, files: list[str], sizes: list[int | None], threads: int) -> list:
        """One concurrent ``cat_ranges`` of every file's last ``FOOTER_BYTES``; a second fetch only for big footers."""
        tails = self.retry.call(
            lambda: self.fs.cat_ranges(files, [-FOOTER_BYTES] * len(files), [None] * len(files), on_error="return"),
            self.description,
        )

        def footer(item: tuple[str, int | None, Any]) -> Any:
            path, size, tail = item
            try:
                if isinstance(tail, BaseException):
                    if not is_transient(tail):
                        raise tail
                    tail = self.retry.call(lambda: self.fs.cat_file(path, start=-FOOTER_BYTES), path)
                meta, needed = _parse_footer(tail, path)
                if meta is None:
                    if len(tail) < FOOTER_BYTES:
                        raise SourceReadError(
                            f"{path} is shorter ({len(tail):,} bytes) than its footer claims ({needed:,} bytes)"
                        )
                    tail = self.retry.call(lambda: self.fs.cat_file(path, start=-needed), path)
                    meta, needed = _parse_footer(tail, path)
                if size is None:  # a lower bound is enough: pyarrow only checks chunks lie inside the file
                    ends = [b for _, b in _chunk_ranges(meta, range(meta.num_row_groups), [])]
                    size = max(ends, default=4) + needed
                return _Footer(meta, size)
            except Exception as exc:
                return exc

        return _map_in_blocks(footer, list(zip(files, sizes, tails)), threads)

    def _open_error(self, path: str, exc: BaseException) -> SourceReadError:
        url = self._url(path)
        if is_transient(exc):
            return SourceReadError(
                f"cannot read the Parquet footer of {url}{describe_failure(exc)}: {error_text(exc)}; "
                "the store kept failing; check the connection or pass a larger retries=, "
                "or on_error='skip' to leave the file out"
            )
        return SourceReadError(
            f"cannot read the Parquet footer of {url}: {error_text(exc)}; the file is not Parquet, "
            "truncated or corrupt; rewrite it or remove it from the dataset, or pass on_error='skip' to leave it out"
        )

    def _url(self, path: str) -> str:
        """``path`` with the filesystem's protocol, for messages (``s3://bucket/key``)."""
        if self.local:
            return path
        try:
            return self.fs.unstrip_protocol(path)
        except Exception:  # pragma: no cover - filesystems without unstrip_protocol
            return path

    # -- schema -------------------------------------------------------------------------------

    def column_names(self) -> list:
        return list(self._schemas[0].names)

    def check_columns(self, columns: Sequence, what: dict) -> None:
        first = self._schemas[0]
        for path, schema in zip(self.files, self._schemas):
            for col in columns:
                role = what.get(col, "column")
                if col not in schema.names:
                    raise SchemaError(
                        f"{role} {col!r} is missing from {self._url(path)} (its columns: {schema.names}); "
                        f"every file of {self.description} must hold the feature, target and series columns"
                    )
                if col in first.names and schema.field(col).type != first.field(col).type:
                    raise SchemaError(
                        f"schema mismatch: column {col!r} is {schema.field(col).type} in {self._url(path)} but "
                        f"{first.field(col).type} in {self._url(self.files[0])}; rewrite the files with one schema"
                    )

    # -- reading ------------------------------------------------------------------------------

    def _filesystem(self) -> Any:
        """The filesystem, rebuilt once in a forked process (async filesystems are not fork-safe)."""
        if self._pid != os.getpid():
            self.fs = pickle.loads(pickle.dumps(self.fs))
            self._pid = os.getpid()
        return self.fs

    def _read_table(self, path: str, row_groups: Sequence[int], columns: Sequence) -> Any:
        import pyarrow.parquet as pq

        footer = self._footers[path]
        if self.local:
            file: Any = path
        else:
            fs = self._filesystem()
            ranges = _merge_ranges(_chunk_ranges(footer.metadata, row_groups, columns), self.max_gap)
            blobs = fs.cat_ranges(
                [path] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges], on_error="raise"
            )
            file = _FetchedFile(fs, path, footer.size, ranges, blobs)
        reader = pq.ParquetFile(file, metadata=footer.metadata, pre_buffer=False)
        return reader.read_row_groups(list(row_groups), columns=list(columns), use_threads=False)

    def read(self, index: int, columns: Sequence) -> dict:
        part = self.partitions[index]
        path, row_groups = part.key
        try:
            table = self.retry.call(lambda: self._read_table(path, row_groups, columns), self._url(path))
        except Exception as exc:
            name = self._url(path) + part.name[len(path) :]
            if is_transient(exc):
                raise SourceReadError(
                    f"cannot read {name}{describe_failure(exc)}: {error_text(exc)}; the store kept "
                    "failing; check the connection or pass a larger retries=, or on_error='skip'"
                ) from exc
            raise SourceReadError(
                f"cannot read {name}: {error_text(exc)}; the file may be truncated or corrupt; "
                "rewrite it or remove it from the dataset, or pass on_error='skip'"
            ) from exc
        if table.num_rows != part.num_rows:
            raise SourceReadError(
                f"{part.name} holds {table.num_rows} rows but its footer said {part.num_rows} when the dataset "
                "was opened; the file changed underneath the dataset; open the dataset again"
            )
        return {col: table.column(col).to_numpy() for col in columns}


# -- numpy arrays and memmaps ------------------------------------------------------------------


def is_series_vector(series: Any) -> bool:
    """Whether ``series`` is a per-row id vector (for one 2-D array) rather than a column name."""
    return isinstance(series, (np.ndarray, list, tuple)) or (
        hasattr(series, "__array__") and hasattr(series, "__len__") and not isinstance(series, str)
    )


def _memmap_of(array: np.ndarray) -> Any:
    """The ``np.memmap`` whose mapping ``array`` views, or ``None``."""
    a: Any = array
    for _ in range(16):
        if isinstance(a, np.memmap) and getattr(a, "_mmap", None) is not None:
            return a
        a = getattr(a, "base", None)
        if a is None:
            return None
    return None


def _release_pages(block: np.ndarray, owner: Any) -> None:
    """Drop the resident pages under ``block`` from this process (they stay in the page cache).

    Copy-on-write memmaps (``mode="c"``) are left alone: dropping their pages would drop edits.
    """
    mm = owner._mmap
    if getattr(owner, "mode", "r") == "c" or not hasattr(mm, "madvise") or block.size == 0:
        return
    try:
        base = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    except (TypeError, ValueError):  # pragma: no cover - closed or exotic mapping
        return
    start = block.__array_interface__["data"][0] - base
    begin = start - start % mmap.PAGESIZE
    length = min(start + block.nbytes, len(mm)) - begin
    if begin >= 0 and length > 0:
        mm.madvise(mmap.MADV_DONTNEED, begin, length)


@dataclass(frozen=True)
class _MemmapRef:
    """A C-contiguous block of a ``.npy``/raw file, pickled by reference instead of by value."""

    filename: str
    offset: int
    shape: tuple
    dtype: Any
    mode: str

    def open(self) -> np.ndarray:
        return np.memmap(self.filename, self.dtype, self.mode, self.offset, self.shape, order="C")


def _memmap_ref(array: np.ndarray) -> _MemmapRef | None:
    """How to reopen ``array`` from its file, if it is a C-contiguous view of a file memmap."""
    owner = _memmap_of(array)
    if owner is None or not getattr(owner, "filename", None) or not array.flags.c_contiguous:
        return None
    if getattr(owner, "mode", "r") in ("c", "w+"):  # private edits or a file being written: copy by value
        return None
    base = np.frombuffer(owner._mmap, np.uint8).__array_interface__["data"][0]
    start = owner.offset - owner.offset % mmap.ALLOCATIONGRANULARITY  # where numpy mapped the file from
    offset = start + array.__array_interface__["data"][0] - base
    return _MemmapRef(owner.filename, offset, tuple(array.shape), array.dtype, "r" if owner.mode == "r" else "r+")


class ArraySource(Source):
    """Numpy arrays or ``.npy`` memmaps, each ``(rows, C)`` and one series.

    Args:
        arrays: The series, in canonical order.
        partition_rows: Consecutive small arrays are grouped into partitions of about this many rows;
            a longer array is cut into partitions of this many rows (overlapping by a window's span).
        series_ids: Per array, the series id reported as the run key (default: the array's position).
    """

    def __init__(
        self,
        arrays: Sequence[np.ndarray],
        partition_rows: int = DEFAULT_PARTITION_ROWS,
        series_ids: Sequence | None = None,
    ) -> None:
        arrays = list(arrays)
        if not arrays:
            raise ConfigError("an empty list of arrays was given; pass at least one (rows, C) array")
        if isinstance(partition_rows, bool) or not isinstance(partition_rows, int) or partition_rows < 1:
            raise ConfigError(f"partition_rows={partition_rows!r} must be an int >= 1")
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
        self.series_ids = np.arange(len(arrays)) if series_ids is None else np.asarray(series_ids)
        self.partition_rows = partition_rows
        self.description = f"{len(arrays)} arrays"
        self.skipped = []
        self._span, self._stride = 1, 1
        self._build()

    @classmethod
    def from_series(
        cls, array: np.ndarray, series: Any, partition_rows: int = DEFAULT_PARTITION_ROWS
    ) -> ArraySource:
        """One ``(rows, C)`` array (or memmap) cut into series where ``series`` (a ``(rows,)`` id vector) changes.

        Each series is a view of ``array``: nothing is copied until a partition is read.
        """
        ids = np.asarray(series)
        if ids.ndim != 1 or len(ids) != len(array):
            raise ConfigError(
                f"series has shape {ids.shape} but the array has {len(array)} rows; pass one series id per row"
            )
        starts, lengths = find_runs(ids)
        source = cls([array[s : s + n] for s, n in zip(starts, lengths)], partition_rows, ids[starts])
        source.description = f"array of shape {tuple(array.shape)} with {len(starts)} series runs"
        return source

    def _build(self) -> None:
        """Group short arrays, cut long ones; a piece is ``(array, first row, rows owned, rows read)``."""
        halo = self._span - 1
        chunk = max(self._stride, self.partition_rows - self.partition_rows % self._stride)
        self.partitions = []
        group: list[tuple[int, int, int, int]] = []
        rows = 0

        def flush() -> None:
            nonlocal group, rows
            if group:
                ids = [p[0] for p in group]
                name = f"array[{ids[0]}]" if len(ids) == 1 else f"arrays[{ids[0]}:{ids[-1] + 1}]"
                self.partitions.append(Partition(name, rows, tuple(group)))
            group, rows = [], 0

        for i, a in enumerate(self.arrays):
            n = len(a)
            if n <= self.partition_rows:
                group.append((i, 0, n, n))
                rows += n
                if rows >= self.partition_rows:
                    flush()
                continue
            flush()
            for lo in range(0, n, chunk):
                own = min(chunk, n - lo)
                piece = (i, lo, own, min(own + halo, n - lo))
                self.partitions.append(Partition(f"array[{i}][{lo}:{lo + own}]", own, (piece,)))
        flush()

    def set_window(self, span: int, stride: int) -> None:
        if (span, stride) != (self._span, self._stride):
            self._span, self._stride = span, stride
            self._build()

    def column_names(self) -> list:
        return list(range(self.width))

    def read(self, index: int, columns: Sequence) -> dict:
        pieces = self.partitions[index].key
        blocks = []
        for i, lo, _, count in pieces:
            block = self.arrays[i][lo : lo + count]
            owner = _memmap_of(block)
            if owner is not None:  # one sequential copy, then let the kernel have the pages back
                copy = np.array(block)
                _release_pages(block, owner)
                block = copy
            blocks.append(block)
        if len(blocks) == 1:
            return {col: blocks[0][:, col] for col in columns}
        return {col: np.concatenate([b[:, col] for b in blocks]) for col in columns}

    def __getstate__(self) -> dict:
        """Memmaps travel to DataLoader workers as file references, not as copies of their data."""
        state = dict(self.__dict__)
        state["arrays"] = [_memmap_ref(a) or a for a in self.arrays]
        return state

    def __setstate__(self, state: dict) -> None:
        state["arrays"] = [a.open() if isinstance(a, _MemmapRef) else a for a in state["arrays"]]
        self.__dict__.update(state)

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if series is not None:
            raise ConfigError(
                f"series={series!r} cannot be used with a list of arrays: each array is one series; pass series=None, "
                "or one 2-D array with a per-row series id vector"
            )
        pieces = self.partitions[index].key
        lengths = np.array([count for _, _, _, count in pieces], dtype=np.int64)
        keys = self.series_ids[[i for i, _, _, _ in pieces]]
        return np.cumsum(lengths) - lengths, lengths, keys


# -- choosing a source -------------------------------------------------------------------------


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
        options.pop("partition_rows", None)
        if threads is not None:
            options["threads"] = threads
        return ParquetSource(data, storage_options, retry=retry, on_error=on_error, **options)
    if type(data).__module__.startswith("dask"):
        from dask_windows.dask_source import DaskSource

        options.pop("partition_bytes", None)
        options.pop("partition_rows", None)
        return DaskSource(data, series=series, retry=retry, on_error=on_error, **options)
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

