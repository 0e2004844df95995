"""A reader's pool units as columns: one numpy array per field, a ``PoolUnit`` only for a unit asked for.

``PoolUnits`` is a read-only sequence over the columns ``plan_pool`` computes (``units[i]`` builds a unit,
``units[a:b]`` slices the columns). Trade-off: a unit is built again each time it is asked for (two or
three times a pass), against an object per unit held from the open.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

__all__ = ["PoolUnit", "PoolUnits", "place_units"]


@dataclass(frozen=True)
class PoolUnit:
    """One unit of a reader's plan: its ``partition``, its decode unit there (``unit``, after merging), the
    windows ``[lo, hi)`` it serves (numbered inside the partition), the partition ``rows`` placed in the pool
    from pool row ``offset``, the rows read from the source (``fresh``; ``(0, 0)``: none) and the ranges of
    them kept for a later unit (``keep``: windows across a cut)."""

    partition: int
    unit: int
    lo: int
    hi: int
    rows: tuple[int, int]
    fresh: tuple[int, int]
    keep: tuple[tuple[int, int], ...]
    offset: int

    @property
    def num_windows(self) -> int:
        return self.hi - self.lo

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]


#: The columns of ``PoolUnits``, each ``(A,)`` int64 (``tail``, ``head``: bool): a unit's fields, its
#: ``keep`` as an optional tail ``[t0, t1)`` then an optional head ``[h0, h1)``.
_COLUMNS = ("partition", "unit", "lo", "hi", "r0", "r1", "f0", "f1", "tail", "t0", "t1", "head", "h0", "h1", "offset")


class PoolUnits(Sequence[PoolUnit]):
    """The units of a reader's plan in reading order, one ``(A,)`` array per field (see ``_COLUMNS``)."""

    __slots__ = _COLUMNS

    partition: np.ndarray
    unit: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    f0: np.ndarray
    f1: np.ndarray
    tail: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    head: np.ndarray
    h0: np.ndarray
    h1: np.ndarray
    offset: np.ndarray

    def __init__(self, **columns: Any) -> None:
        for name in _COLUMNS:
            kind = bool if name in ("tail", "head") else np.int64
            setattr(self, name, np.asarray(columns[name], kind))

    @classmethod
    def of(cls, units: Sequence[PoolUnit]) -> PoolUnits:
        """The columns of ``units`` (``PoolUnits`` as they are)."""
        if isinstance(units, PoolUnits):
            return units
        columns: dict[str, list] = {name: [] for name in _COLUMNS}
        for u in units:
            tail = head = (0, 0)
            if len(u.keep) == 2:
                tail, head = u.keep
            elif len(u.keep) == 1:  # one range (a tail or a head: a unit gives it back as it is)
                tail = u.keep[0]
            values = (u.partition, u.unit, u.lo, u.hi, *u.rows, *u.fresh, len(u.keep) >= 1, *tail)
            for name, value in zip(_COLUMNS, (*values, len(u.keep) == 2, *head, u.offset)):
                columns[name].append(value)
        return cls(**columns)

    def __len__(self) -> int:
        return len(self.partition)

    @overload
    def __getitem__(self, i: int) -> PoolUnit: ...

    @overload
    def __getitem__(self, i: slice) -> PoolUnits: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return PoolUnits(**{name: getattr(self, name)[i] for name in _COLUMNS})
        if not -len(self) <= i < len(self):
            raise IndexError(f"unit {i} of {len(self)}")
        keep: tuple[tuple[int, int], ...] = ()
        if self.tail[i]:
            keep = ((int(self.t0[i]), int(self.t1[i])),)
        if self.head[i]:
            keep += ((int(self.h0[i]), int(self.h1[i])),)
        return PoolUnit(
            int(self.partition[i]),
            int(self.unit[i]),
            int(self.lo[i]),
            int(self.hi[i]),
            (int(self.r0[i]), int(self.r1[i])),
            (int(self.f0[i]), int(self.f1[i])),
            keep,
            int(self.offset[i]),
        )

    def __iter__(self) -> Iterator[PoolUnit]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PoolUnits) and all(np.array_equal(getattr(self, n), getattr(other, n)) for n in _COLUMNS):
            return True
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PoolUnits({len(self)} units)"

    @property
    def num_windows(self) -> np.ndarray:
        """``(A,)`` windows of each unit."""
        return self.hi - self.lo

    @property
    def num_rows(self) -> np.ndarray:
        """``(A,)`` pool rows of each unit."""
        return self.r1 - self.r0

    def with_offsets(self, offset: np.ndarray | int) -> PoolUnits:
        """The same units placed at pool rows ``offset`` (one for all, or ``(A,)``)."""
        columns = {name: getattr(self, name) for name in _COLUMNS}
        columns["offset"] = np.broadcast_to(np.asarray(offset, np.int64), (len(self),))
        return PoolUnits(**columns)

    def kept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(partition, lo, hi)``, ``(K,)`` each: every row range a unit keeps for a later one, tails then heads."""
        return (
            np.concatenate([self.partition[self.tail], self.partition[self.head]]),
            np.concatenate([self.t0[self.tail], self.h0[self.head]]),
            np.concatenate([self.t1[self.tail], self.h1[self.head]]),
        )


def place_units(sizes: np.ndarray, rows: int) -> np.ndarray:
    """``(A,)`` the pool row of each of units ``sizes`` (rows each) placed one after the other in a pool of
    ``rows`` rows, a unit that would pass its end placed at row 0 (the rest of the rows unused that time
    round): one ``searchsorted`` per wrap, not a step per unit."""
    sizes = np.asarray(sizes, np.int64)
    before = np.zeros(len(sizes) + 1, np.int64)  # (A + 1,) rows of the units before each
    np.cumsum(sizes, out=before[1:])
    offsets = np.empty(len(sizes), np.int64)
    first = 0  # the unit placed at row 0 last
    while first < len(sizes):
        # the first unit from ``first`` on that would end past the pool: it wraps
        wrap = int(np.searchsorted(before[1:], before[first] + rows, side="right"))
        wrap = max(wrap, first + 1)  # a unit longer than the pool is placed at 0 alone
        offsets[first:wrap] = before[first:wrap] - before[first]
        first = wrap
    return offsets
