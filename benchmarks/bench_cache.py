"""Epoch 1 vs epoch 2 from S3 with the local cache, against local disk, and the cache's peak disk vs budget.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_cache.py            # 8 files x 200,000 rows (~1 min)
    PYTHONPATH=. python benchmarks/bench_cache.py --quick    # a smoke test

The same Parquet files are read from local disk (the baseline, measured in the
same run), from S3 on loopback (moto's server on 127.0.0.1 behind the tests'
counting proxy, through s3fs) without a cache, and with ``cache_dir=``: epoch 1
fills the cache, epoch 2 reads it. A second cached run has a budget of half the
cache's full size, and the peak bytes in its folder (sampled after every store)
are printed beside the budget. Loopback S3 is far faster than a real store, so
the cache's gain against a real bucket is larger than printed here. Nothing is
asserted: the machine is shared, compare runs on one machine only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

from bench_sources import FEATURES, write_files  # noqa: E402

from dask_windows.dataset import WindowDataset  # noqa: E402
from dask_windows.sources.cache import RangeCache  # noqa: E402


def epoch_seconds(ds: WindowDataset, epoch: int) -> tuple[float, int]:
    ds.set_epoch(epoch)
    start, windows = time.perf_counter(), 0
    for x in ds:
        windows += len(x)
    return time.perf_counter() - start, windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="4 files x 40,000 rows")
    args = parser.parse_args()
    if args.quick:
        args.files, args.rows = 4, 40_000
    logging.getLogger("moto").setLevel(logging.ERROR)
    import s3fs
    from s3proxy import S3Endpoint

    kw = dict(features=FEATURES, series="sid", window=64, stride=16, batch_size=512, prefetch_partitions=1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_files(os.path.join(tmp, "local"), args.files, args.rows, series_rows=10_000)
        endpoint = S3Endpoint()
        try:
            endpoint.make_bucket("bench")
            fs = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
            for p in paths:
                fs.put(p, f"bench/data/{os.path.basename(p)}")
            local = WindowDataset(os.path.dirname(paths[0]), **kw)
            t_local, windows = epoch_seconds(local, 0)
            print(f"{args.files} files x {args.rows:,} rows, {windows:,} windows per epoch; load {_load()}")
            print(f"  local disk                         {t_local:7.2f} s   1.00x (baseline)")
            options = endpoint.storage_options()
            plain = WindowDataset("s3://bench/data/", storage_options=options, **kw)
            t_plain, _ = epoch_seconds(plain, 1)
            print(f"  S3, no cache (epoch 2)             {t_plain:7.2f} s   {t_plain / t_local:5.2f}x local")
            cache_dir = os.path.join(tmp, "cache")
            cached = WindowDataset("s3://bench/data/", storage_options=options, cache_dir=cache_dir, **kw)
            for epoch in (0, 1):
                endpoint.reset()
                seconds, _ = epoch_seconds(cached, epoch)
                gets = endpoint.log.count("get")
                print(
                    f"  S3 + cache_dir, epoch {epoch + 1}             {seconds:7.2f} s   "
                    f"{seconds / t_local:5.2f}x local   {gets} GETs"
                )
            full = RangeCache(cache_dir).disk_bytes()
            budget = full // 2
            peak = [0]
            store = RangeCache._store

            def watched(self, entries):  # sample the folder after every store
                store(self, entries)
                peak[0] = max(peak[0], self.disk_bytes())

            RangeCache._store = watched
            half = WindowDataset(
                "s3://bench/data/", storage_options=options, cache_dir=os.path.join(tmp, "half"),
                cache_bytes=budget, **kw,
            )  # fmt: skip
            for epoch in (0, 1):
                endpoint.reset()
                seconds, _ = epoch_seconds(half, epoch)
                print(
                    f"  S3 + cache_bytes={budget:,}, epoch {epoch + 1}  {seconds:7.2f} s   "
                    f"{seconds / t_local:5.2f}x local   {endpoint.log.count('get')} GETs"
                )
            RangeCache._store = store
            print(
                f"  cache size without budget {full:,} B; with budget {budget:,} B: peak {peak[0]:,} B "
                f"({peak[0] / budget:.2f} of the budget)"
            )
        finally:
            endpoint.close()


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    main()
