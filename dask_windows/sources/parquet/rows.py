"""Row ranges of ``ParquetSource`` partitions (a mixin): the row groups covering them, and the halo.

A partition cut at row groups reads ``window + horizon - 1`` rows past its end inside its file;
``read_ranges`` reads several ranges in one coalesced request; ``decode_units`` gives the row
group bounds the pool's units follow."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_windows.planning.ragged import Ragged
from dask_windows.planning.windows import find_runs, join_runs
from dask_windows.settings.tuning import CORRUPT_PROBES, PARSED_FOOTER_BYTES
from dask_windows.settings.tuning import READ_CHUNK_BYTES as CHUNK_BYTES
from dask_windows.sources.base import Partition
from dask_windows.sources.parquet.footers import Footer
from dask_windows.sources.parquet.partitions import FilePartitions

__all__ = ["CHUNK_BYTES", "ParquetRows", "ParsedFooters"]

#: Bytes a parsed footer holds per byte of its serialized form (measured: 2.5 MiB for 279 KB, 750 row groups).
PARSED_PER_BYTE = 10


class ParsedFooters:
    """``path -> FileMetaData`` of the files read last, at most ``limit`` bytes (estimated), thread-safe:
    a read of a few row groups would otherwise parse the whole footer each time. A larger footer is
    parsed per read, not kept; a pickled copy starts empty."""

    def __init__(self, limit: int = PARSED_FOOTER_BYTES) -> None:
        self.limit = limit
        self._parsed: dict[str, tuple[Any, Any, int]] = {}  # path -> (footer, its metadata, estimated bytes)
        self._bytes = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._warned: set[str] = set()

    def __reduce__(self) -> tuple:
        return (ParsedFooters, (self.limit,))

    def get(self, path: str, footer: Any) -> Any:
        """``footer.metadata`` (``footer``: the file's ``Footer``), parsed once while it stays kept."""
        if self._pid != os.getpid():  # a forked process: a lock held at the fork stays held
            self._lock, self._pid, self._parsed, self._bytes = threading.Lock(), os.getpid(), {}, 0
        with self._lock:
            kept = self._parsed.pop(path, None)
            if kept is not None and kept[0] is footer:
                self._parsed[path] = kept  # most recently used last
                return kept[1]
            if kept is not None:
                self._bytes -= kept[2]
        meta = footer.metadata
        size = PARSED_PER_BYTE * int(getattr(meta, "serialized_size", 0) or 0)
        if size > self.limit:
            if path not in self._warned:  # said once per file: the time it costs, the remedy
                self._warned.add(path)
                warnings.warn(
                    f"{path}: its footer ({meta.num_row_groups:,} row groups) parses to about {size >> 20} MiB, more "
                    f"than the {self.limit >> 20} MiB of parsed footers a source keeps (PARSED_FOOTER_BYTES), so every "
                    "read of it parses it again (tens to hundreds of milliseconds a read). Memory stays bounded; to read "
                    "it faster, rewrite the data in larger row groups (`dask-windows convert`, about a million rows each)",
                    RuntimeWarning,
                    stacklevel=1,
                )
            return meta
        with self._lock:
            old = self._parsed.pop(path, None)
            self._bytes -= 0 if old is None else old[2]
            while self._parsed and self._bytes + size > self.limit:  # least recently used first
                self._bytes -= self._parsed.pop(next(iter(self._parsed)))[2]
            self._parsed[path] = (footer, meta, size)
            self._bytes += size
        return meta


class ParquetRows:
    """``ParquetSource``'s reads of row ranges (a mixin: ``ParquetSource`` sets the attributes)."""

    partitions: list[Partition]
    _footers: dict[str, Footer]

    if TYPE_CHECKING:

        def _read_groups(self, index: int, row_groups: Sequence[int], columns: Sequence) -> dict: ...

        def _read_table(self, path: str, row_groups: Sequence[int], columns: Sequence) -> Any: ...

    def _metadata(self, path: str) -> Any:
        """``path``'s parsed footer (``ParsedFooters``: kept for the files read last)."""
        parsed = self.__dict__.get("_parsed_footers")
        if parsed is None:
            parsed = self.__dict__.setdefault("_parsed_footers", ParsedFooters())
        return parsed.get(path, self._footers[path])

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
        part = self.partitions[index]
        path, row_groups = part.key
        if len(row_groups) == len(self._footers[path].rows):  # a whole file: no halo past its end
            return part.num_rows
        return self._file_rows(index)[2]

    def decode_units(self, index: int) -> np.ndarray:
        """``(G+1,)`` partition rows where each of the partition's row groups begins, then its rows."""
        bounds, first, _ = self._file_rows(index)
        groups = self.partitions[index].key[1]
        return (bounds[[*groups, groups[-1] + 1]] - first).astype(np.int64)

    def decode_units_all(self) -> Ragged:
        """Every partition's ``decode_units`` at once, as one flat array and ``(P + 1,)`` offsets: from the
        index's rows per row group as they are (flat), otherwise from each footer's; no array per file."""
        files = getattr(self._footers, "_files", None)  # the index's columns, when opened from one
        if files is not None:
            group_rows, group_offsets, listed = files.group_rows, files.row_offsets, files.files
        else:
            listed = list(self._footers)
            per_file = Ragged.of([self._footers[path].rows for path in listed])
            group_rows, group_offsets = per_file.values, per_file.offsets
        parts = self.partitions
        if isinstance(parts, FilePartitions) and parts.files is listed:  # columnar, over the index's files
            file_of: Any = parts.file_of
            group0, count = parts.group_start, parts.group_stop - parts.group_start
        else:
            keys = [part.key for part in parts]
            paths = [key[0] for key in keys]
            if paths == listed:  # a partition per file, in the listing's order
                file_of = np.arange(len(paths), dtype=np.int64)
            else:
                position = {path: i for i, path in enumerate(listed)}
                file_of = np.array([position[path] for path in paths], np.int64)
            # (P,) per partition: its first and last row group and how many (contiguous, as cut)
            group0 = np.array([key[1][0] for key in keys], np.int64)
            count = np.array([len(key[1]) for key in keys], np.int64)
            if np.any(np.array([key[1][-1] for key in keys], np.int64) - group0 + 1 != count):
                return Ragged.of([self.decode_units(p) for p in range(len(self.partitions))])
        sizes = np.array(count, np.int64) + 1  # (P,) bounds of each partition
        offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        first = group_offsets[file_of] + group0  # (P,) its first row group, over every file's
        running = np.zeros(len(group_rows) + 1, np.int64)  # (G + 1,) rows before each row group, all files
        np.cumsum(group_rows, out=running[1:])
        at = np.repeat(first - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)  # (N,) row group
        return Ragged(running[at] - np.repeat(running[first], sizes), offsets)

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
        asked = np.asarray(ranges, np.int64).reshape(-1, 2)  # (n, 2) as one array: no loop per range
        lo = np.clip(asked[:, 0], 0, None)
        hi = np.maximum(np.minimum(asked[:, 1], readable), lo)
        g0 = np.searchsorted(bounds, first + lo, side="right") - 1  # (n,) first row group of each range
        g1 = np.maximum(np.searchsorted(bounds, first + hi, side="left"), g0 + 1)  # (n,) one past its last
        cover = np.zeros(len(bounds) + 1, np.int64)  # +1 at each range's first row group, -1 past its last
        np.add.at(cover, g0, 1)
        np.add.at(cover, g1, -1)
        needed = np.flatnonzero(np.cumsum(cover)[: len(bounds) - 1] > 0)  # row groups covering any range, in order
        data = self._read_groups(index, tuple(needed.tolist()), columns)
        sizes = bounds[needed + 1] - bounds[needed]
        at = np.zeros(len(bounds) + 1, np.int64)  # row of ``data`` where each needed row group begins
        at[needed] = np.cumsum(sizes) - sizes
        a = (at[g0] + first + lo - bounds[g0]).tolist()
        b = (np.asarray(a, np.int64) + hi - lo).tolist()
        return [{col: values[i:j] for col, values in data.items()} for i, j in zip(a, b)]

    def group_runs(self, index: int, row_groups: Sequence[int], columns: int) -> Iterator[tuple[int, ...]]:
        """``row_groups`` in runs of about ``CHUNK_BYTES`` (8 bytes a value of ``columns`` columns), one row
        group at least: every read parses the footer, which can cost more than one small row group."""
        rows = self._footers[self.partitions[index].key[0]].rows
        target = max(1, CHUNK_BYTES // (8 * max(columns, 1)))
        run: list[int] = []
        held = 0
        for g in row_groups:
            run.append(g)
            held += rows[g]
            if held >= target:
                yield tuple(run)
                run, held = [], 0
        if run:
            yield tuple(run)

    def _first_partition(self, index: int) -> int:
        """The number of the first partition of partition ``index``'s file."""
        if isinstance(self.partitions, FilePartitions):  # columnar: a search, no dict of every file
            return self.partitions.first_of_file(index)
        first = self.__dict__.get("_first_partitions")
        if first is None:
            first = {}
            for i, part in enumerate(self.partitions):
                first.setdefault(part.key[0], i)
            self.__dict__["_first_partitions"] = first
        return int(first[self.partitions[index].key[0]])

    def _unchanged(self, path: str) -> None:
        """Raise ``SourceReadError`` if local ``path`` is no longer the file opened (``identity.check_local``)."""
        from dask_windows.sources.identity import check_local

        identities = getattr(self, "_identities", {})
        if hasattr(identities, "check_local"):  # opened from an index: a change says the index is stale
            identities.check_local(path)
            return
        check_local(path, identities.get(path))

    def _corrupt_chunk(self, path: str, row_groups: Sequence[int], columns: Sequence) -> str:
        """``"column 'f1' of row group 3 is damaged"``: the first chunk of a failed local read that fails
        alone (at most ``CORRUPT_PROBES`` tried, on the failure path only); ``""`` when none does."""
        probes = 0
        for g in row_groups:
            for col in columns:
                if probes >= CORRUPT_PROBES:
                    return ""
                probes += 1
                try:
                    self._read_table(path, (g,), [col])
                except Exception:
                    return f"column {col!r} of row group {g} is damaged"
        return ""

    def _halo_runs(self, index: int, series: Any, runs: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``runs`` of the partition's own rows joined with its halo's. Without a series column, the cuts
        of one file share its first partition's key, so the file keeps one stride grid across cuts."""
        if series is None and len(runs[2]) == 1:
            runs = (runs[0], runs[1], np.array([self._first_partition(index)]))
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
