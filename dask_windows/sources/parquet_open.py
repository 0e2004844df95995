"""Opening Parquet files for ``ParquetSource``: one tail read per file, footers parsed, schemas shared.

Moved out of ``parquet`` unchanged, as the ``ParquetOpening`` mixin of
``ParquetSource``: every file is opened from one tail read (concurrent
``cat_ranges`` calls on an object store, blocks of files per thread on local
disk), its footer parsed and kept compact (``footers``), its schema shared with
the files that have the same, and the series runs the tail tells kept.
Unreadable files raise, or are recorded and left out with ``on_error="skip"``.
See ``parquet`` for the trade-offs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from dask_windows.errors import SourceReadError
from dask_windows.faults import (
    SkippedPartition,
    classify,
    failure_message,
    is_transient,
    opening_skip_allowed,
    record_skip,
)
from dask_windows.sources.footers import (
    FOOTER_BYTES,
    TAIL_BATCH,
    Footer,
    footer_of,
    local_tail,
    map_in_blocks,
    parse_footer,
    row_group_splits,
    tail_runs,
)
from dask_windows.sources.ranges import chunk_ranges
from dask_windows.sources.retry import DeadlineExceeded, RetryPolicy

__all__ = ["ParquetOpening"]

log = logging.getLogger("dask_windows.sources.parquet")


class _Opened(NamedTuple):
    """One file as opened; only ``footer`` is kept after opening."""

    footer: Footer
    schema: Any  # pyarrow.Schema without its metadata
    splits: list[tuple[int, ...]]  # row groups of each partition
    runs: tuple | None  # series runs of the whole file when the tail read told them


class ParquetOpening:
    """``ParquetSource``'s opening of its files (a mixin: ``ParquetSource`` sets the attributes)."""

    fs: Any
    local: bool
    retry: RetryPolicy
    on_error: str
    description: str
    skipped: list[SkippedPartition]
    _seen_schemas: list[tuple]

    if TYPE_CHECKING:

        def _url(self, path: str) -> str: ...

    def _open_files(
        self, files: list[str], sizes: list[int | None], threads: int, partition_bytes: int, series: str | None
    ) -> dict[str, _Opened]:
        """Every file opened from one tail read; unreadable ones raise, or are recorded and left out
        with ``on_error="skip"``.

        On local disk each thread reads and parses its block of files. An async filesystem (s3fs,
        gcsfs, adlfs) fetches ``TAIL_BATCH`` tails per ``cat_ranges`` call, concurrently on its event
        loop; another remote filesystem fetches them on ``threads`` threads. Each batch is parsed
        before the next is fetched, so at most ``TAIL_BATCH`` tails are held.
        """

        def one(item: tuple) -> _Opened | BaseException:
            try:
                path, size, tail = item
                return self._open_file(path, size, tail, partition_bytes, series)
            except Exception as exc:
                return exc

        results: list = []
        if self.local:
            results = map_in_blocks(one, [(path, size, None) for path, size in zip(files, sizes)], threads)
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
            return self.retry.call(lambda: local_tail(path, nbytes), path)
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
        meta, needed = parse_footer(tail, path)
        if meta is None:
            if len(tail) < FOOTER_BYTES:
                raise SourceReadError(
                    f"{path} is shorter ({len(tail):,} bytes) than its footer claims ({needed:,} bytes)"
                )
            tail, _ = self._tail(path, needed)
            meta, needed = parse_footer(tail, path)
        if size is None:
            if len(tail) < FOOTER_BYTES:  # the tail is the whole file
                size = len(tail)
            else:  # a lower bound is enough: pyarrow only checks chunks lie inside the file
                ends = [b for _, b in chunk_ranges(meta, range(meta.num_row_groups), [])]
                size = max(ends, default=4) + needed
        schema = self._schema_of(meta)
        splits = row_group_splits(meta, partition_bytes)
        runs = None
        if series is not None and len(splits) == 1:
            try:
                runs = tail_runs(meta, schema, series, tail, size)
            except Exception:  # the series scan reads it again and reports what is wrong
                log.debug("series %r of %s not scanned from its tail", series, path, exc_info=True)
        return _Opened(footer_of(meta, tail, needed, size), schema, splits, runs)

    def _schema_of(self, meta: Any) -> Any:
        """The Arrow schema of a file, without metadata; one object for the files that share it."""
        parquet_schema = meta.schema
        arrow = meta.metadata.get(b"ARROW:schema") if meta.metadata else None
        for known, known_arrow, schema in self._seen_schemas:
            if known_arrow == arrow and parquet_schema.equals(known):
                return schema
        schema = parquet_schema.to_arrow_schema().remove_metadata()
        if len(self._seen_schemas) < 16:  # files usually share one or two
            self._seen_schemas.append((parquet_schema, arrow, schema))
        return schema

    def _open_error(self, path: str, exc: BaseException) -> SourceReadError:
        kind = classify(exc)
        error = failure_message(kind, f"cannot read the Parquet footer of {self._url(path)}", exc)
        if kind == "transient":
            error.args = (
                error.args[0] + " (a file failing this way is not skipped while opening, even with "
                "on_error='skip', so every rank opens the same dataset)",
            )
        return error
