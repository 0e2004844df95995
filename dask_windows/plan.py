"""Which windows one reader yields in an epoch, as pure arithmetic.

An epoch is a virtual sequence: partitions in a per-epoch random order, each
contributing its windows. Ranks take equal contiguous slices of that sequence
(so every rank yields the same number of batches even when partitions differ
in size tenfold, and two ranks share at most the partition where their slices
meet); a rank's batches are divided between its DataLoader workers as
contiguous blocks, so only the rank's final batch can be partial. A reader's
slice is grouped into buffers of ``buffer_partitions`` consecutive partitions,
and windows are shuffled inside a buffer.

The trade-off: mixing is partition-order shuffling plus a full shuffle inside
each buffer, so one batch holds windows of ``buffer_partitions`` partitions,
not of the whole dataset. In exchange memory is bounded by a few partitions
and no window index is ever built. With ``world_size > 1`` the last
``num_windows % world_size`` windows of each epoch's order are left out (a
different few each epoch when shuffling) so that ranks get equal shares.

Nothing here reads data or starts threads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_windows.world import World

__all__ = [
    "EpochPlan",
    "Segment",
    "batches_per_rank",
    "epoch_order",
    "plan_reader",
    "rng_for",
    "windows_per_rank",
    "worker_batch_range",
]


@dataclass(frozen=True)
class Segment:
    """Windows ``[lo, hi)`` (numbered inside their partition) of one partition."""

    partition: int
    lo: int
    hi: int

    @property
    def num_windows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class EpochPlan:
    """What one reader (rank, worker) yields in one epoch.

    Attributes:
        buffers: Groups of segments; each group is decoded together and its windows shuffled.
        buffer_seeds: One seed sequence entropy per buffer, for its permutation.
        skip: Windows of the concatenated buffer streams to skip first (resumption).
        num_windows: Windows this reader yields after ``skip``.
        num_batches: Batches this reader yields after the skipped ones.
    """

    buffers: tuple[tuple[Segment, ...], ...]
    buffer_seeds: tuple[tuple[int, ...], ...]
    skip: int
    num_windows: int
    num_batches: int

    @property
    def partitions(self) -> list[int]:
        """Partitions in reading order (a partition appears once)."""
        return [seg.partition for group in self.buffers for seg in group]


def rng_for(*entropy: int) -> np.random.Generator:
    """A generator derived only from non-negative integers (seed, epoch, rank, ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(e) for e in entropy])))


def epoch_order(num_partitions: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The partition order of an epoch: a permutation when shuffling, else ``0..P-1``."""
    if not shuffle:
        return np.arange(num_partitions, dtype=np.int64)
    return rng_for(seed, epoch, 0x9A87).permutation(num_partitions).astype(np.int64)


def windows_per_rank(num_windows: int, world_size: int) -> int:
    """Equal share of each rank; ``num_windows % world_size`` windows are left out."""
    return num_windows // world_size


def batches_per_rank(num_windows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Exactly how many batches every rank yields per epoch."""
    share = windows_per_rank(num_windows, world_size)
    return share // batch_size if drop_last else -(-share // batch_size)


def worker_batch_range(num_batches: int, worker: int, num_workers: int) -> tuple[int, int]:
    """Contiguous block ``[b0, b1)`` of the rank's batches that ``worker`` yields."""
    return worker * num_batches // num_workers, (worker + 1) * num_batches // num_workers


def _segments(counts: np.ndarray, order: np.ndarray, lo: int, hi: int) -> list[Segment]:
    """Segments covering epoch positions ``[lo, hi)`` of the ordered partitions."""
    ordered = counts[order]
    ends = np.cumsum(ordered)  # (P,) epoch position just past each ordered partition
    starts = ends - ordered
    first = int(np.searchsorted(ends, lo, side="right"))
    segments = []
    for k in range(first, len(order)):
        if starts[k] >= hi:
            break
        a, b = max(lo, int(starts[k])), min(hi, int(ends[k]))
        if b > a:
            segments.append(Segment(int(order[k]), a - int(starts[k]), b - int(starts[k])))
    return segments


def plan_reader(
    windows_per_partition: np.ndarray,
    world: World,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    buffer_partitions: int,
    skip_batches: int = 0,
) -> EpochPlan:
    """Plan what ``world``'s reader yields in ``epoch``.

    Args:
        windows_per_partition: ``(P,)`` valid windows of each partition.
        world: The reader's rank and worker.
        seed: Dataset seed.
        epoch: Epoch number set by ``set_epoch``.
        shuffle: Shuffle partitions and windows.
        batch_size: Windows per batch.
        drop_last: Leave out the rank's final partial batch.
        buffer_partitions: Partitions per buffer.
        skip_batches: Batches of this reader already consumed (resumption).

    Returns:
        The reader's plan; empty when it has no batches.
    """
    counts = np.asarray(windows_per_partition, dtype=np.int64)
    total = int(counts.sum())
    share = windows_per_rank(total, world.world_size)
    num_batches = batches_per_rank(total, world.world_size, batch_size, drop_last)
    used = min(share, num_batches * batch_size)
    b0, b1 = worker_batch_range(num_batches, world.worker, world.num_workers)
    skip_batches = min(max(skip_batches, 0), b1 - b0)
    lo = world.rank * share + b0 * batch_size
    hi = world.rank * share + min(b1 * batch_size, used)
    skip = skip_batches * batch_size
    order = epoch_order(len(counts), seed, epoch, shuffle)
    segments = _segments(counts, order, lo, hi)
    groups, seeds = [], []
    for g in range(0, len(segments), buffer_partitions):
        groups.append(tuple(segments[g : g + buffer_partitions]))
        seeds.append((seed, epoch, world.rank, world.world_size, world.worker, world.num_workers, g))
    # Buffers entirely inside the skipped prefix are dropped without reading them.
    while groups and skip >= sum(s.num_windows for s in groups[0]):
        skip -= sum(s.num_windows for s in groups.pop(0))
        seeds.pop(0)
    return EpochPlan(
        buffers=tuple(groups),
        buffer_seeds=tuple(seeds),
        skip=skip,
        num_windows=max(hi - lo - skip_batches * batch_size, 0),
        num_batches=b1 - b0 - skip_batches,
    )
