"""Files of many small row groups: opening (series scan) and one epoch, against the per-row-group code.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_row_groups.py            # 3 files x 4,000 rows, 50-row groups
    PYTHONPATH=. python benchmarks/bench_row_groups.py --rows-per-group 5

Every read of a local file parses its footer, and which row groups convert alike in part and
whole reads (``ParquetRows._stable_groups``, the guard of kept heads and paired reads) comes from
the footer's statistics. The baselines, measured in the same run: the open's series scan reading
one row group per read (``group_runs`` of one row group), and the epoch parsing the footer again
for every row group asked about (no table kept per file); either way a file of G row groups costs
O(G) parses of an O(G) footer. Nothing is asserted: the machine is shared, compare runs on one
machine only, and report the load average printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from helpers import make_frames, write_parquet  # noqa: E402

import dask_windows as dw  # noqa: E402
from dask_windows.sources.parquet.rows import ParquetRows  # noqa: E402


def seconds(root: str, window: int) -> tuple[float, float]:
    """``(open, epoch)`` seconds."""
    start = time.perf_counter()
    ds = dw.WindowDataset(root, ["f0", "f1"], ["y"], series="sid", window=window, batch_size=256, buffer_partitions=1)
    opened = time.perf_counter()
    for _ in ds:
        pass
    return opened - start, time.perf_counter() - opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows per file")
    parser.add_argument("--rows-per-group", type=int, default=50)
    parser.add_argument("--window", type=int, default=32)
    args = parser.parse_args()
    frames = make_frames(seed=0, num_files=3, num_series=12, min_len=args.rows // 5, max_len=args.rows // 3)
    with tempfile.TemporaryDirectory() as root:
        write_parquet(frames, root, row_group_size=args.rows_per_group)
        kept, runs = ParquetRows._stable_groups, ParquetRows.group_runs

        def parsed_each_time(self, path, columns):  # the baseline: no table kept between calls
            self.__dict__.pop("_stable", None)
            return kept(self, path, columns)

        def one_each(self, index, row_groups, columns):  # the baseline: a read per row group
            return iter([(g,) for g in row_groups])

        seconds(root, args.window)  # warm-up: imports and the page cache, counted by neither
        ParquetRows._stable_groups, ParquetRows.group_runs = parsed_each_time, one_each  # type: ignore[method-assign]
        open_before, epoch_before = seconds(root, args.window)
        ParquetRows._stable_groups, ParquetRows.group_runs = kept, runs  # type: ignore[method-assign]
        open_now, epoch_now = seconds(root, args.window)
    groups = sum(-(-len(f) // args.rows_per_group) for f in frames)
    print(f"{sum(len(f) for f in frames):,} rows in {groups:,} row groups, window {args.window}")
    for what, before, now in (("open", open_before, open_now), ("epoch", epoch_before, epoch_now)):
        print(f"{what}: per row group {before:.2f} s; now {now:.2f} s ({before / max(now, 1e-9):.1f}x faster)")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
