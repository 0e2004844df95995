"""What the pool order's memory budget buys, as arithmetic of the settings and a few plain numbers.

A pool row costs its features, its targets, about one window start and
``normalize="sample"``'s window table (``row_bytes``); the budget
(``buffer_bytes``, shared by a rank's DataLoader workers) holds ``pool_rows``
of them. Units are cut so that about ``UNITS_PER_BATCH * batch_size`` of them
fill the pool (a source's decode units, Parquet row groups, merged up to that
size; never split), and ``plan_for`` hands ``plan_pool`` the plan's arguments.
The trade-off lives here: fewer, larger units cost fewer reads but a batch then
draws on fewer places, so opening predicts the mixing (``pool_summary``) and
warns once (``PoolWarning``) when the budget holds too few units to mix like a
global shuffle, or a unit larger than the budget. Whole partitions
(``buffer_bytes=None``) are the case of one unit per partition,
``buffer_partitions`` of them resident. Everything here is a function of its
inputs: the source's decode units arrive as callables, asked only when a
budget is set.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from dask_windows.planning.index import WindowGrid
from dask_windows.planning.pool import PoolPlan, merge_bounds_items, plan_pool, pool_span
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.world import World
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import BUFFER_BYTES, MIN_UNIT_ROWS, POOL_FIRST_BYTES, UNITS_PER_BATCH
from dask_windows.settings.tuning import POOL_AHEAD_UNITS as AHEAD

__all__ = ["PoolWarning", "plan_for", "pool_rows", "pool_summary", "row_bytes", "unit_bounds", "warn_if_few_units"]


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
    """Per partition, the rows cutting it into units (``merge_bounds``), computed once per dataset.

    The source's decode units (Parquet row groups: ``decode_units_all()`` at once where the source has it,
    else ``decode_units(p)``, ``None`` where it has none) merged to about ``pool_rows / (UNITS_PER_BATCH *
    batch_size)`` rows, else ranges of that many; whole partitions (``buffer_bytes=None``): one each, and
    the source is not asked.
    """
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
    whole = spec.buffer_bytes is None
    return plan_pool(
        grid.first,
        grid.counts,
        grid.stride,
        spec.span,
        bounds,
        world,
        seed=spec.seed,
        epoch=epoch,
        shuffle=spec.shuffle,
        batch_size=spec.batch_size,
        drop_last=spec.drop_last,
        pool_rows=pool_rows(spec, bytes_per_row, world.num_workers),
        skip_batches=skip_batches,
        max_spread=UNITS_PER_BATCH * spec.batch_size,
        first_rows=None if whole else int(POOL_FIRST_BYTES // bytes_per_row),
        resident=spec.buffer_partitions if whole else None,
    )


def pool_summary(spec: WindowSpec, bounds: Sequence[np.ndarray], bytes_per_row: float, num_workers: int = 1) -> dict:
    """Predicted reads per epoch, resident memory and mixing of the pool order (one reader per rank).

    ``places_per_batch``: distinct units expected among a batch's ``B`` draws from ``S``,
    ``S (1 - exp(-B / S))``; ``places_global``: the same from all units (a global shuffle).
    """
    sizes = Ragged.of(bounds).diffs() if len(bounds) else np.zeros(0, np.int64)  # (U,) rows of every unit
    units = len(sizes)
    most = int(sizes.max()) + spec.span if units else 0
    spread, rows = pool_span(
        most, pool_rows(spec, bytes_per_row, num_workers), min(units, UNITS_PER_BATCH * spec.batch_size)
    )
    fill = max(1, int(POOL_FIRST_BYTES // bytes_per_row) // max(most, 1))  # units read before the first step
    b = spec.batch_size
    return {
        "units": units,
        "unit_rows": most,
        "resident_units": spread,
        "pool_bytes": int(min(rows, int(sizes.sum()) + (AHEAD + 1) * most) * bytes_per_row),
        "budget_bytes": int(spec.buffer_bytes or 0),
        "reads_per_unit": 1.0,
        "places_per_batch": round(spread * -np.expm1(-b / max(spread, 1)), 1),  # distinct units among B draws
        "places_global": round(units * -np.expm1(-b / max(units, 1)), 1),
        "mixes_like_global": spread >= 2 * b or spread >= units,
        "first_batch_units": fill if 2 * fill <= spread else spread,
    }


def warn_if_few_units(spec: WindowSpec, bounds: Sequence[np.ndarray], bytes_per_row: float, description: str) -> None:
    """Warn once at open when a unit does not fit the budget (``pool_span`` then exceeds it), and when
    the budget holds fewer than ``2 * batch_size`` units of a larger dataset; ``description``: the data's
    name in the messages (``Source.description``)."""
    if spec.buffer_bytes is None:
        return
    s = pool_summary(spec, bounds, bytes_per_row)
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
    enough = min(2 * b, s["units"])  # units that mix like a global shuffle (every unit, when fewer than 2B)
    # pool_span's rows for that many: the units drawn from, the block read ahead, the unit being read, one lost to wrap
    need = math.ceil((enough + 2 + 1) * s["unit_rows"] * bytes_per_row) + 1  # rounded up: pool_rows floors
    over = ""
    if s["pool_bytes"] > spec.buffer_bytes:  # a unit is never split: the smallest pool holds a few whole ones
        over = f" The pool takes {s['pool_bytes']:,} bytes, over the budget: a row group is decoded whole."
    warnings.warn(
        f"buffer_bytes={spec.buffer_bytes:,} holds {s['resident_units']} of the {s['units']} units of "
        f"{description} (the largest: {s['unit_rows']:,} rows, a Parquet row group each): a batch of "
        f"{b} draws on about {s['places_per_batch']:.0f} distinct units (a global shuffle: about "
        f"{s['places_global']:.0f}), so it mixes less than a global shuffle. Raise buffer_bytes to about "
        f"{need:,} bytes, or rewrite the data with `dask-windows convert` (its spread layout mixes at one read per epoch); "
        f"see docs/mixing.md.{over}",
        PoolWarning,
        stacklevel=3,
    )
