"""Row ranges of ``ParquetSource`` partitions: row groups covering them, and the halo.

Moved out of ``parquet`` unchanged, as the ``ParquetRows`` mixin of
``ParquetSource``: a partition cut at row groups reads ``window + horizon - 1``
rows past its end inside its file (its halo, see ``set_window``);
``read_rows`` and ``read_ranges`` read only the row groups covering the rows
asked for (``read_ranges``: several ranges in one read, one coalesced request
on an object store), and ``_halo_runs`` joins a partition's runs with its halo's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_windows.sources.base import Partition
from dask_windows.sources.footers import Footer
from dask_windows.windows import find_runs, join_runs

__all__ = ["ParquetRows"]


class ParquetRows:
    """``ParquetSource``'s reads of row ranges (a mixin: ``ParquetSource`` sets the attributes)."""

    partitions: list[Partition]
    _footers: dict[str, Footer]

    if TYPE_CHECKING:

        def _read_groups(self, index: int, row_groups: Sequence[int], columns: Sequence) -> dict: ...

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
