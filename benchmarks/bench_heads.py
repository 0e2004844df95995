"""Whole partitions (``pieces_per_partition=1``) with and without the row-group heads they still use.

* **heads** (``sources/parquet/heads.py``): a partition of a file cut at row groups
  (``partition_bytes``) reads ``window + horizon - 1`` rows past its end, from the next row
  group; with heads only that row group's first rows are read (its first data pages, kept for
  later reads), without them the whole next row group is decoded for its first rows.

(Round 3 measured ``speedups/spares.py``, dropped buffers' memory reused, the same way, with
``--only spares`` at commit f761e8d: 1.09x and 0.98x wall, 0.99x and 0.96x per CPU second; below the
10% bar, it was removed.)

Whole epochs are streamed with the mechanism on and off in alternating rounds (the best
round of each reported), and the ratio on/off of windows per second and of windows per CPU second
is printed. The data: one random-walk series in ``--files`` Parquet files of 8 row groups of
``--rows / 8`` rows, 4 float32 channels, cut into one partition per row group.

    PYTHONPATH=. python benchmarks/bench_heads.py --files 8 --rows 1000000 --seconds 3 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dask_windows as dw
from dask_windows.sources.parquet.rows import ParquetRows

C = 4
CASES = ((32, 8, 128), (96, 16, 128))  # (window, stride, batch)


def write(root: str, files: int, rows: int) -> None:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for f in range(files):
        path = os.path.join(root, f"part-{f:04d}.parquet")
        if os.path.exists(path):
            continue
        x = np.cumsum(rng.standard_normal((rows, C)).astype(np.float32), axis=0)
        pq.write_table(pa.table({f"f{c}": x[:, c] for c in range(C)}), path, row_group_size=rows // 8)


@contextlib.contextmanager
def switched(name: str, on: bool):
    """The mechanism ``name`` on (as shipped) or off (patched out for the block)."""
    if on:
        yield
        return
    saved = ParquetRows._head_groups
    ParquetRows._head_groups = lambda self, *args: {}  # every needed row group decoded whole
    try:
        yield
    finally:
        ParquetRows._head_groups = saved


def epochs(root: str, case: tuple, seconds: float, partition_bytes: int) -> tuple[float, float]:
    """``(windows/s, windows per CPU second)`` over whole epochs for about ``seconds`` (epoch 0 untimed)."""
    window, stride, batch = case
    ds = dw.WindowDataset(
        root, features=[f"f{c}" for c in range(C)], series=None, window=window, stride=stride, batch_size=batch,
        pieces_per_partition=1, buffer_partitions=2, partition_bytes=partition_bytes, next_pass_seconds=0,
    )  # fmt: skip
    for _ in ds:  # epoch 0: the opening's page cache, untimed
        pass
    n, epoch = 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        epoch += 1
        ds.set_epoch(epoch)
        for x in ds:
            n += len(x)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / wall, n / max(cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["heads"], nargs="*", default=["heads"])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_bench_heads"))
    args = parser.parse_args()
    root = os.path.join(args.dir, f"{args.files}x{args.rows}")
    write(root, args.files, args.rows)
    row_group_bytes = args.rows // 8 * C * 4
    print(
        f"whole partitions: {args.files} x {args.rows:,}-row files of 8 row groups, one partition per row group "
        f"(partition_bytes={row_group_bytes:,}), C={C}, {args.rounds} alternating rounds of {args.seconds:g} s "
        f"(best); load {os.getloadavg()[0]:.2f}"
    )
    for name in args.only:
        for case in CASES:
            best: dict[bool, tuple[float, float]] = {}
            for _ in range(args.rounds):
                for on in (True, False):
                    with switched(name, on):
                        rate, per_cpu = epochs(root, case, args.seconds, row_group_bytes)
                    was = best.get(on, (0.0, 0.0))
                    best[on] = (max(was[0], rate), max(was[1], per_cpu))
            (on_rate, on_cpu), (off_rate, off_cpu) = best[True], best[False]
            print(
                f"  {name:<6} L={case[0]:<3} stride {case[1]:<2} B={case[2]}: on {on_rate:>10,.0f}/s, off "
                f"{off_rate:>10,.0f}/s: {on_rate / off_rate:.2f}x wall, {on_cpu / off_cpu:.2f}x per CPU second"
            )
    print(f"  load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
