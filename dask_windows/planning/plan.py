"""Which windows one reader yields in an epoch, as pure arithmetic.

An epoch is a virtual sequence of *pieces*: each partition's windows are cut
into up to ``pieces_per_partition`` contiguous ranges (``piece_table``; along
the source's decode units where it has them, ``unit_pieces``: a piece of a
Parquet file holds whole row groups or lies inside one), and
the pieces of all partitions are taken in a per-epoch *stratified* random
order (``piece_order``): the dataset, in file order, is cut into ``m`` strata
(``m`` = pieces per buffer), and any ``m`` consecutive pieces of the order
hold one piece of each stratum. Ranks take equal contiguous slices of that
sequence (so every rank yields the same number of batches even when
partitions differ in size tenfold, and two ranks share at most the piece where
their slices meet); a rank's batches are divided between its DataLoader
workers as contiguous blocks, so only the rank's final batch can be partial
(the one division of every order: ``division``).
A reader's slice is grouped into buffers of ``buffer_partitions *
pieces_per_partition`` consecutive pieces, and windows are shuffled inside a
buffer.

The trade-off: a batch holds windows of the ``m`` pieces of its buffer only,
not of the whole dataset, so it touches at most ``m`` places; but as every
buffer is spread evenly over the dataset (a stratified sample of it), a
batch's mean regime varies little more than a global shuffle's, and
consecutive batches of one buffer are not correlated through the buffer's
composition (with a plain random piece order they were: lag-1 about
``B / (B + m)``). Memory stays that of ``buffer_partitions`` partitions
(each piece holds ``1 / k`` of one, plus a halo of ``window + horizon - 1``
rows), but each partition is read up to ``k`` times per epoch (a buffer's
pieces of one partition are read in one call, and with buffer ``2i + 1``'s
pieces of it when the reader pairs buffers (``reading.PairedReads``); a
Parquet row group is decoded, and fetched remotely, once per read that needs
it, and a piece ending at a row-group cut takes its halo from the next row
group's first rows, kept when that row group was decoded).
``pieces_per_partition=1`` is the 0.1 order: buffers of whole partitions in a
plain permutation. No window index is ever built: the piece table holds
O(partitions * k) numbers. With ``world_size > 1`` the last
``num_windows % world_size`` windows of each epoch's order are left out (a
different few each epoch when shuffling) so that ranks get equal shares.

Nothing here reads data or starts threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dask_windows.planning.division import batches_per_rank, reader_span, windows_per_rank, worker_batch_range
from dask_windows.planning.world import World

__all__ = [
    "PIECE_ORDER",
    "EpochPlan",
    "Segment",
    "batches_per_rank",
    "epoch_order",
    "piece_order",
    "piece_table",
    "plan_reader",
    "reader_span",
    "rng_for",
    "unit_pieces",
    "windows_per_rank",
    "worker_batch_range",
]


PIECE_ORDER = "stratified-units"  # recorded in resume states: states of an earlier piece plan are refused
# ("stratified": pieces cut by window count alone, across row groups; before it, a plain permutation)


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


def piece_table(
    counts: np.ndarray,
    pieces_per_partition: int,
    min_windows: int = 1,
    cells: Sequence[np.ndarray | None] | None = None,
) -> tuple[np.ndarray, ...]:
    """Cut each partition's windows into contiguous pieces of nearly equal size.

    A partition of ``c`` windows gets ``n = min(pieces_per_partition, max(1, c // min_windows))``
    pieces (none when ``c == 0``); piece ``j`` of ``n`` holds windows ``[j * c // n, (j + 1) * c // n)``.
    Where ``cells[p]`` gives the windows starting in each of the source's decode units (Parquet
    row groups) of partition ``p``, the pieces follow them instead (``unit_pieces``): no piece
    holds windows of two units unless it holds both whole.

    Args:
        counts: ``(P,)`` windows of each partition.
        pieces_per_partition: Most pieces per partition.
        min_windows: Fewest windows per piece (bounds the halo a piece reads beyond its rows).
        cells: Per partition, ``(G,)`` windows starting in each decode unit (summing to
            ``counts[p]``), or ``None`` for a partition (or a source) without such units.

    Returns:
        ``(partition, lo, hi)``, each ``(N,)`` int64: pieces in canonical order (partition, then row).
    """
    counts = np.asarray(counts, dtype=np.int64)
    if cells is not None and any(c is not None for c in cells):
        return _unit_table(counts, pieces_per_partition, min_windows, cells)
    n = np.where(counts > 0, np.clip(counts // max(min_windows, 1), 1, pieces_per_partition), 0)  # (P,) pieces
    partition = np.repeat(np.arange(len(counts), dtype=np.int64), n)  # (N,) partition of each piece
    first = np.cumsum(n) - n  # (P,) number of each partition's first piece
    j = np.arange(len(partition), dtype=np.int64) - first[partition]  # (N,) piece number inside its partition
    c, m = counts[partition], n[partition]
    return partition, j * c // m, (j + 1) * c // m


def unit_pieces(cells: np.ndarray, n: int, min_windows: int = 1) -> np.ndarray:
    """``(n' + 1,)`` window numbers cutting one partition into about ``n`` pieces along its decode units.

    ``cells``: ``(G,)`` windows starting in each unit (row group). With ``n`` at most the units
    that hold windows, piece ``j`` is the run of whole units ``[j * G' // n, (j + 1) * G' // n)``
    (``G'`` non-empty units): a unit is decoded for one piece only. With more, the ``n`` pieces are
    shared among the units in proportion to their windows (rounded cumulatively, so equal units
    get equal shares and the shares sum to ``n``), at least one and at most ``s // min_windows``
    for a unit of ``s`` windows, and each unit is cut into near-equal pieces of its own: a piece
    never reaches into a second unit but by its halo.
    """
    cells = np.asarray(cells, np.int64)
    full = cells[cells > 0]  # (G',) windows of each unit that holds any
    ends = np.cumsum(full)  # (G',) window number just past each such unit
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        return np.zeros(1, np.int64)
    if n <= len(full):  # runs of whole units
        j = np.arange(1, n + 1, dtype=np.int64) * len(full) // n  # (n,) units before each cut
        return np.concatenate([[0], ends[j - 1]]).astype(np.int64)
    share = (2 * n * ends + total) // (2 * total)  # (G',) pieces up to each unit's end, rounded: n in all
    per = np.clip(np.diff(share, prepend=0), 1, np.maximum(full // max(min_windows, 1), 1))  # (G',) each unit's
    unit = np.repeat(np.arange(len(full)), per)  # (n',) unit of each piece
    j = np.arange(len(unit)) - np.repeat(np.cumsum(per) - per, per)  # (n',) piece number inside its unit
    lo = (ends - full)[unit] + j * full[unit] // per[unit]
    return np.concatenate([lo, [total]]).astype(np.int64)


def _unit_table(
    counts: np.ndarray, pieces_per_partition: int, min_windows: int, cells: Sequence[np.ndarray | None]
) -> tuple[np.ndarray, ...]:
    """``piece_table`` with pieces along decode units where ``cells`` gives them."""
    n = np.where(counts > 0, np.clip(counts // max(min_windows, 1), 1, pieces_per_partition), 0)  # (P,)
    parts, los, his = [], [], []
    for p, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        cell = cells[p] if p < len(cells) else None
        if cell is None or int(np.sum(cell)) != c:  # no units (or not these windows): equal pieces
            cuts = np.arange(int(n[p]) + 1, dtype=np.int64) * c // int(n[p])
        else:
            cuts = unit_pieces(cell, int(n[p]), min_windows)
        parts.append(np.full(len(cuts) - 1, p, np.int64))
        los.append(cuts[:-1])
        his.append(cuts[1:])
    if not parts:
        return tuple(np.zeros(0, np.int64) for _ in range(3))
    return np.concatenate(parts), np.concatenate(los), np.concatenate(his)


def piece_order(num_pieces: int, seed: int, epoch: int, shuffle: bool, per_buffer: int | None = None) -> np.ndarray:
    """The piece order of an epoch (pieces split partitions, ``pieces_per_partition > 1``).

    With ``per_buffer`` (pieces per buffer, ``m``) the order is *stratified*: the canonical order
    (partition, then row) is cut into ``m`` contiguous strata of nearly equal size, each stratum's
    pieces are taken in a random order, and the epoch is a sequence of rounds, round ``r`` holding
    the ``r``-th piece of every stratum, the strata in one random order shared by all rounds. So
    any ``m`` consecutive pieces (a buffer, wherever a rank's or worker's slice begins) hold one
    piece of every stratum (two of at most one where a round is partial): each buffer is spread
    evenly over the whole dataset, and consecutive batches no longer share a buffer's bias.
    ``None``: a plain random permutation (the order before stratification).

    Args:
        num_pieces: Pieces in the epoch (``N``).
        seed: Dataset seed.
        epoch: The epoch.
        shuffle: ``False``: canonical order.
        per_buffer: Pieces per buffer (``m``); ``None``: a plain permutation.

    Returns:
        ``(N,)`` int64: canonical piece numbers in epoch order.
    """
    if not shuffle:
        return np.arange(num_pieces, dtype=np.int64)
    if per_buffer is None:
        return rng_for(seed, epoch, 0x9A88).permutation(num_pieces).astype(np.int64)
    m = max(min(per_buffer, num_pieces), 1)
    rng = rng_for(seed, epoch, 0x9A89)
    stratum = np.arange(num_pieces, dtype=np.int64) * m // max(num_pieces, 1)  # (N,) contiguous strata
    slot = rng.permutation(m)  # (m,) place of each stratum inside every round
    within = np.lexsort((rng.random(num_pieces), stratum))  # pieces by stratum, randomly inside each
    first = np.searchsorted(stratum, np.arange(m))  # (m,) first canonical piece of each stratum
    rounds = np.empty(num_pieces, np.int64)
    rounds[within] = np.arange(num_pieces) - first[stratum[within]]  # (N,) round of each piece
    return np.lexsort((slot[stratum], rounds)).astype(np.int64)


def _segments(partition: np.ndarray, first: np.ndarray, counts: np.ndarray, lo: int, hi: int) -> list[Segment]:
    """Segments covering epoch positions ``[lo, hi)`` of pieces laid end to end in epoch order.

    Args:
        partition: ``(N,)`` partition of each piece, in epoch order.
        first: ``(N,)`` first window (in its partition) of each piece.
        counts: ``(N,)`` windows of each piece.
        lo: First epoch position wanted.
        hi: One past the last.
    """
    ends = np.cumsum(counts)  # (N,) epoch position just past each ordered piece
    starts = ends - counts
    k0 = int(np.searchsorted(ends, lo, side="right"))
    k1 = int(np.searchsorted(starts, hi, side="left"))
    a = np.maximum(starts[k0:k1], lo)  # (K,) epoch positions each piece covers, clipped to [lo, hi)
    b = np.minimum(ends[k0:k1], hi)
    base = first[k0:k1] - starts[k0:k1]  # (K,) window in its partition minus epoch position
    keep = b > a
    return [
        Segment(p, x, y)
        for p, x, y in zip(partition[k0:k1][keep].tolist(), (a + base)[keep].tolist(), (b + base)[keep].tolist())
    ]


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
    pieces_per_partition: int = 1,
    min_piece_windows: int = 1,
    cells: Sequence[np.ndarray | None] | None = None,
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
        buffer_partitions: Partitions per buffer (in rows: a buffer holds ``buffer_partitions *
            pieces_per_partition`` pieces).
        skip_batches: Batches of this reader already consumed (resumption).
        pieces_per_partition: Most pieces each partition is cut into; ``1``: whole partitions.
        min_piece_windows: Fewest windows per piece (see ``piece_table``).
        cells: Per partition, windows starting in each of its decode units (see ``piece_table``).

    Returns:
        The reader's plan; empty when it has no batches.
    """
    counts = np.asarray(windows_per_partition, dtype=np.int64)
    total = int(counts.sum())
    lo, hi, reader_batches, skip_batches = reader_span(total, world, batch_size, drop_last, skip_batches)
    skip = skip_batches * batch_size
    per_buffer = buffer_partitions * pieces_per_partition
    if pieces_per_partition == 1:  # the 0.1 order: whole partitions, in a permutation of partitions
        order = epoch_order(len(counts), seed, epoch, shuffle)
        segments = _segments(order, np.zeros(len(order), np.int64), counts[order], lo, hi)
    else:  # pieces in a stratified order: every buffer spread over the whole dataset
        partition, first, last = piece_table(counts, pieces_per_partition, min_piece_windows, cells)
        order = piece_order(len(partition), seed, epoch, shuffle, per_buffer)
        segments = _segments(partition[order], first[order], (last - first)[order], lo, hi)
    groups, seeds = [], []
    for g in range(0, len(segments), per_buffer):
        group = segments[g : g + per_buffer]
        if pieces_per_partition > 1:  # in file order: a buffer's pieces of one partition are read in one call
            group = sorted(group, key=lambda seg: (seg.partition, seg.lo))
        groups.append(tuple(group))
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
