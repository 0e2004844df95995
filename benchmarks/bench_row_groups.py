"""One epoch over files of many small row groups: footer stability kept per file vs parsed per row group.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_row_groups.py            # 3 files x 4,000 rows, 50-row groups
    PYTHONPATH=. python benchmarks/bench_row_groups.py --rows-per-group 5

Which row groups convert alike in part and whole reads (``ParquetRows._stable_groups``, the guard of
kept heads and paired reads) is read from the footer's statistics. The baseline, measured in the
same run, parses the footer again for every row group asked about, as before the table was kept
per file: with G row groups a file costs O(G) parses of an O(G) footer. Nothing is asserted: the
machine is shared, compare runs on one machine only, and report the load average printed.
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
from dask_windows.sources.parquet_rows import ParquetRows  # noqa: E402


def epoch_seconds(root: str, window: int) -> float:
    ds = dw.WindowDataset(root, ["f0", "f1"], ["y"], series="sid", window=window, batch_size=256, buffer_partitions=1)
    start = time.perf_counter()
    for _ in ds:
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows per file")
    parser.add_argument("--rows-per-group", type=int, default=50)
    parser.add_argument("--window", type=int, default=32)
    args = parser.parse_args()
    frames = make_frames(seed=0, num_files=3, num_series=12, min_len=args.rows // 5, max_len=args.rows // 3)
    with tempfile.TemporaryDirectory() as root:
        write_parquet(frames, root, row_group_size=args.rows_per_group)
        kept = ParquetRows._stable_groups

        def parsed_each_time(self, path, columns):  # the baseline: no table kept between calls
            self.__dict__.pop("_stable", None)
            return kept(self, path, columns)

        ParquetRows._stable_groups = parsed_each_time  # type: ignore[method-assign]
        baseline = epoch_seconds(root, args.window)
        ParquetRows._stable_groups = kept  # type: ignore[method-assign]
        now = epoch_seconds(root, args.window)
    groups = sum(-(-len(f) // args.rows_per_group) for f in frames)
    print(f"{sum(len(f) for f in frames):,} rows in {groups:,} row groups, window {args.window}")
    print(f"footer parsed per row group: {baseline:.2f} s; kept per file: {now:.2f} s ({baseline / now:.1f}x faster)")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
