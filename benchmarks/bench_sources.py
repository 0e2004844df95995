"""Windows per second from each source, and time to first batch with many small files.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_sources.py            # full run (a few minutes)
    PYTHONPATH=. python benchmarks/bench_sources.py --quick    # smaller sizes, for a smoke test

Sources measured over the same rows (``--files`` Parquet files of ``--rows`` rows,
4 float32 features, one series id column): local Parquet; S3 on loopback (moto's
server on 127.0.0.1 through s3fs, plus the request counts seen by a counting proxy);
a Dask DataFrame (``dd.from_map(pd.read_parquet, paths)``) on a 2-process
LocalCluster. Then time to first batch for 1,000 and 10,000 small local files,
split into listing + footers and the series scan. Figures are printed, nothing
is asserted: the machine is shared, so compare runs on one machine only.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from dask_windows.dataset import WindowDataset  # noqa: E402

FEATURES = ["a", "b", "c", "d"]


def table(rows: int, series_rows: int, offset: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns = {"sid": (offset + np.arange(rows)) // series_rows}
    for name in FEATURES:
        columns[name] = rng.standard_normal(rows).astype(np.float32)
    return pa.table(columns)


def write_files(root: str, files: int, rows: int, series_rows: int) -> list[str]:
    os.makedirs(root, exist_ok=True)
    paths = []
    for i in range(files):
        path = os.path.join(root, f"part-{i:05d}.parquet")
        pq.write_table(table(rows, series_rows, i * rows, i), path, row_group_size=64_000)
        paths.append(path)
    return paths


def windows_per_second(ds: WindowDataset, epochs: int = 1) -> tuple[float, float, int]:
    """(windows/s, seconds, windows) over ``epochs`` full epochs in the main process."""
    windows = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for x in ds:
            windows += len(x)
    seconds = time.perf_counter() - start
    return windows / seconds, seconds, windows


def report(name: str, rate: float, seconds: float, windows: int, extra: str = "") -> None:
    print(f"  {name:<34} {rate:>12,.0f} windows/s   ({windows:,} windows in {seconds:.2f} s){extra}", flush=True)


def bench_local(paths: list[str], kw: dict) -> None:
    start = time.perf_counter()
    ds = WindowDataset(os.path.dirname(paths[0]), **kw)
    opened = time.perf_counter() - start
    report("local Parquet", *windows_per_second(ds, 2), f"; open {opened:.2f} s")


def bench_s3(paths: list[str], kw: dict) -> None:
    import s3fs
    from s3proxy import S3Endpoint

    endpoint = S3Endpoint()
    try:
        endpoint.make_bucket("bench")
        fs = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
        for path in paths:
            fs.put_file(path, f"bench/data/{os.path.basename(path)}")
        direct = endpoint.storage_options(direct=True)
        start = time.perf_counter()
        ds = WindowDataset("s3://bench/data/", storage_options=direct, **kw)
        opened = time.perf_counter() - start
        report("S3 on loopback (moto, s3fs)", *windows_per_second(ds, 2), f"; open {opened:.2f} s")
        endpoint.reset()
        ds = WindowDataset("s3://bench/data/", storage_options=endpoint.storage_options(), **kw)
        log = endpoint.log
        opening = (log.count("list"), log.count("head"), log.count("get"))
        endpoint.reset()
        batches = sum(1 for _ in ds)
        print(
            f"  S3 requests (through the counting proxy): open = {opening[0]} list + {opening[1]} head + "
            f"{opening[2]} get for {len(paths)} files / {len(ds.partitions)} partitions "
            f"(one footer tail per file; the series scan reads one column chunk per row group); "
            f"one epoch ({batches} batches) = {log.count('get')} get, {log.count('list')} list, "
            f"{log.count('head')} head -> {log.count('get') / len(ds.partitions):.2f} requests per partition",
            flush=True,
        )
    finally:
        endpoint.close()


def bench_dask(paths: list[str], kw: dict) -> None:
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
    )
    client = Client(cluster)
    try:
        ddf = dd.from_map(pd.read_parquet, paths)
        start = time.perf_counter()
        ds = WindowDataset(ddf, **kw)
        opened = time.perf_counter() - start
        report("Dask from_map on LocalCluster(2)", *windows_per_second(ds, 2), f"; open (one counting pass) {opened:.2f} s")
    finally:
        client.close()
        cluster.close()


def bench_many_files(count: int, rows: int) -> None:
    from dask_windows.sources import ParquetSource

    root = tempfile.mkdtemp(prefix=f"dw-many-{count}-")
    try:
        start = time.perf_counter()
        for i in range(count):
            pq.write_table(table(rows, rows, i * rows, i), os.path.join(root, f"part-{i:05d}.parquet"))
        written = time.perf_counter() - start
        start = time.perf_counter()
        ParquetSource(root)
        footers = time.perf_counter() - start
        start = time.perf_counter()
        ds = WindowDataset(root, features=FEATURES, series="sid", window=32, batch_size=256)
        opened = time.perf_counter() - start
        next(iter(ds))
        first = time.perf_counter() - start
        print(
            f"  {count:>6,} files x {rows} rows: time to first batch {first:.2f} s "
            f"(listing + footers {footers:.2f} s, open incl. series scan {opened:.2f} s; writing them took {written:.1f} s)",
            flush=True,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per file")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["local", "s3", "dask", "many"])
    args = parser.parse_args()
    if args.quick:
        args.files, args.rows = 4, 20_000
    logging.getLogger("distributed").setLevel(logging.ERROR)
    kw = dict(features=FEATURES, series="sid", window=64, stride=1, batch_size=512, buffer_partitions=2)
    root = tempfile.mkdtemp(prefix="dw-bench-")
    try:
        paths = write_files(root, args.files, args.rows, series_rows=50_000)
        print(
            f"{args.files} files x {args.rows:,} rows, {len(FEATURES)} float32 features, window {kw['window']}, "
            f"batch {kw['batch_size']} (B, C, L) = ({kw['batch_size']}, {len(FEATURES)}, {kw['window']}); "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        if "local" not in args.skip:
            bench_local(paths, kw)
        if "s3" not in args.skip:
            bench_s3(paths, kw)
        if "dask" not in args.skip:
            bench_dask(paths, kw)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "many" not in args.skip:
        print("Many small local files:", flush=True)
        for count in (1_000, 10_000) if not args.quick else (1_000,):
            bench_many_files(count, rows=200)


if __name__ == "__main__":
    main()
