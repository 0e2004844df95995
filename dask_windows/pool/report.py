"""What the pool order costs and buys, predicted from a dataset's plan without reading data.

``pool_rows_of`` lists a pool plan's windows as dataset start rows (for the
mixing statistics of ``dask_windows.mixing``); ``pool_summary`` predicts reads
per epoch, resident memory and places per batch for ``inspect --mixing`` and
the warning at open (``warn_if_few_units``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from dask_windows.pool.plan import AHEAD, PoolPlan, pool_span, reader_steps
from dask_windows.windows import window_starts

__all__ = ["PoolWarning", "pool_rows_of", "pool_summary", "warn_if_few_units"]

log = logging.getLogger(__name__)


class PoolWarning(UserWarning):
    """The memory budget holds too few units for batches to mix like a global shuffle."""


def pool_rows_of(ds: Any, plan: PoolPlan) -> Iterator[np.ndarray]:
    """Dataset start rows of the windows ``plan`` yields, step by step (pure: reads nothing)."""
    grid = ds.grid

    def keys(i: int) -> np.ndarray:
        u = plan.units[i]
        rows = window_starts(grid.first[u.partition], grid.counts[u.partition], grid.stride, u.lo, u.hi)
        return rows + int(ds.row_offsets[u.partition])

    return reader_steps(plan, keys)


def pool_summary(ds: Any, num_workers: int = 1) -> dict:
    """Predicted reads per epoch, resident memory and mixing of ``ds``'s pool order (one reader per rank).

    Returns:
        ``units`` (decode units of the dataset, after merging short ones), ``unit_rows`` (the largest
        unit's rows), ``resident_units`` (``S``), ``pool_bytes``, ``budget_bytes``, ``reads_per_unit``
        (1: each unit decoded once per epoch), ``places_per_batch`` (at most ``min(B, S)``).
    """
    from dask_windows.pool.stream import pool_rows, row_bytes, unit_bounds

    bounds = unit_bounds(ds)
    sizes = np.concatenate([np.diff(b) for b in bounds]) if bounds else np.zeros(0, np.int64)
    units = len(sizes)
    most = int(sizes.max()) + ds.spec.span if units else 0
    from dask_windows.pool.stream import UNITS_PER_BATCH

    spread, rows = pool_span(most, pool_rows(ds, num_workers), min(units, UNITS_PER_BATCH * ds.spec.batch_size))
    b = ds.spec.batch_size
    return {
        "units": units,
        "unit_rows": most,
        "resident_units": spread,
        "pool_bytes": int(min(rows, int(sizes.sum()) + (AHEAD + 1) * most) * row_bytes(ds)),
        "budget_bytes": int(ds.spec.buffer_bytes),
        "reads_per_unit": 1.0,
        "places_per_batch": min(b, spread),
        "mixes_like_global": spread >= 2 * b or spread >= units,
        "first_batch_units": spread,
    }


def warn_if_few_units(ds: Any) -> None:
    """Warn once at open when the budget holds fewer than ``2 * batch_size`` units of a larger dataset."""
    if ds.spec.buffer_bytes is None or not ds.spec.shuffle:
        return
    s = pool_summary(ds)
    if s["mixes_like_global"]:
        return
    from dask_windows.pool.stream import row_bytes

    b = ds.spec.batch_size
    need = int((2 * b + AHEAD + 1) * s["unit_rows"] * row_bytes(ds))  # bytes of 2B units and those read ahead
    warnings.warn(
        f"buffer_bytes={ds.spec.buffer_bytes:,} holds {s['resident_units']} of the {s['units']} units of "
        f"{ds.source.description} (the largest: {s['unit_rows']:,} rows, a Parquet row group each): a batch of "
        f"{b} draws on at most {s['resident_units']} places at once, so it mixes less than a global shuffle "
        f"(predicted effective batch about {s['places_per_batch']} of {b}). Raise buffer_bytes to about "
        f"{need:,} bytes, or rewrite the data with `dask-windows convert` (its spread layout mixes at one read per epoch); "
        "see docs/mixing.md",
        PoolWarning,
        stacklevel=3,
    )
