"""A Parquet source's partitions as columns: a ``Partition`` is built only for a partition asked for.

Opened from the dataset index, a frozen ``Partition`` per file would cost about 12 us and 300
bytes a file before the first batch; ``FilePartitions`` keeps each partition's file number, row
groups and rows as numpy arrays. The trade-off: a read builds its ``Partition`` each time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from dask_windows.sources.base import Partition

__all__ = ["FilePartitions"]


class FilePartitions(Sequence[Partition]):
    """Partitions of Parquet files, in file order and row-group order inside a file.

    Attributes:
        file_of: ``(P,)`` number in ``files`` of each partition's file (ascending).
        group_start, group_stop: ``(P,)`` first row group of each partition, and one past its last.
        num_rows: ``(P,)`` rows of each partition.
        cut: ``(P,)`` whether its file is cut into several partitions (its name says its row groups).
    """

    def __init__(
        self,
        files: Sequence[str],
        file_of: np.ndarray,
        group_start: np.ndarray,
        group_stop: np.ndarray,
        num_rows: np.ndarray,
        cut: np.ndarray,
    ) -> None:
        self.files = files
        self.file_of = np.asarray(file_of, np.int64)
        self.group_start = np.asarray(group_start, np.int64)
        self.group_stop = np.asarray(group_stop, np.int64)
        self.num_rows = np.asarray(num_rows, np.int64)
        self.cut = np.asarray(cut, bool)

    def __len__(self) -> int:
        return len(self.num_rows)

    @overload
    def __getitem__(self, i: int) -> Partition: ...

    @overload
    def __getitem__(self, i: slice) -> list[Partition]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        path = self.path(i)
        groups = tuple(range(int(self.group_start[i]), int(self.group_stop[i])))
        return Partition(self.name(i), int(self.num_rows[i]), (path, groups))

    def __iter__(self) -> Iterator[Partition]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FilePartitions({len(self)} partitions of {len(self.files)} files)"

    def path(self, i: int) -> str:
        """The file of partition ``i``."""
        return self.files[int(self.file_of[i])]

    def name(self, i: int) -> str:
        """Partition ``i``'s name: its file, with its row groups where the file is cut."""
        path = self.path(i)
        if not self.cut[i]:
            return path
        return f"{path}[row groups {int(self.group_start[i])}-{int(self.group_stop[i]) - 1}]"

    @property
    def names(self) -> Sequence[str]:
        """Every partition's name, built when one is asked for (messages name one or two)."""
        return _Names(self)

    def first_of_file(self, i: int) -> int:
        """The first partition of partition ``i``'s file."""
        return int(np.searchsorted(self.file_of, self.file_of[i], side="left"))

    def continues(self, i: int) -> bool:
        """Whether partition ``i`` is a cut of the file of partition ``i - 1``."""
        return i > 0 and bool(self.file_of[i] == self.file_of[i - 1])

    @classmethod
    def of_files(
        cls,
        files: Sequence[str],
        group_rows: np.ndarray,
        row_offsets: np.ndarray,
        whole: np.ndarray,
        cuts: dict[int, list[tuple[int, ...]]],
    ) -> FilePartitions:
        """The partitions of ``files``: a file of ``whole`` ``(F,)`` is one of all its row groups, any other is
        cut as ``cuts[file]`` says (its row groups per partition, each consecutive); ``group_rows`` ``(G,)``
        the rows of every row group, file after file from ``row_offsets`` ``(F + 1,)``. A partition of no
        rows is left out."""
        running = np.zeros(len(group_rows) + 1, np.int64)  # (G + 1,) rows before each row group, all files
        np.cumsum(group_rows, out=running[1:])
        whole = np.asarray(whole, bool)
        # files of one partition: every row group, in one go; files cut: a cut at a time (few files)
        file_of = [np.flatnonzero(whole)]
        first = np.asarray(row_offsets[:-1], np.int64)
        starts = [np.zeros(len(file_of[0]), np.int64)]
        stops = [np.asarray(row_offsets[1:], np.int64)[file_of[0]] - first[file_of[0]]]
        for f in np.flatnonzero(~whole).tolist():
            for groups in cuts[f]:
                file_of.append(np.array([f], np.int64))
                starts.append(np.array([groups[0] if groups else 0], np.int64))
                stops.append(np.array([groups[-1] + 1 if groups else 0], np.int64))
        part_file, start, stop = (np.concatenate(x) for x in (file_of, starts, stops))
        order = np.lexsort((start, part_file))  # (P,) file after file, cuts in their order
        part_file, start, stop = part_file[order], start[order], stop[order]
        rows = running[first[part_file] + stop] - running[first[part_file] + start]
        keep = rows > 0
        return cls(files, part_file[keep], start[keep], stop[keep], rows[keep], ~whole[part_file[keep]])


class _Names(Sequence[str]):
    """The names of ``FilePartitions``, one built when asked for."""

    def __init__(self, partitions: FilePartitions) -> None:
        self._partitions = partitions

    def __len__(self) -> int:
        return len(self._partitions)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._partitions.name(k) for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._partitions.name(i % len(self))
