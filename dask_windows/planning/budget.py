"""What the pool order's memory budget buys, as arithmetic of the settings and a few plain numbers.

A pool row costs its features, targets, about one window start and ``normalize="sample"``'s table
(``row_bytes``); ``buffer_bytes`` (shared by a rank's DataLoader workers) holds ``pool_rows`` of them.
Units (a source's decode units, Parquet row groups, merged, never split) are cut so that about
``UNITS_PER_BATCH * batch_size`` fill the pool; ``plan_for`` hands ``plan_pool`` its arguments. Fewer,
larger units cost fewer reads but mix less, so opening predicts the mixing (``pool_summary``) and warns
once (``PoolWarning``). Whole partitions (``buffer_bytes=None``) are one unit per partition,
``buffer_partitions`` resident. The source's decode units arrive as callables, asked only with a budget.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dask_windows.planning.index import PartitionRuns, WindowGrid
from dask_windows.planning.pool import PoolPlan, PoolShape, block_steps, merge_bounds_items, plan_pool, pool_shape
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.world import World
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import BUFFER_BYTES, MIN_UNIT_ROWS, POOL_FIRST_BYTES, UNITS_PER_BATCH

__all__ = [
    "PoolWarning",
    "advised_budget",
    "block_places",
    "plan_for",
    "pool_rows",
    "pool_summary",
    "row_bytes",
    "shape_for",
    "unit_bounds",
    "warn_if_few_units",
]


class PoolWarning(UserWarning):
    """The memory budget holds too few units for batches to mix like a global shuffle."""


def row_bytes(spec: WindowSpec, y_dtype: object = None, table_bytes: int = 0) -> float:
    """Bytes one pool row costs: its features, targets (``y_dtype``, ``None``: float32), (about) its window
    start and ``table_bytes`` (``normalize="sample"``'s window table)."""
    y = np.dtype(y_dtype or np.float32).itemsize * len(spec.targets)  # type: ignore[call-overload]
    # (code_features' copy not counted: the same plan)
    return 4 * len(spec.features) + y + 8 / spec.stride + table_bytes


def pool_rows(spec: WindowSpec, bytes_per_row: float, num_workers: int = 1) -> int:
    """Rows of decoded data one reader may keep resident: the budget, shared by the rank's workers."""
    budget = spec.buffer_bytes or BUFFER_BYTES
    return int(budget // max(num_workers, 1) // bytes_per_row)


def unit_bounds(
    spec: WindowSpec,
    bytes_per_row: float,
    rows_per_partition: np.ndarray,
    decode_units: Callable[[int], np.ndarray | None],
    decode_units_all: Callable[[], Ragged] | None = None,
) -> Ragged:
    """Per partition, the rows cutting it into units (``merge_bounds``), once per dataset: the source's decode
    units (``decode_units_all()``, else ``decode_units(p)``; ``None``: ranges) merged to about ``pool_rows /
    (UNITS_PER_BATCH * batch_size)`` rows; whole partitions (``buffer_bytes=None``): one each, unasked."""
    rows = np.asarray(rows_per_partition, np.int64)  # (P,)
    if spec.buffer_bytes is None:  # (P, 2) [0, rows] flattened
        return Ragged(np.stack([np.zeros_like(rows), rows], axis=1).ravel(), np.arange(0, 2 * len(rows) + 1, 2))
    span = spec.span
    target = max(span, pool_rows(spec, bytes_per_row) // (UNITS_PER_BATCH * spec.batch_size))  # rows: 4B units fill it
    size = max(4 * span, target, MIN_UNIT_ROWS)
    if decode_units_all is not None:
        return merge_bounds_items(decode_units_all(), target)  # small row groups read together
    decoded = []
    for p, n in enumerate(rows.tolist()):
        units = decode_units(p)
        if units is None:
            units = np.array([*range(0, n, size), n], np.int64)
        decoded.append(np.asarray(units, np.int64))
    return merge_bounds_items(Ragged.of(decoded), target)


def plan_for(
    spec: WindowSpec,
    grid: WindowGrid,
    bounds: Sequence[np.ndarray],
    bytes_per_row: float,
    world: World,
    skip_batches: int,
    epoch: int,
) -> PoolPlan:
    """The pool plan of ``world``'s reader for ``epoch``, after ``skip_batches``; ``bounds``: ``unit_bounds``.

    Whole partitions (``buffer_bytes=None``): each partition a unit, ``buffer_partitions`` of them resident."""
    args = (grid.first, grid.counts, grid.stride, spec.span, bounds, world)
    return plan_pool(*args, **_plan_settings(spec, bytes_per_row, world, epoch), skip_batches=skip_batches)


def shape_for(
    spec: WindowSpec, grid: WindowGrid, bounds: Sequence[np.ndarray], bytes_per_row: float, world: World, epoch: int
) -> PoolShape:
    """The shape of ``plan_for``'s plan (``pool_shape``: the same arithmetic, its units neither ordered nor placed)."""
    args = (grid.first, grid.counts, grid.stride, spec.span, bounds, world)
    return pool_shape(*args, **_plan_settings(spec, bytes_per_row, world, epoch))


def _plan_settings(spec: WindowSpec, bytes_per_row: float, world: World, epoch: int) -> dict[str, Any]:
    """``plan_pool``'s keywords for ``spec`` (but ``skip_batches``)."""
    whole = spec.buffer_bytes is None
    return dict(
        seed=spec.seed,
        epoch=epoch,
        shuffle=spec.shuffle,
        batch_size=spec.batch_size,
        drop_last=spec.drop_last,
        pool_rows=pool_rows(spec, bytes_per_row, world.num_workers),
        max_spread=UNITS_PER_BATCH * spec.batch_size,
        first_rows=None if whole else int(POOL_FIRST_BYTES // bytes_per_row),
        resident=spec.buffer_partitions if whole else None,
    )


def pool_summary(
    spec: WindowSpec,
    bounds: Sequence[np.ndarray],
    bytes_per_row: float,
    num_workers: int = 1,
    grid: WindowGrid | None = None,
) -> dict:
    """Predicted reads, resident memory and mixing of the pool order: the shape (``pool_shape``) of the first
    reader's plan (worker 0 of ``num_workers``) in epoch 0; ``grid``: the windows (``None``: a partition one
    series). ``resident_units``: ``S``; ``pool_bytes``: the pool allocated; ``places_per_batch``: distinct
    units expected among a batch's draws (``block_places``); ``places_global``: the same for a global shuffle.
    """
    sizes = Ragged.of(bounds).diffs() if len(bounds) else np.zeros(0, np.int64)  # (U,) rows of every unit
    units = len(sizes)
    if grid is None:  # each partition one series of its rows
        ends = [int(b[-1]) if len(b) else 0 for b in bounds]
        runs = [PartitionRuns(np.array([0]), np.array([n]), np.array([p])) for p, n in enumerate(ends)]
        grid = WindowGrid.from_runs(runs, spec.span, spec.stride)
    shape = shape_for(spec, grid, bounds, bytes_per_row, World(0, 1, 0, max(num_workers, 1)), 0)
    spread, b = shape.resident_units, spec.batch_size
    return {
        "units": units,
        "unit_rows": shape.unit_rows,
        "resident_units": spread,
        "pool_bytes": math.ceil(shape.pool_rows * bytes_per_row),
        "budget_bytes": int(spec.buffer_bytes or 0),
        "reads_per_unit": 1.0,
        "places_per_batch": round(
            block_places(spread, shape.group, b, shape.group * shape.windows / max(shape.units, 1)), 1
        ),
        "places_global": round(units * -np.expm1(-b / max(units, 1)), 1),
        "mixes_like_global": spread >= 2 * b or spread >= shape.units,
        "first_batch_units": shape.fill,
        "block_steps": shape.group,
        "windows_per_unit": shape.windows / max(shape.units, 1),
    }


def block_places(spread: int, group: int, batch_size: int, block_windows: float | None = None) -> float:
    """Distinct units expected among a batch's ``batch_size`` draws, the pool full and units of equal windows:
    unit ``i`` of a block's ``spread + group - 1`` gives ``c_i`` of its ``spread * group`` slices and is
    missed by ``d`` draws with probability ``(1 - c_i / (S g)) ** d``; a batch starting at a uniform place
    in blocks of ``block_windows`` (``None``: inside one block) may draw from consecutive blocks.
    """
    s, g, b = max(int(spread), 1), max(int(group), 1), max(int(batch_size), 1)
    # (patterns,) draws from the first block a batch reaches, and how many of a block's starts give each
    if block_windows is None:
        first, weight, length = np.array([b]), np.ones(1), b
    else:
        length = max(round(block_windows), -(-b // 64), 1)  # L: windows of a block (a batch reaches <= 65)
        if length >= b:  # L - B + 1 starts keep the batch in one block; the B - 1 others leave 1 .. B - 1 draws
            first, weight = np.arange(1, b + 1), np.r_[np.ones(b - 1), float(length - b + 1)]
        else:
            first, weight = np.arange(1, length + 1), np.ones(length)
    blocks = 1 + -(-(b - 1) // length) if block_windows is not None else 1  # m: blocks one batch may reach
    ends = first[:, None] + length * np.arange(blocks)  # (patterns, m) draws up to each block's end
    draws = np.diff(np.minimum(np.c_[np.zeros(len(first), np.int64), ends], b), axis=1)  # (patterns, m)
    i = np.arange(s + g - 1)  # (S + g - 1,) a block's units, the oldest first
    slices = np.minimum.reduce([i + 1, np.full_like(i, min(s, g)), s + g - 1 - i])  # (S + g - 1,) c_i
    share = np.zeros((blocks, s + g - 1 + (blocks - 1) * g))  # (m, units) each unit's share of each block
    for j in range(blocks):
        share[j, j * g : j * g + s + g - 1] = slices / (s * g)
    # units of equal shares are missed alike: one column each, counted (a (patterns, units) matrix took
    # B x 4B floats at open, 1 MB at B=256 and 0.5 GB at B=4096)
    logs, count = np.unique(np.log1p(-np.minimum(share, 1 - 1e-15)), axis=1, return_counts=True)  # (m, k), (k,)
    missed = draws @ logs  # (patterns, k) log P(a unit of each kind missed)
    return float(weight @ ((1 - np.exp(missed)) @ count) / weight.sum())


def warn_if_few_units(
    spec: WindowSpec,
    bounds: Sequence[np.ndarray],
    bytes_per_row: float,
    description: str,
    grid: WindowGrid | None = None,
    units_at: Callable[[WindowSpec], Sequence[np.ndarray]] | None = None,
) -> None:
    """Warn once at open when a unit does not fit the budget (``pool_span`` then exceeds it), and when
    the budget holds fewer than ``2 * batch_size`` units of a larger dataset; ``description``: the data's
    name in the messages (``Source.description``); ``grid``: the dataset's windows (``pool_summary``);
    ``units_at``: the units of the data under other settings (``unit_bounds``; ``None``: ``bounds``), for
    a budget that the advice has checked."""
    if spec.buffer_bytes is None:
        return
    s = pool_summary(spec, bounds, bytes_per_row, grid=grid)
    if s["pool_bytes"] > s["budget_bytes"]:  # at least one unit, its block and the one read ahead are held
        unit_bytes = math.ceil(s["unit_rows"] * bytes_per_row)
        warnings.warn(
            f"buffer_bytes={s['budget_bytes']:,} is smaller than the largest unit of {description} needs: "
            f"{s['unit_rows']:,} rows ({unit_bytes:,} bytes decoded, a Parquet row group read whole), so the pool "
            f"holds about {s['pool_bytes']:,} bytes, {s['pool_bytes'] / max(s['budget_bytes'], 1):,.1f}x the budget. "
            "Write smaller row groups (pyarrow's row_group_size=, or `dask-windows convert`), or raise buffer_bytes "
            f"to {s['pool_bytes']:,}; see docs/memory.md",
            PoolWarning,
            stacklevel=3,
        )
    if not spec.shuffle or s["mixes_like_global"]:
        return
    b = spec.batch_size
    need = _advised_budget(spec, s, bytes_per_row, grid, units_at or (lambda _: bounds))
    raise_to = f"Raise buffer_bytes to about {need:,} bytes" if need else "No buffer_bytes makes it mix so: drop it"
    over = ""
    if s["pool_bytes"] > spec.buffer_bytes:  # a unit is never split: the smallest pool holds a few whole ones
        over = f" The pool takes {s['pool_bytes']:,} bytes, over the budget: a row group is decoded whole."
    warnings.warn(
        f"buffer_bytes={spec.buffer_bytes:,} holds {s['resident_units']} of the {s['units']} units of "
        f"{description} at once (the largest: {s['unit_rows']:,} rows, a Parquet row group each): a batch of "
        f"{b}, cut from a block of {s['block_steps']} steps, draws on about {s['places_per_batch']:.0f} distinct units (a global shuffle: about "
        f"{s['places_global']:.0f}), so it mixes less than a global shuffle. {raise_to}, or rewrite the data with `dask-windows convert` (its spread layout mixes at one read per epoch); "
        f"see docs/mixing.md.{over}",
        PoolWarning,
        stacklevel=3,
    )


def advised_budget(
    spec: WindowSpec,
    bounds: Sequence[np.ndarray],
    bytes_per_row: float,
    grid: WindowGrid | None = None,
    units_at: Callable[[WindowSpec], Sequence[np.ndarray]] | None = None,
) -> int | None:
    """The ``buffer_bytes`` the ``PoolWarning`` advises, checked to mix like a global shuffle within itself
    (``None``: the order mixes so already, is not shuffled, or no budget does); arguments as for
    ``warn_if_few_units``."""
    s = pool_summary(spec, bounds, bytes_per_row, grid=grid)
    if not spec.shuffle or s["mixes_like_global"]:
        return None
    return _advised_budget(spec, s, bytes_per_row, grid, units_at or (lambda _: bounds))


def _advised_budget(
    spec: WindowSpec,
    s: dict,
    bytes_per_row: float,
    grid: WindowGrid | None,
    units_at: Callable[[WindowSpec], Sequence[np.ndarray]],
) -> int | None:
    """The budget to advise: one whose summary, with the units the data is cut into under it (a larger
    budget merges larger units), mixes like a global shuffle within the budget (``None``: none found);
    ``s``: ``spec``'s own summary (``pool_summary``), the caller's."""
    b = spec.batch_size
    asked = int(spec.buffer_bytes or 0)
    for _ in range(64):
        enough = min(2 * b, s["units"])  # units that mix like a global shuffle (every unit, when fewer than 2B)
        held = _units_held(enough, s["unit_rows"], s["windows_per_unit"], b)
        # rounded up (pool_rows floors), and larger than the last budget tried
        asked = max(math.ceil(held * s["unit_rows"] * bytes_per_row) + 1, s["pool_bytes"] + 1, asked + asked // 4)
        tried = dataclasses.replace(spec, buffer_bytes=asked)
        s = pool_summary(tried, units_at(tried), bytes_per_row, grid=grid)
        if s["mixes_like_global"] and s["pool_bytes"] <= asked:
            return asked
    return None


def _units_held(resident: int, unit_rows: int, windows_per_unit: float, batch_size: int) -> int:
    """The fewest units of ``unit_rows`` rows a pool must hold for ``pool_span`` to keep ``resident`` of
    them: beside them, two blocks of ``block_steps`` (which grow with the pool), the unit read, one lost."""
    held = resident + 3
    while held - 2 * block_steps(windows_per_unit, batch_size, held * unit_rows, unit_rows) - 1 < resident:
        held += 1
    return held
