"""The pool order's budget arithmetic (``dask_windows.planning.budget``) from the settings and plain numbers,
against brute-force references on small layouts."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.planning import budget
from dask_windows.planning.budget import (
    PoolWarning,
    plan_for,
    pool_rows,
    pool_summary,
    row_bytes,
    unit_bounds,
    warn_if_few_units,
)
from dask_windows.planning.index import PartitionRuns, WindowGrid
from dask_windows.planning.pool import PoolPlan, PoolUnits, reader_steps, reader_windows
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.world import World
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import BUFFER_BYTES, MIN_UNIT_ROWS, UNITS_PER_BATCH


def spec_of(**kw: object) -> WindowSpec:
    settings: dict = {"features": ("a", "b"), "window": 4, "batch_size": 4, "buffer_bytes": 4_000, **kw}
    return WindowSpec(**settings)


def asked_nothing(*_: object) -> None:
    raise AssertionError("whole partitions ask the source for no decode units")


def one_series_grid(rows: list[int], spec: WindowSpec) -> WindowGrid:
    """Each partition one series of ``rows[p]`` rows."""
    runs = [PartitionRuns(np.array([0]), np.array([n]), np.array([p])) for p, n in enumerate(rows)]
    return WindowGrid.from_runs(runs, spec.span, spec.stride)


def group_bounds(rows: list[int], group: int) -> list[np.ndarray]:
    """Decode units of ``group`` rows (the last one shorter), per partition."""
    return [np.array([*range(0, n, group), n], np.int64) for n in rows]


def test_row_bytes_count_features_targets_a_window_start_and_the_window_table() -> None:
    spec = spec_of(features=("a", "b", "c"), targets=("y", "z"), stride=4)
    assert row_bytes(spec, np.dtype("float64"), 24) == 3 * 4 + 2 * 8 + 8 / 4 + 24
    assert row_bytes(spec) == 3 * 4 + 2 * 4 + 8 / 4  # targets' dtype unknown: float32
    assert row_bytes(spec_of(stride=1)) == 2 * 4 + 8


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_pool_rows_share_the_budget_between_a_ranks_workers(num_workers) -> None:
    spec = spec_of(buffer_bytes=10_001)
    assert pool_rows(spec, 12.5, num_workers) == int(10_001 / max(num_workers, 1) / 12.5)
    assert pool_rows(spec_of(buffer_bytes=None), 16.0) == BUFFER_BYTES // 16  # whole partitions: the default


def test_whole_partitions_are_one_unit_each_without_asking_the_source() -> None:
    got = unit_bounds(spec_of(buffer_bytes=None), 16.0, np.array([5, 0, 7]), asked_nothing, asked_nothing)
    assert [b.tolist() for b in got] == [[0, 5], [0, 0], [0, 7]]


def test_decode_units_merge_to_the_rows_that_fill_the_pool_with_four_units_a_batch() -> None:
    spec = spec_of(buffer_bytes=64_000, batch_size=2)  # 4,000 pool rows of 16 bytes: units of >= 500 rows
    rows = [1_500, 320, 2_010]
    groups = group_bounds(rows, 100)
    got = unit_bounds(spec, 16.0, np.array(rows), lambda p: groups[p])
    target = 64_000 // 16 // (UNITS_PER_BATCH * 2)
    for bounds, n in zip(got, rows):  # every unit a run of whole groups, >= target rows but a partition's only one
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == n and np.all(np.isin(bounds[:-1], np.arange(0, n, 100)))
        assert np.all(sizes >= target) or len(sizes) == 1
        assert np.all(sizes[:-1] < target + 100)  # merged no further than needed (the last takes a short tail)
    at_once = unit_bounds(spec, 16.0, np.array(rows), asked_nothing, lambda: Ragged.of(groups))  # (Parquet's way)
    assert [b.tolist() for b in at_once] == [b.tolist() for b in got]


def test_a_source_without_decode_units_is_cut_in_ranges_of_the_unit_size() -> None:
    spec = spec_of(buffer_bytes=16_000, batch_size=1)  # target 1,000 // 4 = 250 rows: MIN_UNIT_ROWS wins
    rows = [0, 3 * MIN_UNIT_ROWS + 5, 600]
    got = unit_bounds(spec, 16.0, np.array(rows), lambda p: None)
    assert got[0].tolist() == [0, 0]
    assert got[1].tolist() == [0, MIN_UNIT_ROWS, 2 * MIN_UNIT_ROWS, 3 * MIN_UNIT_ROWS + 5]  # the 5 rows merged
    assert got[2].tolist() == [0, 600]


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("buffer_bytes", [None, 3_000, 40_000])
def test_a_plan_yields_every_window_once_with_the_budget_in_pool_rows(buffer_bytes, num_workers) -> None:
    spec = spec_of(buffer_bytes=buffer_bytes, stride=2, horizon=1, targets=("y",), buffer_partitions=2, seed=5)
    rows = [90, 7, 130, 61]
    grid = one_series_grid(rows, spec)
    per_row = row_bytes(spec)
    bounds = unit_bounds(spec, per_row, np.array(rows), lambda p: group_bounds(rows, 20)[p])
    seen: Counter = Counter()
    for worker in range(num_workers):
        plan = plan_for(spec, grid, bounds, per_row, World(0, 1, worker, num_workers), 0, epoch=1)
        seen.update(reader_windows(plan))
        if buffer_bytes is None:  # whole partitions: buffer_partitions of them resident
            assert len(plan.units) <= 2 or plan.spread == 2
        else:
            assert plan.pool_rows <= max(pool_rows(spec, per_row, num_workers), (2 + 3) * (20 + 20 + spec.span))
    # the oracle: every window of every partition, (window - span) // stride + 1 of them
    expected = {(p, k) for p, n in enumerate(rows) for k in range(max((n - spec.span) // spec.stride + 1, 0))}
    assert set(seen) == expected and set(seen.values()) == {1}


def test_the_first_fill_is_the_first_bytes_in_rows(monkeypatch) -> None:
    spec = spec_of(buffer_bytes=20_000)
    rows = [400] * 6
    grid = one_series_grid(rows, spec)
    bounds = unit_bounds(spec, 16.0, np.array(rows), lambda p: group_bounds(rows, 50)[p])
    whole = plan_for(spec, grid, bounds, 16.0, World(0, 1, 0, 1), 0, 0)
    assert whole.fill == whole.spread > 1  # 16 MiB: the pool filled before the first step
    monkeypatch.setattr(budget, "POOL_FIRST_BYTES", 16 * 60)  # one unit's rows
    assert plan_for(spec, grid, bounds, 16.0, World(0, 1, 0, 1), 0, 0).fill == 1


@pytest.mark.parametrize("buffer_bytes", [3_000, 12_000, 200_000])
def test_the_summary_states_the_plans_resident_units_pool_and_fill(buffer_bytes) -> None:
    spec = spec_of(buffer_bytes=buffer_bytes, batch_size=8)
    rows = [300, 250, 410]
    grid = one_series_grid(rows, spec)
    bounds = unit_bounds(spec, 16.0, np.array(rows), lambda p: group_bounds(rows, 50)[p])
    plan = plan_for(spec, grid, bounds, 16.0, World(0, 1, 0, 1), 0, 0)
    s = pool_summary(spec, bounds, 16.0, grid=grid)
    assert pool_summary(spec, bounds, 16.0) == s  # without a grid: each partition one series, as here
    sizes = np.concatenate([np.diff(b) for b in bounds])
    assert s["units"] == len(sizes) == len(plan.units)
    # the plan's own figures, blocks of steps built ahead included (a formula of one step ahead said 8 for 6)
    assert (s["resident_units"], s["block_steps"], s["first_batch_units"]) == (plan.spread, plan.group, plan.fill)
    assert s["pool_bytes"] == plan.pool_rows * 16 and s["budget_bytes"] == buffer_bytes
    assert sizes.max() <= s["unit_rows"] <= sizes.max() + 2 * spec.span  # a unit's rows and its windows' across cuts
    assert s["places_global"] == round(len(sizes) * -np.expm1(-8 / len(sizes)), 1)
    assert s["mixes_like_global"] == (s["resident_units"] >= 16 or s["resident_units"] == len(sizes))


@pytest.mark.parametrize(
    ("spread", "group", "batch_size", "block_windows"),
    [(1, 1, 4, None), (5, 1, 8, None), (4, 3, 16, None), (1, 1, 8, 10), (3, 2, 8, 5), (6, 4, 16, 40), (2, 7, 32, 3)],
)
def test_block_places_count_the_units_batches_cut_from_the_blocks_draw_on(
    spread, group, batch_size, block_windows
) -> None:
    """Brute force: blocks of ``block_windows`` windows laid end to end, each window of block ``j`` from one
    of its units (the slices of ``group`` steps, step ``t`` one slice of each unit ``t - spread + 1 .. t``),
    and the distinct units of the ``batch_size`` windows starting at each place of the stream."""
    rng = np.random.default_rng(3)
    length = block_windows or 4_000  # one block: a batch well inside it
    stream = []
    for j in range(400 if block_windows else 1):
        slices = [j * group + u for t in range(group) for u in range(t, t + spread)]
        stream.append(rng.choice(slices, size=length))
    ids = np.concatenate(stream)
    starts = range(0, len(ids) - batch_size, 1 if block_windows else batch_size)
    empirical = np.mean([len(set(ids[o : o + batch_size].tolist())) for o in starts])
    assert abs(budget.block_places(spread, group, batch_size, block_windows) - empirical) <= 0.03 * empirical


def unit_ids(plan: PoolPlan) -> Iterator[np.ndarray]:
    """The unit of every window the reader yields, block by block."""
    return reader_steps(plan, lambda i: np.full(plan.units[i].num_windows, i))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.integers(40, 2_000), min_size=1, max_size=5),
    decode_rows=st.integers(8, 300),
    buffer_bytes=st.integers(1_500, 150_000),
    batch_size=st.sampled_from([1, 2, 4, 8, 16]),
    num_workers=st.integers(1, 3),
    stride=st.integers(1, 3),
)
def test_the_summary_equals_the_units_the_real_plan_draws_from_at_each_step(
    rows, decode_rows, buffer_bytes, batch_size, num_workers, stride
) -> None:
    spec = spec_of(buffer_bytes=buffer_bytes, batch_size=batch_size, stride=stride, seed=7)
    grid = one_series_grid(rows, spec)
    bounds = unit_bounds(spec, 16.0, np.array(rows), lambda p: group_bounds(rows, decode_rows)[p])
    s = pool_summary(spec, bounds, 16.0, num_workers, grid=grid)
    plan = plan_for(spec, grid, bounds, 16.0, World(0, 1, 0, num_workers), 0, 0)
    # brute force: the plan drawn one step at a time; the most distinct units one step draws from
    steps = dataclasses.replace(plan, group=1, start=plan.first_step, skip=0)
    most = max((len(np.unique(ids)) for ids in unit_ids(steps)), default=0)
    windows = PoolUnits.of(plan.units).num_windows
    assert most <= s["resident_units"] == plan.spread
    if len(windows) and windows.min() >= plan.spread:  # every unit has a window for each of its S steps
        assert most == s["resident_units"]
    assert s["pool_bytes"] == plan.pool_rows * 16 and s["first_batch_units"] == plan.fill
    # the places a batch draws on: the prediction against batches cut from the real order, away from its ends
    ids = np.concatenate([*unit_ids(plan), np.zeros(0, np.int64)])
    batches = ids[: len(ids) // batch_size * batch_size].reshape(-1, batch_size)  # (batches, B)
    steady = batches[len(batches) // 4 : len(batches) * 3 // 4]
    if len(windows) >= 4 * (plan.spread + plan.group) and len(steady) >= 8 and windows.min() >= plan.spread:
        empirical = np.mean([len(np.unique(batch)) for batch in steady])
        assert abs(s["places_per_batch"] - empirical) <= 0.15 * empirical + 0.5


@pytest.mark.parametrize(
    ("rows", "decode_rows", "buffer_bytes", "batch_size", "num_workers", "stride"),
    [
        ([20_000] * 3, 50, 60_000, 8, 1, 1),
        ([30_000] * 2, 40, 100_000, 16, 2, 2),
        ([8_000] * 4, 100, 200_000, 4, 1, 1),
        ([50_000], 30, 30_000, 8, 1, 3),
        ([10_000] * 5, 64, 400_000, 32, 1, 1),
    ],
)
def test_the_places_per_batch_are_those_of_the_real_plans_batches(
    rows, decode_rows, buffer_bytes, batch_size, num_workers, stride
) -> None:
    """Layouts where the pool holds 11 to 85 units, in blocks of 1 to 5 steps: the prediction against the
    distinct units of the real plan's batches, away from the epoch's ends (the pool full)."""
    spec = spec_of(buffer_bytes=buffer_bytes, batch_size=batch_size, stride=stride, seed=1)
    grid = one_series_grid(rows, spec)
    bounds = unit_bounds(spec, 16.0, np.array(rows), lambda p: group_bounds(rows, decode_rows)[p])
    s = pool_summary(spec, bounds, 16.0, num_workers, grid=grid)
    plan = plan_for(spec, grid, bounds, 16.0, World(0, 1, 0, num_workers), 0, 0)
    ids = np.concatenate(list(unit_ids(plan)))
    batches = ids[: len(ids) // batch_size * batch_size].reshape(-1, batch_size)  # (batches, B)
    steady = batches[len(batches) // 4 : len(batches) * 3 // 4]
    empirical = np.mean([len(np.unique(batch)) for batch in steady])
    assert s["resident_units"] == plan.spread >= 11
    assert abs(s["places_per_batch"] - empirical) <= 0.05 * empirical


def test_few_units_warn_with_a_budget_that_mixes_like_a_global_shuffle() -> None:
    spec = spec_of(buffer_bytes=6_000, batch_size=8)
    rows = [2_000] * 4
    bounds = unit_bounds(spec, 16.0, np.array(rows), lambda p: group_bounds(rows, 50)[p])
    with pytest.warns(PoolWarning, match=r"holds \d+ of the 160 units of the test data") as got:
        warn_if_few_units(spec, bounds, 16.0, "the test data")
    advised = int(re.search(r"Raise buffer_bytes to about ([\d,]+) bytes", str(got[0].message))[1].replace(",", ""))
    bounds = unit_bounds(spec_of(buffer_bytes=advised, batch_size=8), 16.0, np.array(rows), lambda p: bounds[p])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolWarning)
        warn_if_few_units(spec_of(buffer_bytes=advised, batch_size=8), bounds, 16.0, "the test data")
        warn_if_few_units(spec_of(buffer_bytes=6_000, batch_size=8, shuffle=False), bounds, 16.0, "the test data")
        warn_if_few_units(spec_of(buffer_bytes=None, batch_size=8), bounds, 16.0, "the test data")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.integers(200, 5_000), min_size=1, max_size=4),
    decode_rows=st.integers(8, 200),
    buffer_bytes=st.integers(1_500, 40_000),
    batch_size=st.sampled_from([1, 2, 4, 8, 32]),
    stride=st.integers(1, 3),
)
def test_the_advised_budget_mixes_like_a_global_shuffle_on_any_layout(
    rows, decode_rows, buffer_bytes, batch_size, stride
) -> None:
    spec = spec_of(buffer_bytes=buffer_bytes, batch_size=batch_size, stride=stride)
    grid = one_series_grid(rows, spec)
    decode = lambda p: group_bounds(rows, decode_rows)[p]
    bounds = unit_bounds(spec, 16.0, np.array(rows), decode)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", PoolWarning)
        warn_if_few_units(
            spec, bounds, 16.0, "the test data", grid, lambda other: unit_bounds(other, 16.0, rows, decode)
        )
    advice = [re.search(r"Raise buffer_bytes to about ([\d,]+) bytes", str(w.message)) for w in got]
    advised = [int(m[1].replace(",", "")) for m in advice if m]
    assert bool(advised) == (not pool_summary(spec, bounds, 16.0, grid=grid)["mixes_like_global"])
    if not advised:
        return
    spec = spec_of(buffer_bytes=advised[0], batch_size=batch_size, stride=stride)  # opened again with it
    bounds = unit_bounds(spec, 16.0, np.array(rows), decode)
    assert pool_summary(spec, bounds, 16.0, grid=grid)["mixes_like_global"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolWarning)
        warn_if_few_units(spec, bounds, 16.0, "the test data", grid)


def test_a_unit_larger_than_the_budget_warns_with_the_bytes_the_pool_holds() -> None:
    spec = spec_of(buffer_bytes=4_000, batch_size=1, shuffle=False)  # (in order: mixing not warned about)
    bounds = [np.array([0, 1_000, 2_000], np.int64)]  # row groups of 1,000 rows: 16,000 bytes each
    with pytest.warns(PoolWarning, match=r"buffer_bytes=4,000 is smaller than the largest unit of x needs") as got:
        warn_if_few_units(spec, bounds, 16.0, "x")
    held = pool_summary(spec, bounds, 16.0)["pool_bytes"]
    assert f"raise buffer_bytes to {held:,}" in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolWarning)
        warn_if_few_units(spec_of(buffer_bytes=held, batch_size=1, shuffle=False), bounds, 16.0, "x")


def test_the_warning_keeps_its_runtime_import_path() -> None:
    from dask_windows.runtime import pool

    assert pool.PoolWarning is PoolWarning and pool.BUFFER_BYTES == BUFFER_BYTES


def _block_places_by_unit(spread: int, group: int, batch_size: int, block_windows: float | None) -> float:
    """``block_places`` summed unit by unit (the (patterns, units) matrix it once built at open)."""
    s, g, b = spread, group, batch_size
    if block_windows is None:
        first, weight, length = np.array([b]), np.ones(1), b
    else:
        length = max(round(block_windows), -(-b // 64), 1)
        if length >= b:
            first, weight = np.arange(1, b + 1), np.r_[np.ones(b - 1), float(length - b + 1)]
        else:
            first, weight = np.arange(1, length + 1), np.ones(length)
    blocks = 1 + -(-(b - 1) // length) if block_windows is not None else 1
    ends = first[:, None] + length * np.arange(blocks)
    draws = np.diff(np.minimum(np.c_[np.zeros(len(first), np.int64), ends], b), axis=1)
    i = np.arange(s + g - 1)
    slices = np.minimum.reduce([i + 1, np.full_like(i, min(s, g)), s + g - 1 - i])
    share = np.zeros((blocks, s + g - 1 + (blocks - 1) * g))
    for j in range(blocks):
        share[j, j * g : j * g + s + g - 1] = slices / (s * g)
    missed = draws @ np.log1p(-np.minimum(share, 1 - 1e-15))
    return float((weight @ (1 - np.exp(missed)).sum(axis=1)) / weight.sum())


@settings(max_examples=60)
@given(
    st.integers(1, 300),
    st.integers(1, 12),
    st.integers(1, 400),
    st.none() | st.floats(1.0, 5000.0, allow_nan=False),
)
def test_block_places_equal_the_sum_over_every_unit(spread, group, batch_size, block_windows):
    got = budget.block_places(spread, group, batch_size, block_windows)
    assert got == pytest.approx(_block_places_by_unit(spread, group, batch_size, block_windows), rel=1e-12)


def test_block_places_hold_no_batch_by_units_matrix_at_open():
    """At B=4096 the pool may hold 4B = 16,384 units: a (B, units) float matrix was 0.5 GB at open."""
    import tracemalloc

    tracemalloc.start()
    try:
        budget.block_places(16_384, 4, 4_096, 5_000.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
