"""Opening Parquet files for ``ParquetSource`` (a mixin): one tail read per file, schemas shared.

Unreadable files raise, or are recorded and left out with ``on_error="skip"``. Local opening is
CPU work once files are cached, so it stays on one thread while that thread computes and goes to
``LOCAL_OPEN_THREADS`` threads only while it waits (threads trading the GIL cost more CPU). A
file the fast local path cannot open is opened again the retried way, which reports the fault."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from dask_windows.errors import SourceReadError
from dask_windows.errors.faults import (
    SkippedPartition,
    classify,
    error_text,
    failure_message,
    is_transient,
    opening_skip_allowed,
    record_skip,
)
from dask_windows.errors.remedies import wrong_format
from dask_windows.runtime.prefetch import fork_safe_lock
from dask_windows.settings.tuning import LOCAL_OPEN_THREADS, PROBE_FILES
from dask_windows.sources.identity import FileIdentity
from dask_windows.sources.parquet.footers import (
    FOOTER_BYTES,
    TAIL_BATCH,
    Footer,
    footer_reader,
    map_in_blocks,
    pack_runs,
    read_local,
    split_sizes,
    tail_runs,
)
from dask_windows.sources.parquet.ranges import chunk_ranges
from dask_windows.sources.retry import DeadlineExceeded, RetryPolicy

__all__ = ["LOCAL_OPEN_THREADS", "ParquetOpening", "number_schemas"]


log = logging.getLogger("dask_windows.sources.parquet")


class _Opened(NamedTuple):
    """One file as opened; only ``footer`` is kept after opening."""

    footer: Footer
    schema: Any  # pyarrow.Schema without its metadata
    splits: list[tuple[int, ...]]  # row groups of each partition
    runs: tuple | None  # series runs of the whole file when the tail read told them (maybe packed)
    identity: FileIdentity | None = None  # a local file's size and mtime from the fstat of its open


class ParquetOpening:
    """``ParquetSource``'s opening of its files (a mixin: ``ParquetSource`` sets the attributes)."""

    fs: Any
    local: bool
    retry: RetryPolicy
    on_error: str
    description: str
    skipped: list[SkippedPartition]

    if TYPE_CHECKING:

        def _url(self, path: str) -> str: ...

    def _open_files(
        self, files: list[str], sizes: list[int | None], threads: int, partition_bytes: int, series: str | None
    ) -> dict[str, _Opened]:
        """Every file opened from one tail read; unreadable ones raise, or with ``on_error="skip"`` are
        recorded and left out. Remote tails are fetched ``TAIL_BATCH`` at a time (concurrently in one
        ``cat_ranges`` call on an async filesystem, else on ``threads`` threads), each batch parsed
        before the next is fetched."""

        def one(item: tuple) -> _Opened | BaseException:
            try:
                path, size, tail = item
                return self._open_file(path, size, tail, partition_bytes, series)
            except Exception as exc:
                return exc

        def one_local(path: str) -> _Opened | BaseException:
            try:
                return self._open_local_file(path, partition_bytes, series)
            except Exception:  # opened again the retried way, which reports what is wrong
                return one((path, None, None))

        results: list = []
        if self.local:
            results = _open_local(one_local, files, min(threads, LOCAL_OPEN_THREADS))
        else:
            for lo in range(0, len(files), TAIL_BATCH):
                batch = files[lo : lo + TAIL_BATCH]
                try:
                    tails = self._fetch_tails(batch, threads)
                except DeadlineExceeded as exc:
                    tails = [exc] * len(batch)
                results += map_in_blocks(one, list(zip(batch, sizes[lo : lo + TAIL_BATCH], tails)), threads)
        opened = {}
        for path, result in zip(files, results):
            if isinstance(result, _Opened):
                opened[path] = result
                continue
            if not opening_skip_allowed(self.on_error, result):
                raise self._open_error(path, result) from result
            record_skip(self.skipped, self._url(path), "open", result)
        self.__dict__.pop("_open_schemas", None)  # only while opening
        return opened

    def _fetch_tails(self, files: list[str], threads: int) -> list:
        """The last ``FOOTER_BYTES`` of each remote file, or the exception fetching it raised."""
        if getattr(self.fs, "async_impl", False):
            return self.retry.call(
                lambda: self.fs.cat_ranges(files, [-FOOTER_BYTES] * len(files), [None] * len(files), on_error="return"),
                self.description,
                timeout=self.retry.open_timeout,
            )

        def tail(path: str) -> Any:
            try:
                return self.fs.cat_file(path, start=-FOOTER_BYTES)
            except Exception as exc:
                return exc

        return map_in_blocks(tail, files, threads)

    def _tail(self, path: str, nbytes: int) -> tuple[bytes, int | None]:
        """``(last nbytes of path, its size or None)``, retried."""
        if self.local:
            tail, stat = self.retry.call(lambda: read_local(path, nbytes), path)
            return tail, stat.st_size
        return self.retry.call(
            lambda: self.fs.cat_file(path, start=-nbytes), path, timeout=self.retry.open_timeout
        ), None

    def _open_file(self, path: str, size: int | None, tail: Any, partition_bytes: int, series: str | None) -> _Opened:
        """Open one file from its tail (``None``: read it here; an exception: fetching it failed)."""
        if tail is None or isinstance(tail, BaseException):
            if isinstance(tail, BaseException) and (isinstance(tail, DeadlineExceeded) or not is_transient(tail)):
                raise tail  # past the deadline: no second wait per file
            tail, found = self._tail(path, FOOTER_BYTES)
            size = found if found is not None else size
        reader, needed = footer_reader(tail, path)
        if reader is None:
            if len(tail) < FOOTER_BYTES:
                raise SourceReadError(
                    f"{path} is shorter ({len(tail):,} bytes) than its footer claims ({needed:,} bytes)"
                )
            tail, _ = self._tail(path, needed)
            reader, needed = footer_reader(tail, path)
        return self._opened(path, reader, tail, needed, size, partition_bytes, series)

    def _open_local_file(self, path: str, partition_bytes: int, series: str | None) -> _Opened:
        """Open one local file the fast way (one ``read_local``); raises on anything unusual, and
        ``_open_file`` then opens it the retried way and reports it."""
        tail, stat = read_local(path)
        reader, needed = footer_reader(tail, path)
        if reader is None:
            raise SourceReadError(
                f"{path} is shorter ({stat.st_size:,} bytes) than its footer claims ({needed:,} bytes)"
            )
        identity = FileIdentity(stat.st_size, stat.st_mtime_ns)
        return self._opened(path, reader, tail, needed, stat.st_size, partition_bytes, series, identity)

    def _opened(
        self,
        path: str,
        reader: Any,
        tail: bytes,
        needed: int,
        size: int | None,
        partition_bytes: int,
        series: str | None,
        identity: FileIdentity | None = None,
    ) -> _Opened:
        """One file from its footer, in one walk of its row groups: their rows, the partitions, and the
        series runs the statistics tell (else ``tail_runs``) when the file is one partition."""
        meta = reader.metadata  # never asked for its schema: see footer_reader
        if size is None:  # unlisted: the tail is the whole file, or a lower bound (pyarrow checks chunks lie inside)
            ends = [b for _, b in chunk_ranges(meta, range(meta.num_row_groups), [])]
            size = len(tail) if len(tail) < FOOTER_BYTES else max(ends, default=4) + needed
        schema, column, key_dtype = self._file_schema(reader, meta, series)
        rows: list[int] = []
        group_bytes: list[int] = []
        keys: list = []  # the series id of each run, while every row group holds one (min == max)
        lengths: list[int] = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            count = group.num_rows
            rows.append(count)
            group_bytes.append(group.total_byte_size)
            if column < 0 or count == 0:
                continue
            stats = group.column(column).statistics
            low = stats.min if stats is not None and stats.has_min_max and stats.null_count == 0 else None
            if low is None or low != stats.max:
                column = -1  # the statistics do not tell the runs
            elif keys and keys[-1] == low:
                lengths[-1] += count
            else:
                keys.append(low)
                lengths.append(count)
        splits = split_sizes(group_bytes, partition_bytes)
        runs: Any = None
        if len(splits) == 1 and series is not None:
            if column >= 0:
                counts = np.array(lengths, np.int64)
                runs = pack_runs((np.cumsum(counts) - counts, counts, np.array(keys, key_dtype)))
            elif column != _NO_SERIES:
                try:
                    runs = tail_runs(meta, schema, series, tail, size)
                except Exception:  # the series scan reads it again and reports what is wrong
                    log.debug("series %r of %s not scanned from its tail", series, path, exc_info=True)
        footer = Footer(tail[-needed:] if needed < len(tail) else tail, size, tuple(rows))
        return _Opened(footer, schema, splits, runs, identity)

    def _file_schema(self, reader: Any, meta: Any, series: str | None) -> tuple[Any, int, Any]:
        """``(Arrow schema, series column or -1, its numpy dtype)`` of an opened file; files written by
        Arrow are matched by their ``ARROW:schema`` bytes (a dict look-up), others by their schema."""
        known: dict = self.__dict__.setdefault("_open_schemas", {})  # key -> [schema, (series, column, dtype)]
        kv = meta.metadata
        arrow = kv.get(b"ARROW:schema") if kv else None
        entry = known.get((arrow, meta.num_columns)) if arrow is not None else None
        if entry is None:
            schema = reader.schema_arrow.remove_metadata()
            # files are opened on several threads: one may add a schema while another looks through them
            # (a RuntimeError that would fail, or with on_error="skip" leave out, a good file)
            with _SCHEMAS_LOCK:
                entry = next((e for e in known.values() if e[0].equals(schema)), None)
                if entry is None:
                    entry = [schema, None]
                    if len(known) < 64:  # files usually share one or two
                        known[(arrow, meta.num_columns) if arrow is not None else len(known)] = entry
        if entry[1] is None or entry[1][0] != series:
            found = (series, *_leaf_column(meta, entry[0], series))
            if meta.num_row_groups == 0:  # no column paths to tell: found again for the next file
                return entry[0], found[1], found[2]
            entry[1] = found
        return entry[0], entry[1][1], entry[1][2]

    def _open_error(self, path: str, exc: BaseException) -> SourceReadError:
        kind = classify(exc)
        error = failure_message(kind, f"cannot read the Parquet footer of {self._url(path)}", exc, opening=True)
        if kind == "corrupt" and (other := wrong_format(self._url(path))):
            error.args = (f"cannot read the Parquet footer of {self._url(path)}: {error_text(exc)}; {other}",)
        return error


#: Held while the schemas met so far are looked through or added to (``_file_schema``).
_SCHEMAS_LOCK = fork_safe_lock()


#: ``_leaf_column`` of a schema without the series column (or no series given): no runs at open.
_NO_SERIES = -2


def _leaf_column(meta: Any, schema: Any, series: str | None) -> tuple[int, Any]:
    """``(leaf column, numpy dtype)`` of ``series`` where its statistics may tell the runs (a flat integer
    column fitting int64), else ``(-1, None)`` (the tail is decoded) or ``(_NO_SERIES, None)``."""
    import pyarrow as pa

    if series is None or series not in schema.names:
        return _NO_SERIES, None
    column = schema.get_field_index(series)
    kind = schema.field(series).type
    if (
        column < 0
        or meta.num_row_groups == 0
        or not pa.types.is_integer(kind)
        or column >= meta.num_columns
        or meta.row_group(0).column(column).path_in_schema != series
    ):
        return -1, None
    return column, np.dtype(kind.to_pandas_dtype())


def number_schemas(opened: dict[str, _Opened], files: list[str]) -> tuple[list, list[int]]:
    """``(the distinct schemas, each file's number in them)``: files share schema objects (``_file_schema``)."""
    numbers: dict[int, tuple[int, Any]] = {}
    for path in files:
        numbers.setdefault(id(opened[path].schema), (len(numbers), opened[path].schema))
    return [schema for _, schema in numbers.values()], [numbers[id(opened[path].schema)][0] for path in files]


def _open_local(one: Callable[[str], Any], files: list[str], threads: int) -> list:
    """``[one(path) for path in files]``: on this thread while it computes, else on ``threads`` threads.

    The first ``PROBE_FILES`` are opened here; when this thread was on the CPU for most of that time
    the rest follow here too (threads would only trade the GIL), else they go to threads. Results
    are the same either way."""
    if threads <= 1 or len(files) <= 2 * PROBE_FILES:
        return [one(path) for path in files]
    start, cpu = time.perf_counter(), time.thread_time()
    results = [one(path) for path in files[:PROBE_FILES]]
    busy = (time.thread_time() - cpu) / max(time.perf_counter() - start, 1e-9)
    rest = files[PROBE_FILES:]
    return results + ([one(path) for path in rest] if busy > 0.7 else map_in_blocks(one, rest, threads))
