"""Property tests of the pool order's plan against a brute-force oracle (``dask_windows.planning.pool``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.planning.plan import batches_per_rank, epoch_order, windows_per_rank, worker_batch_range
from dask_windows.planning.pool import PoolPlan, live_units, merge_bounds, plan_pool, reader_windows, slice_ends
from dask_windows.planning.world import World


def windows_before(first: np.ndarray, counts: np.ndarray, stride: int, rows: np.ndarray) -> np.ndarray:
    """The oracle of ``windows_before_items``: windows of a partition starting before each of ``rows``.

    Args:
        first: ``(R,)`` first start row of each run, in row order.
        counts: ``(R,)`` windows of each run.
        stride: Rows between a run's starts.
        rows: ``(n,)`` rows.
    """
    first = np.asarray(first, np.int64)
    counts = np.asarray(counts, np.int64)
    rows = np.asarray(rows, np.int64)
    if len(first) == 0:
        return np.zeros(len(rows), np.int64)
    # (n, R) windows of each run starting before each row: ceil((row - first) / stride), clipped to the run
    inside = np.clip(-(-(rows[:, None] - first[None, :]) // stride), 0, counts[None, :])
    return inside.sum(axis=1).astype(np.int64)


def step_slices(plan: PoolPlan, step: int) -> list[tuple[int, int, int]]:
    """``(unit, a, b)``: positions ``[a, b)`` of unit ``unit``'s permutation drawn at ``step``."""
    s, last, first = plan.spread, plan.last_step, plan.first_step
    out = []
    for i in plan.resident(step):
        n = plan.units[i].num_windows
        j0 = 0 if step == first else step - i  # the first step holds every earlier slice
        j1 = s - 1 if step == last else step - i  # the last step every later one
        a, b = int(slice_ends(plan, i, j0, n)), int(slice_ends(plan, i, j1 + 1, n))
        if b > a:
            out.append((i, a, b))
    return out


@st.composite
def layouts(draw: st.DrawFn) -> dict:
    """Partitions of random rows, cut into runs (series) and decode units, with random settings."""
    window = draw(st.integers(1, 6))
    horizon = draw(st.integers(0, 2))
    span = window + horizon
    stride = draw(st.integers(1, 4))
    parts = draw(st.lists(st.integers(0, 60), min_size=1, max_size=6))
    first, counts, bounds = [], [], []
    for rows in parts:
        cuts = sorted(set(draw(st.lists(st.integers(1, max(rows - 1, 1)), max_size=3)))) if rows > 1 else []
        edges = [0, *[c for c in cuts if 0 < c < rows], rows]
        starts = np.array(edges[:-1], np.int64)
        lengths = np.diff(edges)
        n = np.maximum((lengths - span) // stride + 1, 0)
        first.append(starts[n > 0])
        counts.append(n[n > 0].astype(np.int64))
        units = sorted(set(draw(st.lists(st.integers(1, max(rows - 1, 1)), max_size=6)))) if rows > 1 else []
        raw = np.array([0, *[u for u in units if 0 < u < rows], rows], np.int64)
        bounds.append(merge_bounds(raw, span))
    return {
        "first": first,
        "counts": counts,
        "bounds": bounds,
        "stride": stride,
        "span": span,
        "rows": parts,
        "world_size": draw(st.integers(1, 3)),
        "num_workers": draw(st.integers(1, 3)),
        "batch_size": draw(st.integers(1, 7)),
        "drop_last": draw(st.booleans()),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
        "epoch": draw(st.integers(0, 3)),
        "pool_rows": draw(st.integers(1, 400)),
        "first_rows": draw(st.one_of(st.none(), st.integers(0, 200))),  # None: the whole pool before a step
    }


def plan(cfg: dict, rank: int, worker: int, skip_batches: int = 0):
    keys = ("seed", "epoch", "shuffle", "batch_size", "drop_last", "pool_rows", "first_rows")
    return plan_pool(
        cfg["first"], cfg["counts"], cfg["stride"], cfg["span"], cfg["bounds"],
        World(rank, cfg["world_size"], worker, cfg["num_workers"]), skip_batches=skip_batches,
        **{k: cfg[k] for k in keys},
    )  # fmt: skip


def expected_share(cfg: dict, rank: int, worker: int) -> set:
    """The windows a reader must yield: its positions of the whole-partition epoch sequence (brute force)."""
    counts = np.array([int(c.sum()) for c in cfg["counts"]], np.int64)
    order = epoch_order(len(counts), cfg["seed"], cfg["epoch"], cfg["shuffle"])
    sequence = [(int(p), w) for p in order for w in range(counts[p])]
    total, b = int(counts.sum()), cfg["batch_size"]
    share = windows_per_rank(total, cfg["world_size"])
    num_batches = batches_per_rank(total, cfg["world_size"], b, cfg["drop_last"])
    b0, b1 = worker_batch_range(num_batches, worker, cfg["num_workers"])
    lo = rank * share + b0 * b
    hi = rank * share + min(b1 * b, min(share, num_batches * b))
    return set(sequence[lo:hi])


def readers(cfg: dict):
    for rank in range(cfg["world_size"]):
        for worker in range(cfg["num_workers"]):
            yield rank, worker


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_every_window_once_and_equal_shares(cfg: dict) -> None:
    seen: list = []
    counted: dict = {}
    for rank, worker in readers(cfg):
        p = plan(cfg, rank, worker)
        stream = list(reader_windows(p))
        assert len(stream) == p.num_windows
        assert set(stream) == expected_share(cfg, rank, worker)
        seen.extend(stream)
        b = cfg["batch_size"]
        assert p.num_batches == -(-p.num_windows // b)
        counted[rank] = counted.get(rank, 0) + p.num_batches
    assert len(seen) == len(set(seen))  # no window twice, across ranks and workers
    assert len(set(counted.values())) == 1  # every rank the same number of batches


@settings(max_examples=30, deadline=None)
@given(layouts(), st.integers(0, 30))
def test_resume_is_the_tail_and_plans_are_pure(cfg: dict, skip: int) -> None:
    for rank, worker in readers(cfg):
        full = list(reader_windows(plan(cfg, rank, worker)))
        assert full == list(reader_windows(plan(cfg, rank, worker)))  # a function of its inputs
        p = plan(cfg, rank, worker, skip)
        skipped = min(skip, plan(cfg, rank, worker).num_batches) * cfg["batch_size"]
        assert list(reader_windows(p)) == full[skipped:]
        released = p.first_unit  # units before it are not read again
        assert all(i >= released for i, _, _ in _slices(p))


def _slices(p):
    for step in range(p.start, p.last_step + 1):
        yield from step_slices(p, step)


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_rows_read_once_and_pool_within_budget(cfg: dict) -> None:
    for rank, worker in readers(cfg):
        p = plan(cfg, rank, worker)
        units = p.units
        bounds = cfg["bounds"]  # a unit places at most its rows and a window's rows on each side
        most = max([int(np.diff(bounds[u.partition])[u.unit]) + 2 * cfg["span"] for u in units], default=0)
        if cfg["pool_rows"] >= (2 + 2 * p.group) * most:
            assert p.pool_rows <= cfg["pool_rows"]  # the budget holds
        for i, u in enumerate(units):
            assert u.offset >= 0 and u.offset + u.num_rows <= p.pool_rows
            for k in range(i + 1, min(i + live_units(p), len(units))):  # units in memory together
                v = units[k]
                assert (
                    u.offset + u.num_rows <= v.offset
                    or v.offset + v.num_rows <= u.offset
                    or 0
                    in (
                        u.num_rows,
                        v.num_rows,
                    )
                )
        kept: dict = {}
        decoded: dict = {}
        for u in units:
            first, counts = cfg["first"][u.partition], cfg["counts"][u.partition]
            b = cfg["bounds"][u.partition]
            if u.hi > u.lo:  # every window's rows inside the rows placed
                from dask_windows.planning.windows import window_starts

                starts = window_starts(first, counts, cfg["stride"], u.lo, u.hi)
                assert starts.min() >= u.rows[0] and starts.max() + cfg["span"] <= u.rows[1]
            have = set(range(*u.fresh))
            for a, z in kept.get(u.partition, []):
                have |= set(range(a, z))
            assert set(range(*u.rows)) <= have  # from this read, or rows an earlier unit kept
            for a, z in u.keep:
                assert u.fresh[0] <= a and z <= u.fresh[1]
                kept.setdefault(u.partition, []).append((a, z))
            if u.fresh[1] > u.fresh[0]:  # decode units whose rows this read touches
                g0 = int(np.searchsorted(b, u.fresh[0], side="right")) - 1
                g1 = int(np.searchsorted(b, u.fresh[1], side="left"))
                for g in range(g0, g1):
                    decoded[(u.partition, g)] = decoded.get((u.partition, g), 0) + 1
        mine = {(u.partition, u.unit) for u in units}
        for key, times in decoded.items():  # a unit of this reader is decoded by its own read only
            if key in mine:
                assert times == 1 or _touched_by_neighbour(units, key)


def _touched_by_neighbour(units, key) -> bool:
    """A reader whose share begins or ends inside a partition reads the next unit's first rows itself."""
    p, g = key
    own = [u for u in units if u.partition == p and u.unit == g]
    return any(u.partition == p and u.unit == g - 1 for u in units) and len(own) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=5), st.integers(1, 4), st.integers(1, 100))
def test_windows_before_counts_starts(lengths: list, stride: int, row: int) -> None:
    starts = np.cumsum([0, *lengths[:-1]])
    counts = np.maximum((np.array(lengths) - 3) // stride + 1, 0)
    brute = sum(1 for s, n in zip(starts, counts) for k in range(n) if s + k * stride < row)
    assert windows_before(starts, counts, stride, np.array([row]))[0] == brute


def test_pool_mixes_many_units_per_batch() -> None:
    """With a budget of many units, a batch draws from about as many units as a global shuffle would."""
    rows = [1000] * 64
    span, stride, b = 20, 10, 32
    first = [np.array([0])] * 64
    counts = [np.array([(1000 - span) // stride + 1])] * 64
    bounds = [merge_bounds(np.array([0, 250, 500, 750, 1000]), span) for _ in rows]
    p = plan_pool(
        first, counts, stride, span, bounds, World(0, 1, 0, 1),
        seed=0, epoch=0, shuffle=True, batch_size=b, drop_last=False, pool_rows=200 * 270,
    )  # fmt: skip
    assert p.spread >= 64
    stream = list(reader_windows(p))
    distinct = [len({(q, w // 25) for q, w in stream[i : i + b]}) for i in range(0, len(stream) - b, b)]
    assert np.mean(distinct) > 0.8 * b


def test_the_first_step_reads_the_fill_not_the_whole_pool() -> None:
    """With ``first_rows`` of two units, the first windows come after two units are read (a block's more),
    not after the whole pool; later steps add one unit each, and the epoch is still every window once."""
    from dask_windows.planning.pool import reader_steps

    span, stride, b = 20, 1, 16
    first = [np.array([0])] * 8
    counts = [np.array([1000 - span + 1])] * 8
    bounds = [merge_bounds(np.array([0, 250, 500, 750, 1000]), span) for _ in range(8)]

    def units_read_before_first_step(first_rows):
        p = plan_pool(
            first, counts, stride, span, bounds, World(0, 1, 0, 1), seed=1, epoch=2, shuffle=True,
            batch_size=b, drop_last=False, pool_rows=10**6, first_rows=first_rows,
        )  # fmt: skip
        asked: list = []
        keys = lambda i: asked.append(i) or np.arange(p.units[i].lo, p.units[i].hi) + p.units[i].partition * 10**6
        steps = reader_steps(p, keys)
        head = next(steps)
        read = len(asked)
        windows = np.concatenate([head, *steps])
        assert sorted(windows.tolist()) == sorted(q * 10**6 + w for q in range(8) for w in range(int(counts[q][0])))
        return p, read, len(head)

    whole, read_whole, _ = units_read_before_first_step(None)
    assert whole.spread == len(whole.units) == 32 and read_whole == 32  # the first step is the last
    fill, read_fill, head = units_read_before_first_step(2 * 300)
    assert fill.fill == 2 and read_fill == 2 + fill.group - 1 and head >= b


@settings(max_examples=25, deadline=None)
@given(layouts(), st.sampled_from([np.int32, np.int64]))
def test_in_place_shuffles_draw_what_the_permutations_index(cfg: dict, dtype: type) -> None:
    """``shuffle_unit`` and ``shuffle_step`` (numpy's in-place shuffle, the runtime's) put values in the very
    order of ``unit_permutation`` and ``step_order`` (the index the oracle builds), at every size and dtype."""
    from dask_windows.planning.pool import shuffle_step, shuffle_unit, step_order, unit_permutation

    p = plan(cfg, 0, 0)
    for i in range(len(p.units)):
        values = np.arange(p.units[i].num_windows, dtype=dtype) * 7 + 3
        expected = values[unit_permutation(p, i)]
        shuffle_unit(p, i, values)
        assert values.dtype == dtype and np.array_equal(values, expected)
    for step, size in enumerate([0, 1, 2, 3, 50, 1000]):
        window = np.arange(size, dtype=dtype) * 5 + 1
        perm = step_order(p, step, size)
        expected = window if perm is None else window[perm]
        shuffle_step(p, step, window)
        assert np.array_equal(window, expected)
