"""Partitioned Parquet on any fsspec filesystem, read with pyarrow.

The listing is one ``find`` (or ``glob``) and the footers are read once, when
the dataset is opened: concurrently in one ``cat_ranges`` call of every
file's last ``FOOTER_BYTES`` on an object store, in blocks of files per
thread on local disk. The parsed footers travel with the source into
DataLoader workers, so no epoch and no worker lists or reads a footer again.

Reading a partition then costs one ``cat_ranges`` call of its column chunks,
chunks closer than ``max_gap`` merged into one request, and pyarrow is handed
the footer parsed at open, so it asks for nothing else: one request per
partition for the files of a typical dataset. Local files stay on pyarrow's
own file reader. A file with more than ``partition_bytes`` uncompressed bytes
is split at row-group boundaries; such a partition reads ``window + horizon -
1`` rows into the next row groups of its file (its halo), so the windows that
cross the cut are kept, each yielded once, by the partition where it starts.
``read_rows`` / ``read_ranges`` read only the row groups covering row ranges
(the loader's pieces: a buffer's pieces of one partition in one call, one
coalesced request on an object store).

Transient store errors are retried (``retry.RetryPolicy``). A file whose
footer cannot be read raises, or with ``on_error="skip"`` is left out and
recorded in ``skipped``. The trade-off of merging ranges: up to ``max_gap``
bytes of unwanted columns may be fetched to save a request.
"""
from __future__ import annotations

import bisect
import io
import logging
import os
import posixpath
import pickle
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError, SourceReadError
from dask_windows.faults import (
    check_on_error,
    describe_failure,
    error_text,
    is_transient,
    opening_skip_allowed,
    record_skip,
)
from dask_windows.sources.retry import RetryPolicy, resolve_retry
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES, Partition, Source
from dask_windows.windows import find_runs, join_runs

__all__ = ["ParquetSource"]

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
#: Bytes fetched from the end of each remote file to find its footer (one request when it fits).
FOOTER_BYTES = 64 * 2**10
#: Column chunks of one partition closer than this are fetched in one request.
MAX_GAP = 64 * 2**10
#: Files whose tails are fetched by one ``cat_ranges`` call at open (bounds the tails held in memory).
TAIL_BATCH = 512


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
        self._manifest = self._load_manifest(data)
        self._halo = 0  # rows a partition reads past its end, inside its file (set_window)

    def set_window(self, span: int, stride: int) -> None:
        self._halo = max(span - 1, 0)

    def _file_rows(self, index: int) -> tuple[np.ndarray, int, int]:
        """``(row group bounds of the file, file row of the partition's first row, readable rows)``."""
        path, row_groups = self.partitions[index].key
        known = self.__dict__.setdefault("_row_group_bounds", {})
        bounds = known.get(path)
        if bounds is None:
            meta = self._footers[path].metadata
            bounds = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])  # (G+1,)
            known[path] = bounds
        first = int(bounds[row_groups[0]])
        rows = self.partitions[index].num_rows
        return bounds, first, rows + min(getattr(self, "_halo", 0), int(bounds[-1]) - first - rows)

    def readable_rows(self, index: int) -> int:
        return self._file_rows(index)[2]

    def read_rows(self, index: int, columns: Sequence, lo: int, hi: int) -> dict:
        """Rows ``[lo, hi)`` (partition rows, halo included): only the row groups covering them."""
        bounds, first, readable = self._file_rows(index)
        lo, hi = max(lo, 0), min(hi, readable)
        if hi <= lo:
            data = self._read_groups(index, self.partitions[index].key[1][:1], columns)
            return {col: values[:0] for col, values in data.items()}
        g0 = int(np.searchsorted(bounds, first + lo, side="right")) - 1
        g1 = int(np.searchsorted(bounds, first + hi, side="left"))
        data = self._read_groups(index, tuple(range(g0, g1)), columns)
        a = first + lo - int(bounds[g0])
        return {col: values[a : a + hi - lo] for col, values in data.items()}

    def read_ranges(self, index: int, columns: Sequence, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        """Each of ``ranges`` (partition rows, halo included) from one read of the row groups covering any of
        them: one coalesced request on an object store, row groups between the ranges left out."""
        bounds, first, readable = self._file_rows(index)
        spans = []
        for lo, hi in ranges:
            lo, hi = max(lo, 0), min(hi, readable)
            g0 = int(np.searchsorted(bounds, first + lo, side="right")) - 1
            g1 = max(int(np.searchsorted(bounds, first + hi, side="left")), g0 + 1)
            spans.append((lo, max(hi, lo), g0, g1))
        needed = sorted({g for _, _, g0, g1 in spans for g in range(g0, g1)})
        data = self._read_groups(index, tuple(needed), columns)
        at, pos = {}, 0  # row of ``data`` where each needed row group begins
        for g in needed:
            at[g] = pos
            pos += int(bounds[g + 1] - bounds[g])
        out = []
        for lo, hi, g0, _ in spans:
            a = at[g0] + first + lo - int(bounds[g0])
            out.append({col: values[a : a + hi - lo] for col, values in data.items()})
        return out

    def _halo_runs(self, index: int, series: Any, runs: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``runs`` of the partition's own rows joined with the runs of its halo rows."""
        rows = self.partitions[index].num_rows
        extra = self.readable_rows(index) - rows
        if extra <= 0:
            return runs
        if series is None:
            starts, lengths, keys = runs
            return starts, lengths + np.where(np.arange(len(lengths)) == len(lengths) - 1, extra, 0), keys
        keys = self.read_rows(index, [series], rows, rows + extra)[series]
        starts, lengths = find_runs(keys)
        return join_runs([runs, (starts + rows, lengths, keys[starts])])

    def _load_manifest(self, data: Any) -> dict | None:
        """Series runs per file from a ``dask-windows convert`` manifest, if it matches the files.

        Returns ``{"series": column, "runs": {path: (starts, lengths, keys)}}``, or ``None`` when the
        folder has no manifest or it does not describe exactly these files and row counts (then
        the series column is scanned as usual).
        """
        from dask_windows.sources.manifest import read_manifest

        if not isinstance(data, (str, os.PathLike)) or any(ch in os.fspath(data) for ch in "*?["):
            return None
        root = self.fs._strip_protocol(os.fspath(data)).rstrip("/")
        if not self.fs.isdir(root):
            return None
        manifest = read_manifest(root, self.fs)
        if manifest is None:
            return None
        entries = {posixpath.join(root, f["path"]): f for f in manifest["files"]}
        runs = {}
        for path in self.files:
            entry = entries.get(path)
            if entry is None or entry["rows"] != self._footers[path].metadata.num_rows:
                log.warning("the manifest of %s does not match %s; scanning the series column instead", root, path)
                return None
            table = entry["runs"]
            starts = np.array([r[0] for r in table], dtype=np.int64)
            lengths = np.array([r[1] for r in table], dtype=np.int64)
            runs[path] = (starts, lengths, np.array([r[2] for r in table]))
        return {"series": manifest["series"], "runs": runs}

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Runs from the manifest when it covers ``series``, else from the series column."""
        manifest = getattr(self, "_manifest", None)
        if series is None or manifest is None or manifest["series"] != series:
            return self._halo_runs(index, series, super().read_runs(index, series))
        path, row_groups = self.partitions[index].key
        meta = self._footers[path].metadata
        first = sum(meta.row_group(g).num_rows for g in range(row_groups[0]))  # file row of the partition
        last = first + self.readable_rows(index)  # the halo's runs too
        starts, lengths, keys = manifest["runs"][path]
        ends = starts + lengths
        keep = (ends > first) & (starts < last)  # runs overlapping the partition, clipped to it
        lo, hi = np.maximum(starts[keep], first), np.minimum(ends[keep], last)
        return lo - first, hi - lo, keys[keep]

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
            if not opening_skip_allowed(self.on_error, result):
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
        """Every file's last ``FOOTER_BYTES``, fetched concurrently; a second fetch only for a bigger footer.

        An async filesystem (s3fs, gcsfs, adlfs) fetches ``TAIL_BATCH`` tails per ``cat_ranges`` call,
        concurrently on its event loop; another filesystem fetches them on ``threads`` threads.
        Each batch is parsed before the next is fetched, so at most ``TAIL_BATCH`` tails are held.
        """
        results: list = []
        for lo in range(0, len(files), TAIL_BATCH):
            batch = files[lo : lo + TAIL_BATCH]
            results += self._remote_footer_batch(batch, sizes[lo : lo + TAIL_BATCH], threads)
        return results

    def _fetch_tails(self, files: list[str], threads: int) -> list:
        """The last ``FOOTER_BYTES`` of each file, or the exception fetching it raised."""
        if getattr(self.fs, "async_impl", False):
            return self.retry.call(
                lambda: self.fs.cat_ranges(files, [-FOOTER_BYTES] * len(files), [None] * len(files), on_error="return"),
                self.description,
            )

        def tail(path: str) -> Any:
            try:
                return self.fs.cat_file(path, start=-FOOTER_BYTES)
            except Exception as exc:
                return exc

        return _map_in_blocks(tail, files, threads)

    def _remote_footer_batch(self, files: list[str], sizes: list[int | None], threads: int) -> list:
        tails = self._fetch_tails(files, threads)

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
                # Without a listed size a lower bound is enough: pyarrow only checks chunks lie inside the file.
                ends = [b for _, b in _chunk_ranges(meta, range(meta.num_row_groups), [])]
                return _Footer(meta, max(size or 0, max(ends, default=4) + needed))
            except Exception as exc:
                return exc

        return _map_in_blocks(footer, list(zip(files, sizes, tails)), threads)

    def _open_error(self, path: str, exc: BaseException) -> SourceReadError:
        url = self._url(path)
        if is_transient(exc):
            return SourceReadError(
                f"cannot read the Parquet footer of {url}{describe_failure(exc)}: {error_text(exc)}; "
                "the store kept failing; check the connection or pass a larger retries= (a file failing this "
                "way is not skipped while opening, even with on_error='skip', so every rank opens the same dataset)"
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
        return self._read_groups(index, self.partitions[index].key[1], columns)

    def read_chunks(self, index: int, columns: Sequence) -> Iterator[dict]:
        """Local files one row group at a time (a column scan holds one row group in memory);
        remote files in one request."""
        row_groups = self.partitions[index].key[1]
        if not self.local:
            yield self._read_groups(index, row_groups, columns)
            return
        for g in row_groups:
            yield self._read_groups(index, (g,), columns)

    def _read_groups(self, index: int, row_groups: Sequence[int], columns: Sequence) -> dict:
        part = self.partitions[index]
        path = part.key[0]
        try:
            table = self.retry.call(lambda: self._read_table(path, row_groups, columns), self._url(path))
        except Exception as exc:
            name = self._url(path) + part.name[len(path) :]
            if isinstance(exc, FileNotFoundError):
                raise SourceReadError(
                    f"cannot read {name}: it no longer exists ({error_text(exc)}); the dataset changed after it "
                    "was opened; open it again, or pass on_error='skip'"
                ) from exc
            if is_transient(exc):
                raise SourceReadError(
                    f"cannot read {name}{describe_failure(exc)}: {error_text(exc)}; the store kept "
                    "failing; check the connection or pass a larger retries=, or on_error='skip'"
                ) from exc
            raise SourceReadError(
                f"cannot read {name}: {error_text(exc)}; the file may be truncated or corrupt; "
                "rewrite it or remove it from the dataset, or pass on_error='skip'"
            ) from exc
        expected = part.num_rows if tuple(row_groups) == tuple(part.key[1]) else None
        if expected is not None and table.num_rows != expected:
            raise SourceReadError(
                f"{part.name} holds {table.num_rows} rows but its footer said {expected} when the dataset "
                "was opened; the file changed underneath the dataset; open the dataset again"
            )
        return {col: table.column(col).to_numpy() for col in columns}

