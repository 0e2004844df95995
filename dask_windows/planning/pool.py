"""The pool order of an epoch, as pure arithmetic: each decode unit read once, mixing bought with memory.

Ranks and workers divide an epoch as ``division`` does. Each reader cuts its share into **units**
(Parquet row groups merged to at least a window, or fixed row ranges) and reads them in a stratified
random order, so any ``S`` consecutive units spread over the whole share. A **pool** keeps the ``S``
most recent units in ``pool_rows`` rows: step ``t`` reads unit ``t`` and releases unit ``t - S``; unit
``i``'s windows, in a random order of their own, are spread over steps ``i .. i + S - 1`` (Mosaic's
``py1e``). The first ``F = fill`` units are read before the first step (earlier steps join it). A
step's windows are shuffled and batches cut from the steps end to end.

Trade-off: a unit is decoded once per epoch (twice at most at a share's ends), and a batch mixes at most
``S`` places: like a global shuffle when ``S >= 2 * batch_size``. A window across a cut is drawn with the
later-read unit; the earlier keeps its rows (``keep``). Batches are a function of ``(seed, epoch)`` and
the inputs; a resume skips finished units without reading them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from dask_windows.planning.division import reader_span
from dask_windows.planning.plan import (
    epoch_order,
    rng_for,
    segment_arrays,
)
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.units import PoolUnit, PoolUnits, place_units
from dask_windows.planning.windows import window_starts
from dask_windows.planning.world import World
from dask_windows.settings.tuning import BLOCK_BATCHES

__all__ = [
    "PARTITIONS_ORDER",
    "POOL_ORDER",
    "PoolPlan",
    "PoolShape",
    "PoolUnit",
    "PoolUnits",
    "block_steps",
    "live_units",
    "merge_bounds",
    "merge_bounds_items",
    "plan_pool",
    "pool_shape",
    "pool_span",
    "pool_starts",
    "reader_steps",
    "reader_windows",
    "shuffle_step",
    "shuffle_unit",
    "slice_ends",
    "step_order",
    "unit_order",
    "unit_permutation",
    "unit_steps",
    "windows_before_items",
]

POOL_ORDER = "pool-2"  # recorded in resume states: a state of another order is refused (pool-1: no fill)
# whole partitions as a pool of ``buffer_partitions`` units (their states before it recorded no order)
PARTITIONS_ORDER = "partitions-2"


@dataclass(frozen=True)
class PoolPlan:
    """What one reader (rank, worker) yields in one epoch under the pool order.

    Attributes:
        units: The reader's units in reading order (``PoolUnits`` or ``PoolUnit`` s); a resume starts at ``first_unit``.
        spread: ``S``: units resident at once; each unit's windows are spread over ``S`` steps.
        start, skip: The first step to draw (``fill - 1`` unless resuming) and its windows already yielded.
        num_windows, num_batches: What this reader yields after the skipped ones.
        entropy: ``(seed, epoch, rank, world_size, worker, num_workers)``: seeds the steps' shuffles.
        group: Steps per block, shuffled together; ``fill``: ``F``, units read before the first step (``0``: ``S``).
    """

    units: Sequence[PoolUnit]
    spread: int
    pool_rows: int
    start: int
    skip: int
    num_windows: int
    num_batches: int
    entropy: tuple[int, ...]
    shuffle: bool = True
    group: int = 1
    fill: int = 0

    @property
    def first_step(self) -> int:
        """The step that draws first: every slice due before it is drawn there."""
        return (self.fill or self.spread) - 1

    @property
    def first_unit(self) -> int:
        """The first unit a pass reads: units released before step ``start`` are not read."""
        return 0 if self.start <= self.spread - 1 else self.start - self.spread + 1

    @property
    def last_step(self) -> int:
        return len(self.units) - 1

    def resident(self, step: int) -> range:
        """Units drawn from at ``step``."""
        first = 0 if step <= self.spread - 1 else step - self.spread + 1
        return range(first, step + 1)


def merge_bounds(bounds: np.ndarray, min_rows: int) -> np.ndarray:
    """Decode unit bounds ``(G+1,)`` with units shorter than ``min_rows`` merged into their neighbours.

    Every unit but a partition's only one then holds at least ``min_rows`` rows, so windows that
    start in a unit reach at most into the next one (``min_rows >= window + horizon``).
    """
    bounds = np.asarray(bounds, np.int64)
    keep = [int(bounds[0])]
    for b in bounds[1:-1].tolist():
        if b - keep[-1] >= min_rows:
            keep.append(b)
    end = int(bounds[-1])
    if len(keep) > 1 and end - keep[-1] < min_rows:
        keep.pop()  # a short last unit joins the one before
    return np.array([*keep, end], np.int64)


def merge_bounds_items(bounds: Ragged, min_rows: int) -> Ragged:
    """``merge_bounds`` of every item of ``bounds`` at once (items where units merge: one at a time)."""
    values = np.asarray(bounds.values, np.int64)
    offsets, item = bounds.offsets, bounds.item_of()
    sizes = bounds.sizes()
    ends = offsets[1:] - 1  # (P,) position of each item's last bound (of an empty item: its next item's first - 1)
    # (N,) per value: the unit it begins is too short, and it is not the last unit of its item
    is_end = np.zeros(len(values) + 1, bool)
    is_end[ends[sizes > 0]] = True
    unit_rows = np.r_[values[1:] - values[:-1], np.int64(0)]  # (N,) rows of the unit each value begins
    last_unit = is_end[1:]  # (N,) the unit a value begins ends its item
    short_inside = ~is_end[: len(values)] & ~last_unit & (unit_rows < min_rows)
    merged = (np.bincount(item[short_inside], minlength=len(sizes)) > 0) | (sizes < 2)  # (P,) through the loop
    keep = ~merged[item]
    # the bound before a short last unit of an item of two units or more
    before_last = ends[~merged & (sizes > 2)] - 1
    keep[before_last[values[before_last + 1] - values[before_last] < min_rows]] = False
    pieces, items = [values[keep]], [item[keep]]
    for p in np.flatnonzero(merged).tolist():
        pieces.append(merge_bounds(values[offsets[p] : offsets[p + 1]], min_rows))
        items.append(np.full(len(pieces[-1]), p, np.int64))
    of = np.concatenate(items)
    order = np.argsort(of, kind="stable")  # item after item, each item's bounds in their order
    out = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(np.bincount(of, minlength=len(sizes)), out=out[1:])
    return Ragged(np.concatenate(pieces)[order], out)


def pool_span(max_rows: int, pool_rows: int, num_units: int, group: int = 1) -> tuple[int, int]:
    """``(S, rows)``: units resident at once and the pool's rows, for units of at most ``max_rows`` rows.

    ``(S + 2 * group + 1) * max_rows <= pool_rows``: the block drawn, the block built ahead, the unit
    being read and one unit lost where placement wraps. At least one unit, over the budget if need be.
    """
    max_rows = max(int(max_rows), 1)
    spread = max(1, min(int(pool_rows) // max_rows - 2 * group - 1, num_units))
    return spread, (spread + 2 * group + 1) * max_rows


def block_steps(windows_per_unit: float, batch_size: int, pool_rows: int, max_rows: int) -> int:
    """Steps per block (``PoolPlan.group``): ``BLOCK_BATCHES`` batches' worth of windows, at most a
    quarter of the pool's units of ``max_rows`` rows, at least one."""
    per_unit = int(max(windows_per_unit, 1.0))
    return max(1, min(-(-BLOCK_BATCHES * batch_size // per_unit), int(pool_rows) // max(int(max_rows), 1) // 4))


def live_units(plan: PoolPlan) -> int:
    """Consecutive units that may be in memory at once (their pool rows never overlap)."""
    return plan.spread + 2 * plan.group


def unit_order(num_units: int, strata: int, rng: np.random.Generator | None) -> np.ndarray:
    """A stratified random order of ``num_units`` units (``rng=None``: their order): any ``strata``
    consecutive units hold one of each of ``strata`` contiguous strata of the dataset order."""
    if rng is None or num_units <= 1:
        return np.arange(num_units, dtype=np.int64)
    m = max(min(strata, num_units), 1)
    stratum = np.arange(num_units, dtype=np.int64) * m // num_units  # (U,) contiguous strata
    slot = rng.permutation(m)  # (m,) place of each stratum inside every round
    within = np.lexsort((rng.random(num_units), stratum))  # units by stratum, randomly inside each
    first = np.searchsorted(stratum, np.arange(m))  # (m,) first unit of each stratum
    rounds = np.empty(num_units, np.int64)
    rounds[within] = np.arange(num_units) - first[stratum[within]]  # (U,) round of each unit
    return np.lexsort((slot[stratum], rounds)).astype(np.int64)


def unit_permutation(plan: PoolPlan, i: int) -> np.ndarray:
    """``(n,)`` the order in which unit ``i``'s windows (numbered from its ``lo``) are drawn."""
    unit = plan.units[i]
    if not plan.shuffle:
        return np.arange(unit.num_windows, dtype=np.int64)
    seed, epoch = plan.entropy[:2]
    return rng_for(seed, epoch, 0x9001, unit.partition, unit.lo).permutation(unit.num_windows).astype(np.int64)


def shuffle_unit(plan: PoolPlan, i: int, values: np.ndarray) -> None:
    """Put ``values`` (one per window of unit ``i``, from its ``lo``) in the order they are drawn, in place.

    The same values as ``values[unit_permutation(plan, i)]``: numpy's ``shuffle`` of ``values`` makes the
    swaps its ``permutation`` makes of an ``arange``, so no index array is built and no gather made.
    """
    if plan.shuffle:
        unit = plan.units[i]
        seed, epoch = plan.entropy[:2]
        rng_for(seed, epoch, 0x9001, unit.partition, unit.lo).shuffle(values)


def slice_ends(plan: PoolPlan, i: Any, j: Any, n: Any) -> Any:
    """Permutation positions where slice ``j`` of unit ``i`` (of ``n`` windows) begins (``j = S``: ``n``).

    A full step draws ``1 / S`` of each resident unit; while the pool fills, a step weighs ``1 / S`` of
    a full one. Integers or arrays.
    """
    s = plan.spread
    ramp = np.clip(s - 1 - i, 0, s) if plan.fill and plan.fill < s else 0  # slices of i at filling steps
    heavy = s if plan.fill and plan.fill < s else 1  # a full step's weight
    done = np.minimum(j, ramp) + heavy * np.maximum(j - ramp, 0)  # weight of slices before j
    total = np.minimum(s, ramp) + heavy * np.maximum(s - ramp, 0)
    return done * n // total


def unit_steps(plan: PoolPlan, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, a, b)``: unit ``i``'s permutation positions ``[a[k], b[k])`` are drawn at ``steps[k]``
    (increasing; at most ``min(windows, S)`` entries): one unit's slices, vectorised."""
    s, last = plan.spread, plan.last_step
    n = plan.units[i].num_windows
    j = np.arange(s, dtype=np.int64)
    step = np.clip(i + j, plan.first_step, last)  # (S,) step of each slice; the first and last join several
    head = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])  # (k,) first slice of each step
    tail = np.r_[head[1:] - 1, s - 1]  # (k,) last slice of each step
    a, b = slice_ends(plan, i, head, n), slice_ends(plan, i, tail + 1, n)
    keep = b > a
    return step[head][keep], a[keep], b[keep]


def _windows_before_step(plan: PoolPlan, counts: np.ndarray, step: int) -> int:
    """Windows of the steps before ``step`` (``first_step <= step <= last``)."""
    if step <= plan.first_step:
        return 0
    i = np.arange(len(counts), dtype=np.int64)
    return int(slice_ends(plan, i, np.clip(step - i, 0, plan.spread), counts).sum())


#: Most (row, run) pairs ``windows_before_items`` holds at once (int64 arrays of this length, a few of them).
PAIRS_PER_CHUNK = 1 << 20


def windows_before_items(first: Ragged, counts: Ragged, stride: int, rows: Ragged) -> np.ndarray:
    """How many windows of each item start before each of its rows: ``(N,)`` for ``rows.values``, item
    ``p``'s rows against item ``p``'s runs (``first`` and ``counts`` share offsets), a chunk at a time."""
    n, r = rows.sizes(), first.sizes()  # (P,) rows and runs of each item
    out = np.zeros(len(rows.values), np.int64)
    pairs = np.cumsum(n * r)  # (P,) pairs of the items up to each
    done = 0
    while done < len(n):
        before = int(pairs[done - 1]) if done else 0
        end = max(done + 1, int(np.searchsorted(pairs, before + PAIRS_PER_CHUNK, side="right")))
        items = np.arange(done, end, dtype=np.int64)
        at = np.arange(rows.offsets[done], rows.offsets[end], dtype=np.int64)  # (n',) the chunk's rows
        runs_of = np.repeat(r[items], n[items])  # (n',) runs of each row's item
        run0 = np.repeat(first.offsets[items], n[items])  # (n',) where its item's runs begin
        pair_ends = np.cumsum(runs_of)  # (n',) pairs up to each row
        # (T,) one entry per (row, run) pair of the chunk, row after row
        row = np.repeat(at, runs_of)
        run = np.repeat(run0 - (pair_ends - runs_of), runs_of) + np.arange(pair_ends[-1] if len(at) else 0)
        inside = np.clip(-(-(rows.values[row].astype(np.int64) - first.values[run]) // stride), 0, counts.values[run])
        sums = np.zeros(len(inside) + 1, np.int64)
        np.cumsum(inside, out=sums[1:])
        out[at] = sums[pair_ends] - sums[pair_ends - runs_of]
        done = end
    return out


def _atoms(
    part: np.ndarray,
    seg_lo: np.ndarray,
    seg_hi: np.ndarray,
    grid_first: Ragged,
    grid_counts: Ragged,
    stride: int,
    span: int,
    bounds: Ragged,
) -> np.ndarray:
    """The reader's units before ordering: ``(A, 6)`` rows ``(partition, unit, wlo, whi, seam, cut)``, of
    the segments ``(K,)`` windows ``[seg_lo, seg_hi)`` of partitions ``part``."""
    if not len(part):
        return np.zeros((0, 6), np.int64)
    by = np.argsort(part, kind="stable")  # dataset order: strata follow it
    part, seg_lo, seg_hi = (np.asarray(x, np.int64)[by] for x in (part, seg_lo, seg_hi))
    b = bounds.take(part)  # per segment, its partition's (G+1,) bounds
    first, counts = grid_first.take(part), grid_counts.take(part)
    c = windows_before_items(first, counts, stride, b)  # (sum G+1,) windows starting before each bound
    c[b.offsets[1:] - 1] = counts.sums()  # the last unit also holds the windows reaching past the end
    # (U,) each unit of each segment: its bounds' positions in ``b.values``, its segment, its number
    last = np.zeros(len(b.values), bool)
    last[b.offsets[1:] - 1] = True
    lo_at = np.flatnonzero(~last)
    hi_at = lo_at + 1
    unit_offsets = b.offsets - np.arange(len(b.offsets), dtype=np.int64)  # (K+1,) G of each segment summed
    seg = np.repeat(np.arange(len(part), dtype=np.int64), np.diff(unit_offsets))
    g = np.arange(len(lo_at), dtype=np.int64) - unit_offsets[seg]
    ending = Ragged(b.values[hi_at] - span + 1, unit_offsets)
    e = windows_before_items(first, counts, stride, ending)  # (U,) windows ending inside each unit
    e = np.minimum(np.maximum(e, c[lo_at]), c[hi_at])
    has = np.diff(unit_offsets) > 0  # (K,) segments with a unit (every one: bounds hold two rows at least)
    e[unit_offsets[1:][has] - 1] = c[b.offsets[1:][has] - 1]  # (no next unit: its windows read past its end)
    wlo, whi = np.maximum(c[lo_at], seg_lo[seg]), np.minimum(c[hi_at], seg_hi[seg])
    keep = whi > wlo
    atoms = np.stack([part[seg], g, wlo, whi, np.maximum(e, wlo), c[hi_at]], axis=1)  # (U, 6)
    return atoms[keep]


def _rows(
    first: Ragged, counts: Ragged, stride: int, span: int, part: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(r0, r1)``: per entry, the rows of partition ``part`` that its windows ``[lo, hi)`` need (``(0, 0)``
    when empty); all entries at once, over the runs of every partition laid end to end."""
    ends = np.cumsum(counts.values, dtype=np.int64)  # (R,) windows of the runs up to each, all partitions
    empty = hi <= lo
    if not len(ends):
        zero = np.zeros(len(part), np.int64)
        return zero, zero.copy()
    base = np.r_[np.int64(0), ends][first.offsets[part]]  # (n,) windows of the partitions before each
    k = np.stack([base + lo, base + hi - 1])  # (2, n) the first and last window, numbered over all partitions
    run = np.minimum(np.searchsorted(ends, k, side="right"), len(ends) - 1)
    start = first.values[run].astype(np.int64) + (k - (ends[run] - counts.values[run])) * stride
    return np.where(empty, 0, start[0]), np.where(empty, 0, start[1] + span)


@dataclass(frozen=True)
class _Atoms:
    """A reader's units before ordering (``_atoms``' columns) and what the plan's arithmetic needs of them."""

    columns: tuple[np.ndarray, ...]  # (6, A) partition, unit, wlo, whi, seam, cut
    link: np.ndarray  # (A,) atom k follows atom k - 1 in its partition (the next unit)
    seam_before: np.ndarray  # (A,) the previous atom's seam
    rows_of: Callable[..., tuple[np.ndarray, np.ndarray]]  # (partitions, lo, hi) -> (r0, r1)
    most: int  # the most rows a unit may place: its windows and those across both of its cuts
    total: int  # windows of the epoch, all readers
    windows: int  # windows of this reader


def _reader_atoms(
    grid_first: Ragged,
    grid_counts: Ragged,
    stride: int,
    span: int,
    bounds: Ragged,
    world: World,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
) -> _Atoms:
    """``world``'s reader's units in ``epoch``, before ordering (``plan_pool``'s first half)."""
    counts = grid_counts.sums()  # (P,) windows of each partition
    total = int(counts.sum())
    lo, hi = reader_span(total, world, batch_size, drop_last)[:2]
    order = epoch_order(len(counts), seed, epoch, shuffle)
    segments = segment_arrays(order, np.zeros(len(order), np.int64), counts[order], lo, hi)
    # (A,) each atom's partition, unit, windows [wlo, whi), the seam (windows from it on end in the next
    # unit) and the cut (the unit's last window bound)
    part, unit, wlo, whi, seam, _ = columns = tuple(_atoms(*segments, grid_first, grid_counts, stride, span, bounds).T)
    link = np.zeros(len(part), bool)
    link[1:] = (part[1:] == part[:-1]) & (unit[1:] == unit[:-1] + 1)
    seam_before = np.r_[np.int64(0), seam[:-1]]
    rows_of = partial(_rows, grid_first, grid_counts, stride, span)
    r0, r1 = rows_of(part, np.where(link, seam_before, wlo), whi)
    most = max(0, int((r1 - r0).max())) if len(part) else 0
    return _Atoms(columns, link, seam_before, rows_of, most, total, hi - lo)


@dataclass(frozen=True)
class PoolShape:
    """How many units a reader's pool holds and draws from, as ``plan_pool`` works it out (no units built):
    the reader's ``units`` and ``windows`` in the epoch, the most rows one unit places (``unit_rows``), and
    ``PoolPlan``'s ``group``, ``spread`` (``resident_units``), ``pool_rows`` and ``fill``."""

    units: int
    unit_rows: int
    group: int
    resident_units: int
    pool_rows: int
    fill: int
    windows: int


def _shape(
    atoms: _Atoms,
    batch_size: int,
    shuffle: bool,
    pool_rows: int,
    max_spread: int | None,
    first_rows: int | None,
    resident: int | None,
) -> PoolShape:
    """``plan_pool``'s block, spread, pool rows and fill for the reader's ``atoms``."""
    num, most = len(atoms.link), atoms.most
    group = 1
    if resident is not None:  # S asked for: the pool holds those units, the block built ahead and the one read
        pool_rows, max_spread = (resident + 2 * group + 1) * max(most, 1), resident
    elif shuffle and num:
        group = block_steps(atoms.windows / num, batch_size, pool_rows, most)
    spread, rows = pool_span(most, pool_rows, min(num, max_spread or num) if shuffle else 1, group)
    spread = min(spread, max(num, 1))
    fill = spread if first_rows is None else max(1, int(first_rows) // max(most, 1))
    fill = spread if 2 * fill > spread else fill  # a fill of half the pool or more: the whole pool mixes better
    return PoolShape(num, most, group, spread, rows, fill, atoms.windows)


def pool_shape(
    grid_first: Sequence[np.ndarray],
    grid_counts: Sequence[np.ndarray],
    stride: int,
    span: int,
    bounds: Sequence[np.ndarray],
    world: World,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    pool_rows: int,
    max_spread: int | None = None,
    first_rows: int | None = None,
    resident: int | None = None,
) -> PoolShape:
    """The shape of ``plan_pool``'s plan with the same arguments (less ``skip_batches``, which does not
    change it), without ordering or placing its units: a few array passes."""
    grid_first, grid_counts, bounds = Ragged.of(grid_first), Ragged.of(grid_counts), Ragged.of(bounds)
    atoms = _reader_atoms(
        grid_first, grid_counts, stride, span, bounds, world, seed, epoch, shuffle, batch_size, drop_last
    )
    return _shape(atoms, batch_size, shuffle, pool_rows, max_spread, first_rows, resident)


def plan_pool(
    grid_first: Sequence[np.ndarray],
    grid_counts: Sequence[np.ndarray],
    stride: int,
    span: int,
    bounds: Sequence[np.ndarray],
    world: World,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    pool_rows: int,
    skip_batches: int = 0,
    max_spread: int | None = None,
    first_rows: int | None = None,
    resident: int | None = None,
) -> PoolPlan:
    """Plan what ``world``'s reader yields in ``epoch`` under the pool order.

    Args:
        grid_first, grid_counts: ``WindowGrid.first`` and ``.counts``.
        span: Rows one window needs (``window + horizon``).
        bounds: Per partition, ``(G+1,)`` rows cutting it into units (``merge_bounds``).
        shuffle: ``False``: windows in dataset order (one unit resident at a time).
        pool_rows: Most rows the pool may hold (the memory budget in rows).
        skip_batches: Batches of this reader already consumed (resumption).
        max_spread: Most units resident at once; ``None``: as many as ``pool_rows`` holds.
        first_rows: Rows read before the first step (``F``); ``None`` or ``F > S / 2``: the whole pool.
        resident: ``S`` as asked (whole partitions: ``buffer_partitions``), one step per block;
            ``pool_rows`` and ``max_spread`` are then not used.
    """
    grid_first, grid_counts, bounds = Ragged.of(grid_first), Ragged.of(grid_counts), Ragged.of(bounds)
    atoms = _reader_atoms(
        grid_first, grid_counts, stride, span, bounds, world, seed, epoch, shuffle, batch_size, drop_last
    )
    lo, hi, reader_batches, skip_batches = reader_span(atoms.total, world, batch_size, drop_last, skip_batches)
    part, unit, wlo, whi, seam, cut = atoms.columns
    num = len(part)
    entropy = (seed, epoch, world.rank, world.world_size, world.worker, world.num_workers)
    link, seam_before, rows_of = atoms.link, atoms.seam_before, atoms.rows_of
    shape = _shape(atoms, batch_size, shuffle, pool_rows, max_spread, first_rows, resident)
    group, spread, rows = shape.group, shape.resident_units, shape.pool_rows
    rng = rng_for(*entropy, 0x9002) if shuffle else None
    ordered = unit_order(num, spread, rng)
    when = np.empty(num, np.int64)
    when[ordered] = np.arange(num)  # (A,) reading position of each atom
    # (A,) per atom, what its neighbours in the partition take (all atoms at once; placed in reading order below)
    prev = link & (np.r_[np.int64(-1), whi[:-1]] == wlo)  # the previous unit's windows end where these begin
    after = np.r_[link[1:], False] & (whi == cut)  # the next unit's windows begin where these end
    prev_earlier = prev & (np.r_[np.int64(0), when[:-1]] < when)
    next_earlier = after & (np.r_[when[1:], np.int64(0)] < when)
    lo_w = np.where(prev_earlier, seam_before, wlo)  # the later of two units takes the windows across their cut
    hi_w = np.where(after & ~next_earlier, seam, whi)
    r0, r1 = rows_of(part, lo_w, hi_w)
    own0 = bounds.values[bounds.offsets[part] + unit].astype(np.int64)  # (A,) the unit's own rows
    own1 = bounds.values[bounds.offsets[part] + unit + 1].astype(np.int64)
    tail = after & ~next_earlier & (seam < whi)  # the next unit, read later, takes this tail
    tail_lo = rows_of(part, seam, whi)[0]
    head = prev & ~prev_earlier & (seam_before < wlo)  # the previous unit, read later, this head
    head_hi = rows_of(part, seam_before, wlo)[1]
    placed = r1 > r0
    fb = np.where(next_earlier, np.minimum(r1, own1), r1)
    fa = np.maximum(r0, own0)
    # (3, A) the row ranges read for each atom: its own rows placed, the tail kept, the head kept
    range_lo = np.stack([fa, tail_lo, own0])
    range_hi = np.stack([fb, own1, head_hi])
    valid = np.stack([placed, tail, head]) & (range_hi > range_lo)
    fresh_lo = np.where(valid, range_lo, np.iinfo(np.int64).max).min(axis=0)
    fresh_hi = np.where(valid, range_hi, np.iinfo(np.int64).min).max(axis=0)
    any_valid = valid.any(axis=0)
    fresh_lo, fresh_hi = np.where(any_valid, fresh_lo, 0), np.where(any_valid, fresh_hi, 0)
    # (A,) each column in reading order
    columns = dict(partition=part, unit=unit, lo=lo_w, hi=hi_w, r0=r0, r1=r1, f0=fresh_lo, f1=fresh_hi)
    columns.update(tail=tail, t0=tail_lo, t1=own1, head=head, h0=own0, h1=head_hi)
    columns = {name: values[ordered] for name, values in columns.items()}
    units = PoolUnits(**columns, offset=place_units(columns["r1"] - columns["r0"], rows))
    spread, fill = shape.resident_units, shape.fill
    plan = PoolPlan(units, spread, rows, 0, 0, 0, 0, entropy, shuffle, group, fill)
    start, skip = _resume_step(plan, skip_batches * batch_size)
    num_windows = max(hi - lo - skip_batches * batch_size, 0)
    pool_rows = rows if len(units) else 0
    return replace(
        plan,
        pool_rows=pool_rows,
        start=start,
        skip=skip,
        num_windows=num_windows,
        num_batches=reader_batches - skip_batches,
    )


def _resume_step(plan: PoolPlan, skip: int) -> tuple[int, int]:
    """``(first step of the block, windows of the block to skip)`` holding window ``skip`` of the stream."""
    last, k, first = plan.last_step, plan.group, plan.first_step
    if last < 0:
        return 0, 0
    counts = PoolUnits.of(plan.units).num_windows  # (A,) windows of each unit
    lo, hi = 0, (last - first) // k  # blocks: the largest whose windows before <= skip
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _windows_before_step(plan, counts, first + mid * k) <= skip:
            lo = mid
        else:
            hi = mid - 1
    start = first + lo * k
    return start, skip - _windows_before_step(plan, counts, start)


def step_order(plan: PoolPlan, step: int, size: int) -> np.ndarray | None:
    """The permutation of a step's ``size`` windows (``None``: kept in their order)."""
    if not plan.shuffle or size < 2:
        return None
    return rng_for(*plan.entropy, 0x9003, step).permutation(size)


def shuffle_step(plan: PoolPlan, step: int, window: np.ndarray) -> None:
    """``window[step_order(plan, step, len(window))]`` in place (as ``shuffle_unit``: no index, no gather)."""
    if plan.shuffle and len(window) >= 2:
        rng_for(*plan.entropy, 0x9003, step).shuffle(window)


def reader_steps(plan: PoolPlan, keys: Callable[[int], np.ndarray]) -> Iterator[np.ndarray]:
    """What the reader yields, step by step: ``keys(i)`` (a value per window of unit ``i``) drawn as
    the plan draws them, after the skipped windows, cut at ``num_windows``. Reads no data."""
    buckets: dict[int, list[np.ndarray]] = {}  # step -> the slices of its units drawn there
    skip, left = plan.skip, plan.num_windows
    admitted = plan.first_unit
    for step in range(plan.start, plan.last_step + 1, plan.group):  # a block of steps at a time
        if left <= 0:
            return
        end = min(step + plan.group, plan.last_step + 1)
        for i in range(admitted, end):  # the units read for this block
            drawn = np.asarray(keys(i))[unit_permutation(plan, i)]
            for t, a, b in zip(*(v.tolist() for v in unit_steps(plan, i))):
                if t >= plan.start:
                    buckets.setdefault(t, []).append(drawn[a:b])
        admitted = end
        picks = [piece for t in range(step, end) for piece in buckets.pop(t, [])]
        window = np.concatenate(picks) if picks else np.zeros(0, np.int64)
        perm = step_order(plan, step, len(window))
        if perm is not None:
            window = window[perm]
        window = window[skip:][:left]
        skip = 0
        left -= len(window)
        if len(window):
            yield window


def reader_windows(plan: PoolPlan) -> Iterator[tuple[int, int]]:
    """``(partition, window)`` of every window the reader yields, in order (the tests' oracle)."""
    keys = lambda i: plan.units[i].partition * (1 << 40) + np.arange(plan.units[i].lo, plan.units[i].hi)
    for window in reader_steps(plan, keys):
        yield from ((int(k) >> 40, int(k) & ((1 << 40) - 1)) for k in window)


def pool_starts(
    plan: PoolPlan, grid_first: Sequence, grid_counts: Sequence, stride: int, row_offsets: np.ndarray
) -> Iterator[np.ndarray]:
    """Dataset start rows of the windows ``plan`` yields, step by step (for the mixing statistics)."""

    def keys(i: int) -> np.ndarray:
        u = plan.units[i]
        return window_starts(grid_first[u.partition], grid_counts[u.partition], stride, u.lo, u.hi) + int(
            row_offsets[u.partition]
        )

    return reader_steps(plan, keys)
