"""The division of an epoch between ranks and DataLoader workers: the rule that keeps DDP from hanging.

Every order (a dataset's windows, a mixture's schedule, a corpus's sequences, an elastic rest) is a
sequence of ``total`` units divided here, so every rank yields the same number of batches. Ranks take
contiguous shares, *equal* (``total // world_size`` each, the remainder left out) or *balanced* (an
elastic rest: the remainder to the first ranks while every rank can fill as many non-empty batches).
Full batches come first, then shorter ones, never an empty one; worker ``w`` of ``W`` takes batches
``[w * n // W, (w + 1) * n // W)`` (``round_robin``: what each has yielded after ``k`` in-order batches).
Trade-off: equal shares drop up to ``world_size - 1`` units an epoch rather than repeat some.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.planning.world import World

__all__ = [
    "ReaderShare",
    "batches_per_rank",
    "reader_share",
    "reader_span",
    "round_robin",
    "windows_per_rank",
    "worker_batch_range",
    "worker_batches",
]


@dataclass(frozen=True)
class ReaderShare:
    """One reader's (rank, worker) part of an epoch of units: the rank's share (``rank_start``,
    ``rank_units``), every rank's ``rank_batches``, the reader's batches ``[first_batch, stop_batch)``
    and the units no rank yields (``left_out``, besides a ``drop_last`` batch)."""

    rank_start: int
    rank_units: int
    rank_batches: int
    batch_size: int
    first_batch: int
    stop_batch: int
    left_out: int

    def bound(self, batch: int) -> int:
        """Epoch position where the rank's batch ``batch`` starts (``rank_batches``: where its last ends)."""
        end = min(batch * self.batch_size, self.rank_units - (self.rank_batches - batch))
        return self.rank_start + end

    @property
    def lo(self) -> int:
        """Epoch position of the reader's first unit."""
        return self.bound(self.first_batch)

    @property
    def hi(self) -> int:
        """One past the reader's last unit."""
        return self.bound(self.stop_batch)

    @property
    def num_batches(self) -> int:
        """The reader's batches."""
        return self.stop_batch - self.first_batch

    def start_after(self, skip_batches: int) -> int:
        """Epoch position of the reader's first unit after its first ``skip_batches`` batches (clipped to them)."""
        return self.bound(self.first_batch + min(max(skip_batches, 0), self.num_batches))

    def sizes(self) -> np.ndarray:
        """``(num_batches,)`` units of each of the reader's batches."""
        j = np.arange(self.first_batch, self.stop_batch + 1, dtype=np.int64)  # (num_batches + 1,) batch numbers
        return np.diff(np.minimum(j * self.batch_size, self.rank_units - (self.rank_batches - j)))


def _rank_layout(total: int, world_size: int, batch_size: int, drop_last: bool, balanced: bool) -> tuple[int, int, int]:
    """``(share, extra, num_batches)``: every rank holds ``share`` units, the first ``extra`` ranks one more,
    and every rank yields ``num_batches`` batches."""
    share = total // world_size
    if balanced:
        extra = total % world_size
        num_batches = -(-(share + (extra > 0)) // batch_size)
        if share >= num_batches:  # every rank, the smallest share too, fills that many non-empty batches
            return share, extra, num_batches
    return share, 0, share // batch_size if drop_last else -(-share // batch_size)


def reader_share(
    total: int, world: World, batch_size: int, drop_last: bool = False, *, balanced: bool = False
) -> ReaderShare:
    """What reader ``world`` yields of an epoch of ``total`` units: the one division every order uses.

    ``balanced``: the remainder to the first ranks (see the module). Raises ``ConfigError`` for
    ``balanced`` with ``drop_last`` or a ``batch_size`` below 1.
    """
    if balanced and drop_last:
        raise ConfigError("a balanced division yields every unit: it takes no drop_last")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    share, extra, num_batches = _rank_layout(total, world.world_size, batch_size, drop_last, balanced)
    b0, b1 = worker_batch_range(num_batches, world.worker, world.num_workers)
    return ReaderShare(
        rank_start=world.rank * share + min(world.rank, extra),
        rank_units=share + (world.rank < extra),
        rank_batches=num_batches,
        batch_size=batch_size,
        first_batch=b0,
        stop_batch=b1,
        left_out=total - world.world_size * share - extra,
    )


def reader_span(
    total: int, world: World, batch_size: int, drop_last: bool, skip_batches: int = 0
) -> tuple[int, int, int, int]:
    """``(lo, hi, batches, skip)``: the reader's positions of an epoch of ``total`` windows, its batches
    before any skip and ``skip_batches`` clipped to them."""
    share = reader_share(total, world, batch_size, drop_last)
    return share.lo, share.hi, share.num_batches, min(max(skip_batches, 0), share.num_batches)


def windows_per_rank(num_windows: int, world_size: int) -> int:
    """Equal share of each rank; ``num_windows % world_size`` windows are left out."""
    return _rank_layout(num_windows, world_size, 1, False, False)[0]


def batches_per_rank(num_windows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Exactly how many batches every rank yields per epoch."""
    return _rank_layout(num_windows, world_size, batch_size, drop_last, False)[2]


def worker_batch_range(num_batches: int, worker: int, num_workers: int) -> tuple[int, int]:
    """Contiguous block ``[b0, b1)`` of the rank's batches that ``worker`` yields."""
    return worker * num_batches // num_workers, (worker + 1) * num_batches // num_workers


def worker_batches(num_batches: int, num_workers: int) -> list[int]:
    """``(num_workers,)`` batches each DataLoader worker yields of its rank's ``num_batches``."""
    return [b1 - b0 for b0, b1 in (worker_batch_range(num_batches, w, num_workers) for w in range(num_workers))]


def round_robin(batches_per_worker: Sequence[int], taken: int) -> tuple[np.ndarray, int]:
    """``(consumed, next_worker)``: ``(W,)`` batches each worker had yielded of the first ``taken`` of an
    in-order DataLoader (it asks workers in turn, skipping one with none left), and the worker due next
    (``0`` once every batch is taken)."""
    n = np.asarray(batches_per_worker, dtype=np.int64)
    total = int(n.sum())
    if not 0 <= taken <= total:
        raise ConfigError(f"batches={taken} must be in [0, {total}], the batches of this rank's epoch")
    lo, hi = 0, int(n.max(initial=0))
    while lo < hi:  # largest round r with sum(min(n, r)) <= taken
        mid = (lo + hi + 1) // 2
        if int(np.minimum(n, mid).sum()) <= taken:
            lo = mid
        else:
            hi = mid - 1
    consumed = np.minimum(n, lo)
    active = np.flatnonzero(n > lo)  # workers still yielding in round lo, in asking order
    rest = taken - int(consumed.sum())
    consumed[active[:rest]] += 1
    next_worker = int(active[rest]) if rest < len(active) else 0
    return consumed, next_worker
