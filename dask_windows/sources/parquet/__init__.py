"""Partitioned Parquet on any fsspec filesystem, read with pyarrow.

Opening lists once and reads each footer once (``footers``, ``opening``, or the index); the
serialized footers travel with the source into DataLoader workers. A read costs one ``cat_ranges``
call of the partition's column chunks (``ranges``; local files use pyarrow's reader). A file over
``partition_bytes`` is split at row groups, each such partition reading ``window + horizon - 1``
rows past its end (its halo) so no window is lost at a cut. Opening, the manifest and row-range
reads are the mixins of ``opening``, ``manifest`` and ``rows``."""

from __future__ import annotations

import logging
import os
import pickle
import posixpath
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError
from dask_windows.errors.faults import (
    SkippedPartition,
    check_on_error,
    classify,
    error_text,
    failure_message,
)
from dask_windows.settings.tuning import MAX_GAP
from dask_windows.sources.arrow import numpy_column
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES, Partition, Source
from dask_windows.sources.cache import split_merged
from dask_windows.sources.parquet.footer_index import footer_digest
from dask_windows.sources.parquet.footer_share import open_footers, open_unlisted
from dask_windows.sources.parquet.footers import Footer, is_local, list_files, pack_runs, paused_gc, unpack_runs
from dask_windows.sources.parquet.index_open import IndexedFiles, adopt_index
from dask_windows.sources.parquet.manifest import ParquetManifest
from dask_windows.sources.parquet.opening import ParquetOpening, number_schemas
from dask_windows.sources.parquet.partitions import FilePartitions
from dask_windows.sources.parquet.ranges import FetchedFile, chunk_ranges, fetch_ranges, merge_ranges
from dask_windows.sources.parquet.rows import ParquetRows
from dask_windows.sources.parquet.stats_check import outside_statistics
from dask_windows.sources.retry import RetryPolicy, resolve_retry

__all__ = ["ParquetSource"]

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


class ParquetSource(ParquetRows, ParquetOpening, ParquetManifest, Source):
    """Partitioned Parquet on any fsspec filesystem.

    Args:
        data: A file, folder, glob or URL, or a list of them (taken in the given order).
        storage_options: Passed to fsspec (credentials, endpoint, ...).
        partition_bytes: Files with more uncompressed bytes are split at row-group boundaries.
        threads: Threads reading footers at open (local files: at most ``LOCAL_OPEN_THREADS``).
        retry: Retries of transient store errors (an int of retries or a ``RetryPolicy``).
        on_error: ``"raise"`` on a file whose footer cannot be read, or ``"skip"`` it (in ``skipped``).
        max_gap: Column chunks of a partition closer than this many bytes are fetched in one request.
        cache_dir, cache_bytes: Keep the bytes read from a remote store in this folder, at most this many.
        series: The series column: runs the tail reads at open tell are kept for ``read_runs``.
        index: The dataset index: ``None`` the one beside a folder or prefix if any, a path that one,
            ``False`` none. Without one, the ranks of ``footer_group`` share footers (``footer_share``)."""

    cache: Any = None  # the RangeCache of cache_dir=, if any
    # String columns read as Arrow dictionary arrays and returned as such (a ``pyarrow.ChunkedArray``, sliced like
    # the numpy columns), not as numpy arrays of Python strings: a workflow's ``Categorify`` inputs (set by
    # ``workflow.apply``), mapped to codes through their few distinct values (a tenth of the decode).
    dictionary_columns: frozenset[str] = frozenset()

    @paused_gc()  # a few lasting objects per file: see paused_gc
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
        index: Any = None,
        footer_group: Any = None,
    ) -> None:
        self.retry = resolve_retry(retry)
        self.footer_group = footer_group  # (store, world size) of the ranks sharing footers (footer_share)
        self.on_error = check_on_error(on_error)
        self.max_gap = max_gap
        self.storage_options = storage_options
        self.skipped: list[SkippedPartition] = []
        self._tail_series = series
        target = os.fspath(data) if isinstance(data, (str, os.PathLike)) else f"{len(data)} paths"
        listed: dict = {}
        unlisted = None
        doing = "look for a dataset index in"  # what failed, for the message
        try:
            # an object store's folder with an index: the index alone, no listing (its errors named as the listing's)
            unlisted = self._open_unlisted(data, storage_options, series, index)
            doing = "list"
            if unlisted is not None:
                self.fs, files, sizes, self.description, opened = unlisted
            else:
                self.fs, files, sizes, self.description = self.retry.call(
                    lambda: list_files(data, storage_options, PARQUET_SUFFIXES, listed, stat_local=False),
                    target,
                    timeout=self.retry.open_timeout,
                )
        except (ConfigError, DataError):
            raise
        except FileNotFoundError as exc:
            if target in str(exc) or "index" in str(exc):
                raise  # our own message, naming the path
            raise FileNotFoundError(
                f"{target} does not exist ({error_text(exc)}); check the bucket, folder and key, and that the "
                "credentials in storage_options may see them"
            ) from exc
        except Exception as exc:
            raise failure_message(classify(exc), f"cannot {doing} {target}", exc, opening=True) from exc
        self.local = is_local(self.fs)
        if self.local:
            self.retry = self.retry.unbounded()
        self._pid = os.getpid()
        if unlisted is None:
            opened = open_footers(self, data, files, sizes, listed, threads, partition_bytes, series, index)
        self.footer_group = None  # not kept: a store does not pickle into DataLoader workers
        if isinstance(opened, IndexedFiles):  # columnar: no object per file (index_open)
            adopt_index(self, opened, partition_bytes)
        else:
            self.files = [path for path in files if path in opened]
            if not self.files:
                raise SourceReadError(f"no readable Parquet file in {self.description}: every footer failed to read")
            self._footers: dict[str, Footer] = {path: opened[path].footer for path in self.files}
            self._identities = self._record_identities(listed, opened)
            self._schemas, self._schema_numbers = number_schemas(opened, self.files)  # files usually share one
            self._tail_runs = {path: pack_runs(o.runs) for path, o in opened.items() if o.runs is not None}
            self.partitions = []
            for path in self.files:
                footer, splits = self._footers[path], opened[path].splits
                for rgs in splits:
                    rows = sum(footer.rows) if len(splits) == 1 else sum(footer.rows[g] for g in rgs)
                    name = path if len(splits) == 1 else f"{path}[row groups {rgs[0]}-{rgs[-1]}]"
                    if rows:
                        self.partitions.append(Partition(name, rows, (path, rgs)))
        del opened
        self.manifest_series: str | None = None  # the manifest's series column, even when it is stale
        self._manifest = self._load_manifest(data, zip(files, sizes))
        self._halo = 0  # rows a partition reads past its end, inside its file (set_window)
        self.cache, self._versions = self._open_cache(cache_dir, cache_bytes)

    def _stale_index_hint(self) -> str:
        """``"; ..."`` naming the index as the likely cause of a failed read of a source opened from it without
        a listing, else ``""``."""
        files = getattr(getattr(self, "_footers", None), "_files", None)
        if files is None or not getattr(files, "unlisted", False):
            return ""
        return (
            f"; {self.description} was opened from its index {files.where} without listing the store, so an "
            f"object deleted or rewritten since the index was written is found here: `dask-windows index --verify "
            f"{self.description}` lists the store and names what changed, `dask-windows index {self.description}` "
            "writes the index again"
        )

    def _open_unlisted(self, data: Any, storage_options: dict | None, series: str | None, index: Any) -> Any:
        """``(fs, files, sizes, description, IndexedFiles)`` of an object-store folder opened from its index
        alone, or ``None`` (then the store is listed)."""
        import fsspec

        if index is False or not isinstance(data, (str, os.PathLike)):
            return None
        url = os.fspath(data)
        try:
            fs = fsspec.core.url_to_fs(url, **(storage_options or {}))[0]
        except Exception:
            return None  # the listing reports it
        if is_local(fs):
            return None
        self.fs, self.local = fs, False
        found = self.retry.call(
            lambda: open_unlisted(fs, data, index, series, self._url), url, timeout=self.retry.open_timeout
        )
        return None if found is None else (fs, found[0], found[1], url, found[2])

    @property
    def _spread(self) -> bool:
        """Whether the files are ``dask-windows convert``'s spread layout (a version-2 manifest): whole
        partitions mix like a global shuffle, and every page carries a CRC."""
        manifest = getattr(self, "_manifest", None)
        return manifest is not None and manifest["manifest"]["version"] >= 2

    @property
    def default_pieces_per_partition(self) -> int | None:  # type: ignore[override]
        return 1 if self._spread else None

    def _cached(self, path: str, size: int, chunks: list[tuple[int, int]]) -> FetchedFile:
        """The column chunks ``chunks`` of ``path`` through ``cache_dir=``: the missing ones fetched in one call."""
        fs = self._filesystem()

        def fetch(wanted: list[tuple[int, int]]) -> list:
            ranges = merge_ranges(wanted, self.max_gap)
            blobs = fs.cat_ranges(
                [path] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges], on_error="raise"
            )
            return split_merged(wanted, ranges, blobs)

        blobs = self.cache.fetch(self._url(path), self._versions[path], chunks, fetch)
        return FetchedFile(fs, path, size, chunks, blobs)

    def identity_digest(self) -> str:
        """Hash of every file's size and footer, for the resume fingerprint (see ``identity``)."""
        from dask_windows.sources import identity

        ids = getattr(self, "_identities", {})
        return identity.digest(
            ((ids[p].size if p in ids else None) or self._footers[p].size, footer_digest(self._footers[p]))
            for p in self.files
        )

    def unchanged(self, indices: Sequence[int]) -> bool:
        """Local files of ``indices`` still of the size and ``mtime`` recorded at open (remote: their reads check)."""
        if not self.local:
            return True
        from dask_windows.sources import identity

        ids = getattr(self, "_identities", {})
        for path in {self.partitions[i].key[0] for i in indices}:
            expected = ids.get(path)
            try:
                if expected is not None and identity.local(path) != expected:
                    return False
            except OSError:
                return False
        return True

    def continues(self, index: int) -> bool:
        """Partitions of one file cut at row groups follow each other (keys are ``(path, row groups)``)."""
        if isinstance(self.partitions, FilePartitions):  # columnar: no partition built
            return self.partitions.continues(index)
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

    def runs_known(self, series: Any) -> bool:
        """Whether ``read_runs(i, series)`` reads nothing for any partition (the manifest or the tails told them)."""
        manifest: Any = getattr(self, "_manifest", None)
        if series is not None and manifest is not None and manifest["series"] == series:
            return True
        return series is not None and series == self._tail_series and len(self._tail_runs) == len(self.partitions)

    def runs_at_once(self, series: Any) -> tuple[np.ndarray, ...] | None:
        """Every partition's runs ``(starts, lengths, keys, offsets)`` when the index tells them all (a partition
        per file, no manifest), else ``None``."""
        every = getattr(self._tail_runs, "every_file", None)
        if every is None or series is None or series != self._tail_series or getattr(self, "_manifest", None):
            return None
        if len(self.partitions) != len(self.files):
            return None
        return every()

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, ...]:
        """Runs from the manifest when it covers ``series`` (version 2: with ``origin`` and ``owned``), else
        those the tail reads told (once), else from the series column."""
        manifest: Any = getattr(self, "_manifest", None)
        spread = self._spread
        if spread and series is not None and manifest["series"] != series:
            raise ConfigError(
                f"series={series!r}: {manifest['root']} was converted with series column {manifest['series']!r} "
                "in chunks that only its manifest describes; pass series="
                f"{manifest['series']!r} (or leave it out)"
            )
        if not spread and (series is None or manifest is None or manifest["series"] != series):
            path = self.partitions[index].key[0]
            told = unpack_runs(self._tail_runs.pop(path, None)) if series == self._tail_series else None
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
        distinct, first_file = np.unique(np.asarray(self._schema_numbers, np.int64), return_index=True)
        paths = {int(n): self.files[int(i)] for n, i in zip(distinct, first_file)}  # the first file of each schema
        for number, path in paths.items():
            schema = self._schemas[number]
            for col in columns:
                role = what.get(col, "column")
                if col not in schema.names:
                    raise SchemaError(
                        f"{role} {col!r} is missing from {self._url(path)} (its columns: {schema.names}); "
                        f"every file of {self.description} must hold the feature, target and series columns"
                        f"{_hive_hint(path, col, self.files)}"
                    )
                if schema.names.count(col) > 1:  # pyarrow finds no field of a duplicated name
                    raise SchemaError(
                        f"{role} {col!r} appears {schema.names.count(col)} times in {self._url(path)}; "
                        "rewrite the file with unique column names"
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
        meta = self._metadata(path)
        if self.local:
            file: Any = path
        else:
            ranges = merge_ranges(chunk_ranges(meta, row_groups, columns), self.max_gap)
            if self.cache is None:
                file = fetch_ranges(self._filesystem(), path, footer.size, ranges)
            else:
                file = self._cached(path, footer.size, chunk_ranges(meta, row_groups, columns))
        verify = getattr(self, "verify_checksums", True)  # pages without a CRC are read unverified
        coded = [c for c in columns if c in self.dictionary_columns]
        reader = pq.ParquetFile(
            file, metadata=meta, pre_buffer=False, page_checksum_verification=verify, read_dictionary=coded or None
        )
        return reader.read_row_groups(list(row_groups), columns=list(columns), use_threads=False)

    def read(self, index: int, columns: Sequence) -> dict:
        return self._read_groups(index, self.partitions[index].key[1], columns)

    def read_chunks(self, index: int, columns: Sequence) -> Iterator[dict]:
        """Local files a few row groups at a time (``group_runs``: bounded memory); remote files in one request."""
        row_groups = self.partitions[index].key[1]
        if not self.local:
            yield self._read_groups(index, row_groups, columns)
            return
        for groups in self.group_runs(index, row_groups, len(columns)):
            yield self._read_groups(index, groups, columns)

    def _read_groups(self, index: int, row_groups: Sequence[int], columns: Sequence) -> dict:
        part = self.partitions[index]
        path = part.key[0]
        if self.local:
            self._unchanged(path)
        try:
            table = self.retry.call(lambda: self._read_table(path, row_groups, columns), self._url(path))
        except Exception as exc:
            if self.local:
                self._unchanged(path)  # rewritten while it was read: say so, not "corrupt"
            name = self._url(path) + part.name[len(path) :]
            kind = classify(exc)
            stale = self._stale_index_hint() if kind in ("missing", "corrupt") else ""
            if kind == "missing":
                raise failure_message(
                    kind,
                    f"cannot read {name}: the dataset changed after it was opened (open it again){stale}",
                    exc,
                ) from exc
            where = self._corrupt_chunk(path, row_groups, columns) if kind == "corrupt" and self.local else stale[2:]
            raise failure_message(kind, f"cannot read {name}", exc, where) from exc
        if self.local:
            self._unchanged(path)  # nor rows of a file rewritten while it was read (old footer, new bytes)
        expected = part.num_rows if tuple(row_groups) == tuple(part.key[1]) else None
        if expected is not None and table.num_rows != expected:
            raise SourceReadError(
                f"{part.name} holds {table.num_rows} rows but its footer said {expected} when the dataset "
                f"was opened; the file changed underneath the dataset; open the dataset again{self._stale_index_hint()}"
            )
        if (
            getattr(self, "verify_checksums", True) and not self._spread
        ):  # values against the footer's min/max (spread files carry page CRCs)
            problem = outside_statistics(self._metadata(path), row_groups, table)
            if problem is not None:
                name = self._url(path) + part.name[len(path) :]
                raise failure_message("corrupt", f"cannot read {name}", SourceReadError(problem))
        return {  # no pandas import (arrow.numpy_column)
            col: _dictionary_or_numpy(table.column(col), col in self.dictionary_columns) for col in columns
        }


def _dictionary_or_numpy(column: Any, coded: bool) -> Any:
    """``column`` as it is where it was read as a dictionary (``dictionary_columns``), else as numpy."""
    import pyarrow as pa

    if coded and pa.types.is_dictionary(column.type):
        return column
    return numpy_column(column)


def _hive_hint(path: str, column: str, files: Sequence[str]) -> str:
    """The remedy where ``path`` lies in Hive-style folders (``key=value/``): their keys are columns only
    through ``pyarrow.dataset``'s ``partitioning="hive"``."""
    dirs = {posixpath.dirname(f.replace("\\", "/")) for f in files[:10_000]}
    common = posixpath.commonpath(dirs) if dirs else ""
    while "=" in posixpath.basename(common):  # all files below one key folder: it is a key too
        common = posixpath.dirname(common)
    below = posixpath.dirname(path.replace("\\", "/"))[len(common) :].split("/")
    keys = [part.split("=", 1)[0] for part in below if "=" in part and not part.startswith("=")]
    if not keys:
        return ""
    which = f"{column!r} is the key of its folders" if column in keys else f"its folders are keyed by {keys}"
    return (
        f'; {which} (Hive partitioning): open the folder with pyarrow.dataset.dataset(path, format="parquet", '
        'partitioning="hive") and pass that dataset, whose folder keys are columns (docs/frameworks.md)'
    )
