"""Fetching the column chunks of a Parquet partition from an object store in few requests.

The chunks of the columns asked for are read with one ``cat_ranges`` call (chunks closer than
``max_gap`` bytes merged), and pyarrow reads them from a file object of the fetched blobs,
handed the footer parsed at open: one request per partition for a typical dataset, where
pyarrow's and fsspec's readers read the footer again (benchmarks/log/benchmarks.md). The
trade-off of merging: up to ``max_gap`` bytes of unwanted columns may be fetched."""

from __future__ import annotations

import bisect
import io
import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["FetchedFile", "chunk_ranges", "fetch_ranges", "merge_ranges"]

log = logging.getLogger(__name__)


def chunk_ranges(meta: Any, row_groups: Sequence[int], columns: Sequence) -> list[tuple[int, int]]:
    """Sorted ``[start, stop)`` byte ranges of the chunks of ``columns`` (none found: all) in ``row_groups``."""
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


def merge_ranges(ranges: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """Merge sorted ranges closer than ``max_gap`` bytes, so a partition costs few requests."""
    merged: list[list[int]] = []
    for start, stop in ranges:
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [(a, b) for a, b in merged]


def fetch_ranges(fs: Any, path: str, size: int, ranges: list[tuple[int, int]]) -> FetchedFile:
    """One ``cat_ranges`` call for ``ranges`` of ``path``, as a file object pyarrow can read."""
    blobs = fs.cat_ranges([path] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges], on_error="raise")
    return FetchedFile(fs, path, size, ranges, blobs)


class FetchedFile(io.RawIOBase):
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

    def read(self, size: int | None = -1) -> bytes:
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
