"""Numpy arrays and ``.npy`` memmaps as a source: each array ``(rows, C)`` one series, or one 2-D array
cut into series by an id vector (``ArraySource.from_series``, views). Short series are grouped into
partitions of about ``partition_rows``; a longer one is cut into partitions reading ``window +
horizon - 1`` rows past their end. Memmapped rows are copied once and their pages handed back, and
memmaps pickle into DataLoader workers as file references."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError
from dask_windows.planning.windows import find_runs
from dask_windows.sources.base import DEFAULT_PARTITION_ROWS, Partition, Source

__all__ = ["ArraySource"]


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
    """Drop the resident pages under ``block`` from this process (they stay in the page cache); not of
    copy-on-write memmaps, whose pages hold edits."""
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
        return np.memmap(self.filename, self.dtype, self.mode, self.offset, self.shape, order="C")  # type: ignore[call-overload]

    def read(self) -> np.ndarray:
        """The block's values, read with file I/O into a fresh array (no pages mapped)."""
        count = int(np.prod(self.shape))
        with open(self.filename, "rb") as f:
            f.seek(self.offset)
            values = np.fromfile(f, self.dtype, count)
        if len(values) != count:
            raise OSError(f"{self.filename} is shorter than the array mapped from it; it changed after it was opened")
        return values.reshape(self.shape)


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
    """Numpy arrays or ``.npy`` memmaps, each ``(rows, C)`` and one series, in canonical order: small arrays
    grouped into partitions of about ``partition_rows`` rows, a longer one cut into partitions of that
    many rows (overlapping by a window's span); ``series_ids``: each array's run key (default: its position)."""

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
    def from_series(cls, array: np.ndarray, series: Any, partition_rows: int = DEFAULT_PARTITION_ROWS) -> ArraySource:
        """One ``(rows, C)`` array cut into series (views) where ``series``, a ``(rows,)`` id vector, changes."""
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
        return list(range(self.width))  # type: ignore[arg-type]

    def read(self, index: int, columns: Sequence) -> dict:
        return self.read_rows(index, columns, 0, self.readable_rows(index))

    def read_rows(self, index: int, columns: Sequence, lo: int, hi: int) -> dict:
        """Rows ``[lo, hi)`` of the partition's rows read (halo included): only those are copied."""
        blocks = []
        at = 0  # partition row of the current array block's first row
        for i, first, _, count in self.partitions[index].key:
            a, b = max(lo - at, 0), min(hi - at, count)
            at += count
            if b <= a:
                continue
            block = self.arrays[i][first + a : first + b]
            ref = _memmap_ref(block)
            owner = _memmap_of(block)
            if ref is not None:  # read from the file: a small piece maps no pages (the kernel would map
                block = ref.read()  # whole large folios around it, and random pieces the whole file in time)
            elif owner is not None:  # one sequential copy, then let the kernel have the pages back
                copy = np.array(block)
                _release_pages(block, owner)
                block = copy
            blocks.append(block)
        if not blocks:
            blocks.append(self.arrays[self.partitions[index].key[0][0]][:0])
        if len(blocks) == 1:
            return {col: blocks[0][:, col] for col in columns}
        return {col: np.concatenate([b[:, col] for b in blocks]) for col in columns}

    def read_ranges(self, index: int, columns: Sequence, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        """Each range on its own: a slice copies only its rows."""
        return [self.read_rows(index, columns, lo, hi) for lo, hi in ranges]

    def readable_rows(self, index: int) -> int:
        return sum(count for _, _, _, count in self.partitions[index].key)

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
