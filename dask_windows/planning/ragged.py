"""Per-partition arrays held as one flat array and its offsets.

``Ragged`` keeps ``values`` and ``(P + 1,)`` offsets instead of an array object
per partition (about 112 bytes each before its first number); ``ragged[p]``
builds a view when asked, and code over every partition uses the flat arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["Ragged"]


class Ragged(Sequence[np.ndarray]):
    """``P`` arrays of varying length, item ``p`` the view ``values[offsets[p]:offsets[p + 1]]``.

    Attributes:
        values: ``(N,)`` the items' values, item after item.
        offsets: ``(P + 1,)`` int64 where each item begins in ``values``, the last ``N``.
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values = values
        self.offsets = np.asarray(offsets, np.int64)

    @classmethod
    def of(cls, arrays: Sequence[Any], dtype: Any = np.int64) -> Ragged:
        """The arrays ``arrays`` in one (``dtype``: the values' type when there are none)."""
        if isinstance(arrays, Ragged):
            return arrays
        arrays = [np.asarray(a) for a in arrays]
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        return cls(np.concatenate(arrays) if arrays else np.zeros(0, dtype), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, p: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, p: slice) -> Ragged: ...

    def __getitem__(self, p: Any) -> Any:
        if isinstance(p, slice):  # a copy: nothing here slices, a Sequence must allow it
            return Ragged.of([self[i] for i in range(*p.indices(len(self)))], self.values.dtype)
        p = int(p)
        if p < 0:
            p += len(self)
        if not 0 <= p < len(self):
            raise IndexError(f"item {p} of {len(self)}")
        return self.values[self.offsets[p] : self.offsets[p + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        values, bounds = self.values, self.offsets.tolist()
        return (values[lo:hi] for lo, hi in zip(bounds, bounds[1:]))

    def sizes(self) -> np.ndarray:
        """``(P,)`` length of each item."""
        return np.diff(self.offsets)

    def sums(self) -> np.ndarray:
        """``(P,)`` int64 sum of each item's values (0 for an empty one)."""
        totals = np.zeros(len(self.values) + 1, np.int64)  # (N + 1,) running sums
        np.cumsum(self.values, out=totals[1:])
        return totals[self.offsets[1:]] - totals[self.offsets[:-1]]

    def with_values(self, values: np.ndarray) -> Ragged:
        """The same items' shape over ``values`` (``(N,)``, e.g. computed from ``self.values``)."""
        return Ragged(values, self.offsets)

    def take(self, items: np.ndarray) -> Ragged:
        """Items ``items`` (``(K,)`` item numbers, repeats allowed) in that order, copied into one ``Ragged``."""
        items = np.asarray(items, np.int64)
        begins = self.offsets[items]  # (K,) where each taken item begins in ``values``
        sizes = self.offsets[items + 1] - begins
        offsets = np.zeros(len(items) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # (N',) position in ``values`` of each taken value: its item's beginning plus its place in the item
        at = np.repeat(begins - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        return Ragged(self.values[at], offsets)

    def diffs(self) -> np.ndarray:
        """``np.diff`` of each item, item after item (``(N - P,)`` for items of one value or more)."""
        values = np.asarray(self.values)
        inside = np.ones(max(len(values) - 1, 0), bool)  # (N - 1,) the pair (i, i + 1) lies in one item
        ends = self.offsets[1:-1] - 1  # where an item but the last ends
        inside[ends[(ends >= 0) & (ends < len(inside))]] = False
        return np.diff(values)[inside]

    def item_of(self) -> np.ndarray:
        """``(N,)`` the item each value belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes())
