"""Which windows one reader yields in an epoch of the buffer order, as pure arithmetic.

An epoch of the buffer order (``pieces_per_partition=1``: whole partitions, the
0.1 order, the default for Dask frames and for data ``dask-windows convert``
spread over its files) is the partitions in a per-epoch random permutation
(``epoch_order``), their windows laid end to end. Ranks take equal contiguous
slices of that sequence (so every rank yields the same number of batches even
when partitions differ in size tenfold, and two ranks share at most the
partition where their slices meet: each reads its own windows of it, a
*segment*); a rank's batches are divided between its DataLoader workers as
contiguous blocks, so only the rank's final batch can be partial (the one
division of every order: ``division``). A reader's slice is grouped into
buffers of ``buffer_partitions`` consecutive segments, and windows are
shuffled inside a buffer.

The trade-off: a batch holds windows of its buffer's ``buffer_partitions``
partitions only, so it touches few places of the data; each partition is read
once per epoch, and memory is that of two buffers. The default pool order
(``planning.pool``) mixes like a global shuffle at one read per epoch. (The
piece order, partitions cut into pieces taken in a stratified order, was
retired in 0.3: its reads grew with the dataset.) No window index is ever
built. With ``world_size > 1`` the last ``num_windows % world_size`` windows of
each epoch's order are left out (a different few each epoch when shuffling) so
that ranks get equal shares.

Nothing here reads data or starts threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_windows.planning.division import batches_per_rank, reader_span, windows_per_rank, worker_batch_range
from dask_windows.planning.world import World

__all__ = [
    "EpochPlan",
    "Segment",
    "batches_per_rank",
    "epoch_order",
    "plan_reader",
    "reader_span",
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
    def segments(self) -> list[Segment]:
        """Segments in reading order; each is read as one piece."""
        return [seg for group in self.buffers for seg in group]

    @property
    def partitions(self) -> list[int]:
        """The partition of each segment in reading order (a partition appears once per piece read)."""
        return [seg.partition for group in self.buffers for seg in group]


def rng_for(*entropy: int) -> np.random.Generator:
    """A generator derived only from non-negative integers (seed, epoch, rank, ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(e) for e in entropy])))


def epoch_order(num_partitions: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The partition order of an epoch: a permutation when shuffling, else ``0..P-1``."""
    if not shuffle:
        return np.arange(num_partitions, dtype=np.int64)
    return rng_for(seed, epoch, 0x9A87).permutation(num_partitions).astype(np.int64)


def _segments(partition: np.ndarray, first: np.ndarray, counts: np.ndarray, lo: int, hi: int) -> list[Segment]:
    """Segments covering epoch positions ``[lo, hi)`` of pieces laid end to end in epoch order.

    Args:
        partition: ``(N,)`` partition of each piece, in epoch order.
        first: ``(N,)`` first window (in its partition) of each piece.
        counts: ``(N,)`` windows of each piece.
        lo: First epoch position wanted.
        hi: One past the last.
    """
    part, a, b = segment_arrays(partition, first, counts, lo, hi)
    return [Segment(p, x, y) for p, x, y in zip(part.tolist(), a.tolist(), b.tolist())]


def segment_arrays(
    partition: np.ndarray, first: np.ndarray, counts: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_segments`` as three ``(K,)`` arrays: each segment's partition and windows ``[lo, hi)``."""
    ends = np.cumsum(counts)  # (N,) epoch position just past each ordered piece
    starts = ends - counts
    k0 = int(np.searchsorted(ends, lo, side="right"))
    k1 = int(np.searchsorted(starts, hi, side="left"))
    a = np.maximum(starts[k0:k1], lo)  # (K,) epoch positions each piece covers, clipped to [lo, hi)
    b = np.minimum(ends[k0:k1], hi)
    base = first[k0:k1] - starts[k0:k1]  # (K,) window in its partition minus epoch position
    keep = b > a
    return partition[k0:k1][keep], (a + base)[keep], (b + base)[keep]


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
        buffer_partitions: Partitions (segments) per buffer.
        skip_batches: Batches of this reader already consumed (resumption).

    Returns:
        The reader's plan; empty when it has no batches.
    """
    counts = np.asarray(windows_per_partition, dtype=np.int64)
    total = int(counts.sum())
    lo, hi, reader_batches, skip_batches = reader_span(total, world, batch_size, drop_last, skip_batches)
    skip = skip_batches * batch_size
    order = epoch_order(len(counts), seed, epoch, shuffle)  # whole partitions, in a permutation of partitions
    segments = _segments(order, np.zeros(len(order), np.int64), counts[order], lo, hi)
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
        num_batches=reader_batches - skip_batches,
    )
