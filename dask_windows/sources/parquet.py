"""Partitioned Parquet on any fsspec filesystem, read with pyarrow.

The listing is one ``find`` (or ``glob``) and the footers are read once, when
the dataset is opened: one tail read per file (``footers``), concurrently in
``cat_ranges`` calls on an object store, in blocks of files per thread on
local disk. Only the serialized footer, the size and the rows per row group
are kept (about 1.3 KiB a file for a few columns); they travel with the source
into DataLoader workers, so no epoch and no worker lists or reads a footer
again. Given the series column (``series=``, passed by the dataset), the runs
of small files come out of the same tail read, so opening costs one request
per file.

Reading a partition then costs one ``cat_ranges`` call of its column chunks
(``ranges``): one request per partition for a typical dataset. Local files
stay on pyarrow's own file reader. A file with more than ``partition_bytes``
uncompressed bytes is split at row-group boundaries; such a partition reads
``window + horizon - 1`` rows into the next row groups of its file (its halo),
so the windows that cross the cut are kept, each yielded once, by the
partition where it starts. ``read_rows`` / ``read_ranges`` read only the row
groups covering row ranges (the loader's pieces: a buffer's pieces of one
partition in one call, one coalesced request on an object store).

Transient store errors are retried (``retry.RetryPolicy``). A file whose
footer cannot be read raises, or with ``on_error="skip"`` is left out and
recorded in ``skipped``.
"""

from __future__ import annotations

import logging
import os
import pickle
import posixpath
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from dask_windows.errors import ConfigError, SchemaError, SourceReadError
from dask_windows.faults import (
    SkippedPartition,
    check_on_error,
    classify,
    error_text,
    failure_message,
    is_transient,
    opening_skip_allowed,
    record_skip,
)
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES, Partition, Source
from dask_windows.sources.cache import split_merged
from dask_windows.sources.footers import (
    FOOTER_BYTES,
    TAIL_BATCH,
    Footer,
    footer_of,
    list_files,
    local_tail,
    map_in_blocks,
    parse_footer,
    row_group_splits,
    tail_runs,
)
from dask_windows.sources.ranges import FetchedFile, chunk_ranges, fetch_ranges, merge_ranges
from dask_windows.sources.retry import DeadlineExceeded, RetryPolicy, resolve_retry
from dask_windows.windows import find_runs, join_runs

__all__ = ["ParquetSource"]

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
#: Column chunks of one partition closer than this are fetched in one request.
MAX_GAP = 64 * 2**10


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


class _Opened(NamedTuple):
    """One file as opened; only ``footer`` is kept after opening."""

    footer: Footer
    schema: Any  # pyarrow.Schema without its metadata
    splits: list[tuple[int, ...]]  # row groups of each partition
    runs: tuple | None  # series runs of the whole file when the tail read told them


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
        cache_dir: Keep the bytes read from a remote store in this local folder (shared by the processes
            of a machine), so later epochs read them from disk (see ``cache``); local files are not cached.
        cache_bytes: Most bytes ``cache_dir`` may hold (least recently used entries are evicted); ``None``: no limit.
        series: The series column, if any: runs that the tail read at open already tells are kept
            for ``read_runs`` (each given once), so a small file is not read again to scan it.
    """

    reads_in_processes = True

    cache: Any = None  # the RangeCache of cache_dir=, if any

    def __init__(
        self,
        data: Any,
        storage_options: dict | None = None,
        partition_bytes: int = DEFAULT_PARTITION_BYTES,
        threads: int = 16,
        retry: int | RetryPolicy | None = None,
        on_error: str = "raise",
        max_gap: int = MAX_GAP,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int | None = None,
        series: str | None = None,
    ) -> None:
        self.retry = resolve_retry(retry)
        self.on_error = check_on_error(on_error)
        self.max_gap = max_gap
        self.storage_options = storage_options
        self.skipped: list[SkippedPartition] = []
        self._tail_series = series
        self._seen_schemas: list[tuple] = []  # (parquet schema, ARROW:schema bytes, arrow schema) while opening
        target = os.fspath(data) if isinstance(data, (str, os.PathLike)) else f"{len(data)} paths"
        listed: dict = {}
        try:
            self.fs, files, sizes, self.description = self.retry.call(
                lambda: list_files(data, storage_options, PARQUET_SUFFIXES, listed),
                target,
                timeout=self.retry.open_timeout,
            )
        except ConfigError:
            raise
        except FileNotFoundError as exc:
            if target in str(exc):
                raise  # our own message, naming the path
            raise FileNotFoundError(
                f"{target} does not exist ({error_text(exc)}); check the bucket, folder and key, and that the "
                "credentials in storage_options may see them"
            ) from exc
        except Exception as exc:
            raise failure_message(classify(exc), f"cannot list {target}", exc) from exc
        self.local = _is_local(self.fs)
        if self.local:
            self.retry = self.retry.unbounded()
        self._pid = os.getpid()
        opened = self._open_files(files, sizes, threads, partition_bytes, series)
        self.files = [path for path in files if path in opened]
        if not self.files:
            raise SourceReadError(f"no readable Parquet file in {self.description}: every footer failed to read")
        self._footers: dict[str, Footer] = {path: opened[path].footer for path in self.files}
        self._identities = self._record_identities(listed)
        # One schema object per distinct schema, and its number per file (files usually share one).
        numbers: dict[int, int] = {}
        self._schemas: list[Any] = []
        self._schema_numbers = []
        for path in self.files:
            schema = opened[path].schema
            if id(schema) not in numbers:
                numbers[id(schema)] = len(self._schemas)
                self._schemas.append(schema)
            self._schema_numbers.append(numbers[id(schema)])
        self._seen_schemas.clear()
        self._tail_runs = {path: o.runs for path, o in opened.items() if o.runs is not None}
        self.partitions = []
        for path in self.files:
            footer, splits = self._footers[path], opened[path].splits
            for rgs in splits:
                rows = sum(footer.rows[g] for g in rgs)
                name = path if len(splits) == 1 else f"{path}[row groups {rgs[0]}-{rgs[-1]}]"
                if rows:
                    self.partitions.append(Partition(name, rows, (path, rgs)))
        del opened
        self._listed = dict(zip(files, sizes))
        self.manifest_series: str | None = None  # the manifest's series column, even when it is stale
        self._manifest = self._load_manifest(data)
        self._halo = 0  # rows a partition reads past its end, inside its file (set_window)
        self.cache, self._versions = self._open_cache(cache_dir, cache_bytes)

    def _file_rows(self, index: int) -> tuple[np.ndarray, int, int]:
        """``(row group bounds of the file, file row of the partition's first row, readable rows)``."""
        path, row_groups = self.partitions[index].key
        known = self.__dict__.setdefault("_row_group_bounds", {})
        bounds = known.get(path)
        if bounds is None:
            bounds = np.cumsum([0, *self._footers[path].rows])  # (G+1,) file row where each row group begins
            known[path] = bounds
        first = int(bounds[row_groups[0]])
        rows = self.partitions[index].num_rows
        return bounds, first, rows + min(getattr(self, "_halo", 0), int(bounds[-1]) - first - rows)

    def readable_rows(self, index: int) -> int:
        return self._file_rows(index)[2]

    @property
    def default_pieces_per_partition(self) -> int | None:  # type: ignore[override]
        """1 on data ``dask-windows convert`` spread in chunks over its files (whole partitions already
        mix like a global shuffle, at no extra read); else the dataset's default."""
        manifest = getattr(self, "_manifest", None)
        return 1 if manifest is not None and manifest["manifest"]["version"] >= 2 else None

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

    def _cached(self, path: str, size: int, chunks: list[tuple[int, int]]) -> FetchedFile:
        """The column chunks ``chunks`` of ``path`` through the local cache (``cache_dir=``): the missing
        ones fetched in one ``cat_ranges`` call, close ones merged into one request as without a cache."""
        fs = self._filesystem()

        def fetch(wanted: list[tuple[int, int]]) -> list:
            ranges = merge_ranges(wanted, self.max_gap)
            blobs = fs.cat_ranges(
                [path] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges], on_error="raise"
            )
            return split_merged(wanted, ranges, blobs)

        blobs = self.cache.fetch(self._url(path), self._versions[path], chunks, fetch)
        return FetchedFile(fs, path, size, chunks, blobs)

    def _open_cache(self, cache_dir: Any, cache_bytes: int | None) -> tuple[Any, dict[str, str]]:
        """The local ``RangeCache`` of a remote source and each file's version (size, ETag/mtime) in its keys.

        The versions come from the listing's ``info`` (no request after a folder or glob listing;
        one HEAD per file for an explicit list of URLs), once, at open.
        """
        if cache_dir is None or self.local:
            return None, {}
        from dask_windows.sources.cache import RangeCache, object_version

        cache = RangeCache(cache_dir, cache_bytes)
        infos = map_in_blocks(lambda path: self.retry.call(lambda: self.fs.info(path), path), self.files, 16)
        return cache, {path: object_version(info) for path, info in zip(self.files, infos)}

    def _load_manifest(self, data: Any) -> dict | None:
        """Series runs per file from a ``dask-windows convert`` manifest, if it matches the files.

        Returns ``{"series": column, "runs": {path: (starts, lengths, keys)}}``, or ``None`` when the
        folder has no manifest or it does not describe exactly these files and row counts (then
        the series column is scanned as usual).
        """
        from dask_windows.sources.manifest import manifest_run_arrays, read_manifest

        if not isinstance(data, (str, os.PathLike)) or any(ch in os.fspath(data) for ch in "*?["):
            return None
        root = self.fs._strip_protocol(os.fspath(data)).rstrip("/")
        if not self.fs.isdir(root):
            return None
        manifest = read_manifest(root, self.fs)
        if manifest is None:
            return None
        from dask_windows.checks import compare_manifest, runs_disagree_with_footer, warn_manifest

        self.manifest_series = manifest["series"]
        entries = {posixpath.join(root, f["path"]): f for f in manifest["files"]}
        ids = getattr(self, "_identities", {})
        listed = {
            p: (ids[p].size if p in ids and ids[p].size is not None else size) for p, size in self._listed.items()
        }
        # a version-2 (spread) manifest cannot fall back to scanning: its own checks below raise
        changes = (
            compare_manifest(self._url(root), entries, listed, remote=not self.local) if manifest["version"] < 2 else []
        )
        if changes:
            warn_manifest(self._url(root), changes)
            return None
        runs = {}
        for path in self.files:
            entry = entries.get(path)
            if entry is None or entry["rows"] != self._footers[path].num_rows:
                if manifest["version"] >= 2:  # chunks of many stretches: the series column cannot recover them
                    from dask_windows.errors import DataError

                    raise DataError(
                        f"the manifest of {root} does not match {self._url(path)} (a file missing, added or "
                        "rewritten); this dataset was converted in chunks spread over its files, which only the "
                        "manifest describes; rerun `dask-windows convert` to write it again"
                    )
                rows = self._footers[path].num_rows
                warn_manifest(
                    self._url(root), [f"{path} has {rows:,} rows, the manifest says {entry and entry['rows']}"]
                )
                return None
            if manifest["version"] < 2:
                differ = runs_disagree_with_footer(self._footers[path].metadata, manifest["series"], entry["runs"])
                if differ is not None:
                    warn_manifest(self._url(root), [f"{path}: {differ}"])
                    return None
            runs[path] = manifest_run_arrays(entry["runs"])
        if manifest["version"] >= 2 and len(runs) != len(entries):
            from dask_windows.errors import DataError

            missing = sorted(set(entries) - set(runs))
            raise DataError(
                f"the manifest of {root} lists {len(missing)} files that are not there (first: {self._url(missing[0])}); "
                "this dataset was converted in chunks spread over its files, so every file holds part of every "
                "series; restore the files or rerun `dask-windows convert`"
            )
        return {"series": manifest["series"], "runs": runs, "manifest": manifest, "root": root}

    def _record_identities(self, listed: dict) -> dict:
        """Each file's ``identity.FileIdentity`` at open: ``os.stat`` locally, the listing remotely."""
        from dask_windows.sources import identity

        if self.local:
            return {path: identity.local(path) for path in self.files}
        return {path: identity.from_info(listed.get(path)) for path in self.files}

    def identity_digest(self) -> str:
        """Hash of every file's size and footer, for the resume fingerprint (see ``identity``)."""
        from dask_windows.sources import identity

        ids = getattr(self, "_identities", {})
        return identity.digest(
            ((ids[p].size if p in ids else None) or self._footers[p].size, self._footers[p].raw) for p in self.files
        )

    def continues(self, index: int) -> bool:
        """Partitions of one file cut at row groups follow each other (keys are ``(path, row groups)``)."""
        return index > 0 and self.partitions[index].key[0] == self.partitions[index - 1].key[0]

    def set_window(self, span: int, stride: int) -> None:
        """Read ``span - 1`` rows past a row-group cut (the halo); warn when a converted dataset's chunks
        overlap by fewer rows than ``span`` needs."""
        super().set_window(span, stride)
        self._halo = max(span - 1, 0)
        manifest = getattr(self, "_manifest", None)
        if manifest is None:
            return
        from dask_windows.sources.manifest import span_shortfall

        lost, total = span_shortfall(manifest["manifest"], span, stride)
        if lost:
            warnings.warn(
                f"{manifest['root']} was converted for window + horizon <= {manifest['manifest']['span']} rows, "
                f"but this dataset needs {span}: {lost:,} of {total:,} windows ({lost / total:.1%}) that cross "
                f"a chunk cut are left out; rerun `dask-windows convert` with --window {span} "
                "(or a larger one), or use a smaller window",
                RuntimeWarning,
                stacklevel=4,
            )

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, ...]:
        """Runs from the manifest when it covers ``series``, else those the tail read at open told
        (once), else from the series column.

        A version-2 (spread) manifest also gives each run's ``origin`` and ``owned`` rows.
        """
        manifest: Any = getattr(self, "_manifest", None)
        spread = manifest is not None and manifest["manifest"]["version"] >= 2
        if spread and series is not None and manifest["series"] != series:
            raise ConfigError(
                f"series={series!r}: {manifest['root']} was converted with series column {manifest['series']!r} "
                "in chunks that only its manifest describes; pass series="
                f"{manifest['series']!r} (or leave it out)"
            )
        if not spread and (series is None or manifest is None or manifest["series"] != series):
            path = self.partitions[index].key[0]
            told = self._tail_runs.pop(path, None) if series == self._tail_series else None
            return self._halo_runs(index, series, told if told is not None else super().read_runs(index, series))
        path, row_groups = self.partitions[index].key
        first = sum(self._footers[path].rows[: row_groups[0]])  # file row of the partition
        last = first + self.readable_rows(index)  # the halo's runs too
        starts, lengths, keys = manifest["runs"][path][:3]
        ends = starts + lengths
        keep = (ends > first) & (starts < last)  # runs overlapping the partition, clipped to it
        lo, hi = np.maximum(starts[keep], first), np.minimum(ends[keep], last)
        if len(manifest["runs"][path]) == 3:
            return lo - first, hi - lo, keys[keep]
        origin, owned = manifest["runs"][path][3:]  # chunks of a version-2 manifest: keep their grid
        shift = lo - starts[keep]
        return lo - first, hi - lo, keys[keep], origin[keep] + shift, np.clip(owned[keep] - shift, 0, hi - lo)

    # -- opening ------------------------------------------------------------------------------

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
        paths: dict[int, str] = {}  # the first file of each distinct schema
        for path, number in zip(self.files, self._schema_numbers):
            paths.setdefault(number, path)
        for number, path in paths.items():
            schema = self._schemas[number]
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
        meta = footer.metadata
        if self.local:
            file: Any = path
        else:
            ranges = merge_ranges(chunk_ranges(meta, row_groups, columns), self.max_gap)
            if self.cache is None:
                file = fetch_ranges(self._filesystem(), path, footer.size, ranges)
            else:
                file = self._cached(path, footer.size, chunk_ranges(meta, row_groups, columns))
        verify = getattr(self, "verify_checksums", True)  # pages without a CRC are read unverified
        reader = pq.ParquetFile(file, metadata=meta, pre_buffer=False, page_checksum_verification=verify)
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
        if self.local:
            from dask_windows.sources.identity import check_local

            check_local(path, getattr(self, "_identities", {}).get(path))
        try:
            table = self.retry.call(lambda: self._read_table(path, row_groups, columns), self._url(path))
        except Exception as exc:
            name = self._url(path) + part.name[len(path) :]
            kind = classify(exc)
            if kind == "missing":
                raise failure_message(
                    kind, f"cannot read {name}: the dataset changed after it was opened (open it again)", exc
                ) from exc
            raise failure_message(kind, f"cannot read {name}", exc) from exc
        expected = part.num_rows if tuple(row_groups) == tuple(part.key[1]) else None
        if expected is not None and table.num_rows != expected:
            raise SourceReadError(
                f"{part.name} holds {table.num_rows} rows but its footer said {expected} when the dataset "
                "was opened; the file changed underneath the dataset; open the dataset again"
            )
        return {col: table.column(col).to_numpy() for col in columns}
