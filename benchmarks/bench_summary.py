"""What the pool summary (``planning.budget.pool_summary``) costs at open, against the open itself.

The summary states the plan's own shape (``pool_shape``: ``plan_pool``'s arithmetic without ordering or
placing units), worked out once at open for the warning and again by ``inspect --mixing``. Printed per
size, in one run: the open of a local Parquet dataset whose row groups are the units, the summary, and
the whole epoch-0 plan (the baseline the shape avoids building).

    python benchmarks/bench_summary.py --units 10 100 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dask_windows as dw
from dask_windows.planning.budget import plan_for, pool_summary
from dask_windows.planning.world import World

ROWS_PER_GROUP = 5_000


def write(root: str, units: int) -> None:
    """``units`` row groups of ``ROWS_PER_GROUP`` rows, over at most 10 files."""
    files = min(units, 10)
    rng = np.random.default_rng(0)
    for f in range(files):
        n = units // files * ROWS_PER_GROUP
        table = pa.table({"x": rng.random(n, np.float32), "y": rng.random(n, np.float32)})
        pq.write_table(table, os.path.join(root, f"part-{f}.parquet"), row_group_size=ROWS_PER_GROUP)


def seconds(call: Callable[[], object], rounds: int) -> float:
    """Median wall seconds of ``call()``."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(root: str, settings: dict, rounds: int) -> str:
    """One line: the open of ``root``, the summary and the whole plan, in one run."""
    opened = seconds(partial(dw.WindowDataset, root, **settings), rounds)
    ds = dw.WindowDataset(root, **settings)
    per_row = ds._read_values().row_bytes
    summarise = partial(pool_summary, ds.spec, ds._unit_bounds, per_row, grid=ds.grid)
    s = summarise()
    summary = seconds(summarise, rounds)
    plan = seconds(partial(plan_for, ds.spec, ds.grid, ds._unit_bounds, per_row, World(0, 1, 0, 1), 0, 0), rounds)
    return (
        f"units={s['units']:>6,}  open {opened * 1e3:8.1f} ms  summary {summary * 1e3:6.2f} ms "
        f"({summary / opened:.1%} of the open)  whole plan {plan * 1e3:6.2f} ms ({summary / plan:.2f}x)  "
        f"resident {s['resident_units']}  places per batch {s['places_per_batch']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    settings = dict(features=["x"], targets=["y"], window=32, horizon=4, batch_size=64, buffer_bytes=4 << 20)
    for units in args.units:
        with tempfile.TemporaryDirectory() as root:
            write(root, units)
            print(measure(root, settings, args.rounds))


if __name__ == "__main__":
    main()
