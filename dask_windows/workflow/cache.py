"""A workflow's transformed reads kept in memory across epochs, up to a byte budget.

Every epoch reads the same row ranges again (a pool unit, a piece) and, with a workflow,
transforms them again: at B=128, window 96, stride 4 that is the whole cost of a workflow over
streaming the same channels stored ready (benchmarks/log/workflow_cost.md). ``TransformCache``
keeps each range's transformed columns, keyed by what decides them: the partition, the rows,
the columns asked for and the fitted workflow (``token``: a checksum of its artifact, checked
once a pass, so a refit clears it). A hit returns the arrays kept (read-only), equal to what a
fresh read returns; the file is not read then, so a file rewritten after the dataset was opened
is noticed at a miss only (its plan was made from what it held at open; open a new dataset to
read new data).

Policy: keep what fits, never evict. Each epoch reads its units in a new random order; when the
data outgrow the budget, a least-recently-used cache evicts ranges before they come round again
and keeps fewer hits than one that holds the first ranges read (``benchmarks/log/workflow_cost.md``
compares them). The memory is on top of the dataset's ``buffer_bytes``, per process: each
DataLoader worker keeps its own (only with ``persistent_workers=True`` does it outlive an epoch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import numpy as np

__all__ = ["TransformCache", "held_bytes"]


def held_bytes(columns: dict) -> int:
    """The bytes the arrays of ``columns`` keep alive (each view counted as the array it views, once)."""
    roots = {}
    for values in columns.values():
        root = values
        while isinstance(getattr(root, "base", None), np.ndarray):
            root = root.base
        roots[id(root)] = getattr(root, "nbytes", 0)
    return sum(roots.values())


class TransformCache:
    """Transformed row ranges kept up to ``budget`` bytes (0: off), with counters of its use.

    Attributes:
        hits: Reads answered from memory. ``misses``: reads transformed (kept or not).
        held: Bytes kept, never above ``limit``: ``budget``, or its share in a DataLoader worker.
    """

    def __init__(self, budget: int) -> None:
        self.budget, self.limit, self.held, self.hits, self.misses = budget, budget, 0, 0, 0
        self.token: Hashable = None
        self._kept: dict[Hashable, dict] = {}
        self._lock = threading.Lock()

    def check(self, token: Hashable, workers: int = 1) -> None:
        """Forget everything kept if the workflow's ``token`` changed (refitted) since it was kept; keep up
        to ``budget / workers`` bytes (each of a rank's DataLoader workers reads about its share of the units)."""
        with self._lock:
            self.limit = self.budget // workers
            if token != self.token:
                self._kept.clear()
                self.held, self.token = 0, token

    def find(self, key: Hashable) -> dict | None:
        """The columns kept under ``key``, or ``None`` (counted as a hit or a miss)."""
        if not self.budget:
            return None
        with self._lock:
            found = self._kept.get(key)
            self.hits += found is not None
            self.misses += found is None
        return found

    def keep(self, key: Hashable, columns: dict) -> dict:
        """``columns`` (a fresh read's), kept under ``key`` if they fit in what is left of the budget."""
        if not self.budget:
            return columns
        size = held_bytes(columns)
        with self._lock:
            if key not in self._kept and self.held + size <= self.limit:
                for values in columns.values():
                    if isinstance(values, np.ndarray):
                        values.flags.writeable = False  # shared by every later read: a change would show there
                self._kept[key] = columns
                self.held += size
        return columns

    def get(self, key: Hashable, read: Callable[[], dict]) -> dict:
        """``find(key)``, else ``keep(key, read())``."""
        found = self.find(key)
        return found if found is not None else self.keep(key, read())

    def __getstate__(self) -> dict:
        """Pickled (to a DataLoader worker) empty: each process keeps its own."""
        return {"budget": self.budget}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["budget"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"TransformCache({self.held:,} of {self.budget:,} bytes, {self.hits} hits, {self.misses} misses)"
