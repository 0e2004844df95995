"""The pool plan's vectorised arithmetic against its earlier per-unit loops, kept here as the oracle.

``plan_pool`` used to walk its units in Python (``windows_before`` and ``_rows`` per unit: 27 s at 10^5
files); it now computes them over flat arrays. The plans must be equal, unit for unit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pool_plan import layouts, windows_before

from dask_windows.planning.division import reader_span
from dask_windows.planning.plan import Segment, epoch_order, rng_for, segment_arrays
from dask_windows.planning.pool import (
    BLOCK_BATCHES,
    PoolPlan,
    PoolUnit,
    _resume_step,
    plan_pool,
    pool_span,
    unit_order,
    windows_before_items,
)
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.world import World


def old_atoms(
    segments: Sequence, grid_first: Sequence, grid_counts: Sequence, stride: int, span: int, bounds: Sequence
) -> list[tuple[int, int, int, int, int, int]]:
    """The reader's units before ordering: ``(partition, unit, wlo, whi, seam, ...)``."""
    atoms = []
    for seg in sorted(segments, key=lambda s: s.partition):  # dataset order: strata follow it
        b = bounds[seg.partition]
        first, counts = grid_first[seg.partition], grid_counts[seg.partition]
        c = windows_before(first, counts, stride, b)  # (G+1,) windows starting before each bound
        c[-1] = int(np.sum(counts))  # the last unit also holds the windows reaching past the end
        e = windows_before(first, counts, stride, b[1:] - span + 1)  # (G,) windows ending inside each unit
        e = np.minimum(np.maximum(e, c[:-1]), c[1:])
        e[-1] = c[-1]  # (no next unit: the last one's windows read past its end themselves)
        for g in range(len(b) - 1):
            wlo, whi = max(int(c[g]), seg.lo), min(int(c[g + 1]), seg.hi)
            if whi > wlo:
                atoms.append((seg.partition, g, wlo, whi, max(int(e[g]), wlo), int(c[g + 1])))
    return atoms


def old_rows(first: np.ndarray, counts: np.ndarray, stride: int, span: int, lo: int, hi: int) -> tuple[int, int]:
    """Partition rows that windows ``[lo, hi)`` need (``(0, 0)`` when empty)."""
    if hi <= lo:
        return 0, 0
    ends = np.cumsum(np.asarray(counts, np.int64))
    k = np.array([lo, hi - 1], np.int64)
    run = np.searchsorted(ends, k, side="right")
    start = np.asarray(first, np.int64)[run] + (k - (ends[run] - np.asarray(counts, np.int64)[run])) * stride
    return int(start[0]), int(start[1]) + span


def old_plan_pool(
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
) -> PoolPlan:
    """``plan_pool`` before its loops over units were vectorised (the oracle)."""
    counts = np.array([int(np.sum(c)) for c in grid_counts], np.int64)  # (P,) windows of each partition
    total = int(counts.sum())
    lo, hi, reader_batches, skip_batches = reader_span(total, world, batch_size, drop_last, skip_batches)
    order = epoch_order(len(counts), seed, epoch, shuffle)
    arrays = segment_arrays(order, np.zeros(len(order), np.int64), counts[order], lo, hi)
    segments = [Segment(p, a, b) for p, a, b in zip(*(v.tolist() for v in arrays))]
    atoms = old_atoms(segments, grid_first, grid_counts, stride, span, bounds)
    entropy = (seed, epoch, world.rank, world.world_size, world.worker, world.num_workers)
    # The most rows a unit may place: its windows and those across both of its cuts.
    most = 0
    for k, (p, g, wlo, whi, _, _) in enumerate(atoms):
        a = atoms[k - 1][4] if k and atoms[k - 1][0] == p and atoms[k - 1][1] == g - 1 else wlo
        r0, r1 = old_rows(grid_first[p], grid_counts[p], stride, span, a, whi)
        most = max(most, r1 - r0)
    group = 1
    if shuffle and atoms:  # steps per block: BLOCK_BATCHES batches' worth of windows, at most a quarter of the pool
        per_unit = max((hi - lo) / len(atoms), 1.0)
        group = max(1, min(-(-BLOCK_BATCHES * batch_size // int(per_unit)), pool_rows // max(most, 1) // 4))
    spread, rows = pool_span(most, pool_rows, min(len(atoms), max_spread or len(atoms)) if shuffle else 1, group)
    rng = rng_for(*entropy, 0x9002) if shuffle else None
    ordered = unit_order(len(atoms), spread, rng)
    when = np.empty(len(atoms), np.int64)
    when[ordered] = np.arange(len(atoms))  # (U,) reading position of each atom
    units = []
    end = 0  # pool row just past the last unit placed
    for pos, k in enumerate(ordered.tolist()):
        p, g, wlo, whi, seam, cut = atoms[k]
        first, cnt = grid_first[p], grid_counts[p]
        prev = k > 0 and atoms[k - 1][0] == p and atoms[k - 1][1] == g - 1 and atoms[k - 1][3] == wlo
        after = k + 1 < len(atoms) and atoms[k + 1][0] == p and atoms[k + 1][1] == g + 1 and whi == cut
        prev_earlier = prev and when[k - 1] < pos
        next_earlier = after and when[k + 1] < pos
        lo_w = atoms[k - 1][4] if prev_earlier else wlo  # the later of two units takes the windows across their cut
        hi_w = seam if after and not next_earlier else whi
        r0, r1 = old_rows(first, cnt, stride, span, lo_w, hi_w)
        own0, own1 = int(bounds[p][g]), int(bounds[p][g + 1])
        keep = []
        if after and not next_earlier and seam < whi:  # the next unit, read later, takes this tail
            keep.append((old_rows(first, cnt, stride, span, seam, whi)[0], own1))
        if prev and not prev_earlier and atoms[k - 1][4] < wlo:  # the previous unit, read later, this head
            keep.append((own0, old_rows(first, cnt, stride, span, atoms[k - 1][4], wlo)[1]))
        fa = max(r0, own0) if r1 > r0 else None
        fb = (min(r1, own1) if next_earlier else r1) if r1 > r0 else None
        ends = [(a, b) for a, b in [(fa, fb), *keep] if a is not None and b is not None and b > a]
        fresh = (min(a for a, _ in ends), max(b for _, b in ends)) if ends else (0, 0)
        size = r1 - r0
        if end + size > rows:
            end = 0  # wrap: the rest of the pool's rows stay unused this time round
        units.append(PoolUnit(p, g, lo_w, hi_w, (r0, r1), fresh, tuple(keep), end))
        end += size
    spread = min(spread, max(len(units), 1))
    fill = spread if first_rows is None else max(1, int(first_rows) // max(most, 1))
    fill = spread if 2 * fill > spread else fill  # a fill of half the pool or more: the whole pool mixes better
    plan = PoolPlan(tuple(units), spread, rows, 0, 0, 0, 0, entropy, shuffle, group, fill)
    start, skip = _resume_step(plan, skip_batches * batch_size)
    return PoolPlan(
        plan.units,
        plan.spread,
        rows if len(units) else 0,
        start,
        skip,
        max(hi - lo - skip_batches * batch_size, 0),
        reader_batches - skip_batches,
        entropy,
        shuffle,
        group,
        fill,
    )


KEYS = ("seed", "epoch", "shuffle", "batch_size", "drop_last", "pool_rows", "first_rows")


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(0, 3), st.data())
def test_vectorised_plan_pool_equals_the_per_unit_loops(cfg: dict, skip: int, data: st.DataObject) -> None:
    for rank in range(cfg["world_size"]):
        for worker in range(cfg["num_workers"]):
            world = World(rank, cfg["world_size"], worker, cfg["num_workers"])
            args = (cfg["first"], cfg["counts"], cfg["stride"], cfg["span"], cfg["bounds"], world)
            kw = {k: cfg[k] for k in KEYS}
            expected = old_plan_pool(*args, skip_batches=skip, **kw)
            got = plan_pool(*args, skip_batches=skip, **kw)  # lists of arrays
            assert got == expected
            columnar = (Ragged.of(cfg["first"]), Ragged.of(cfg["counts"]), *args[2:4], Ragged.of(cfg["bounds"]), world)
            assert plan_pool(*columnar, skip_batches=skip, **kw) == expected  # what the dataset passes


@settings(max_examples=100, deadline=None)
@given(layouts(), st.integers(-3, 70))
def test_windows_before_items_equals_windows_before_per_item(cfg: dict, shift: int) -> None:
    first, counts = Ragged.of(cfg["first"]), Ragged.of(cfg["counts"])
    rows = Ragged.of([np.asarray(b) + shift for b in cfg["bounds"]])
    expected = [windows_before(f, c, cfg["stride"], r) for f, c, r in zip(first, counts, rows)]
    assert np.array_equal(windows_before_items(first, counts, cfg["stride"], rows), np.concatenate(expected))


def test_windows_before_items_in_chunks(monkeypatch) -> None:
    """Items split between chunks of (row, run) pairs give the same counts as one chunk."""
    import dask_windows.planning.pool as pool

    rng = np.random.default_rng(0)
    first = Ragged.of([np.sort(rng.choice(200, rng.integers(0, 6), replace=False)) for _ in range(50)])
    counts = first.with_values(rng.integers(0, 5, len(first.values)))
    rows = Ragged.of([rng.integers(-5, 220, rng.integers(0, 7)) for _ in range(50)])
    whole = windows_before_items(first, counts, 3, rows)
    monkeypatch.setattr(pool, "PAIRS_PER_CHUNK", 4)
    assert np.array_equal(windows_before_items(first, counts, 3, rows), whole)
    expected = [windows_before(f, c, 3, r) for f, c, r in zip(first, counts, rows)]
    assert np.array_equal(whole, np.concatenate(expected))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=8), min_size=1, max_size=8), st.integers(1, 30))
def test_merge_bounds_items_equals_merge_bounds_per_item(units: list, min_rows: int) -> None:
    from dask_windows.planning.pool import merge_bounds, merge_bounds_items

    bounds = [np.cumsum([0, *rows]) for rows in units]  # per item, (G+1,) bounds of units of those rows
    got = merge_bounds_items(Ragged.of(bounds), min_rows)
    assert len(got) == len(bounds)
    for item, expected in zip(got, (merge_bounds(b, min_rows) for b in bounds)):
        assert np.array_equal(item, expected)
