"""Peak disk space of ``dask-windows convert`` relative to its input, compressed vs plain scratch.

    PYTHONPATH=. python benchmarks/bench_convert_scratch.py [--rows 400000] [--input-compression snappy zstd]

For a random (incompressible) and a compressible input, each written as one Parquet file
(snappy, then zstd: a smaller input, so a larger ratio), it converts with the default (spread)
layout and the zstd scratch files convert uses and, as the baseline measured in the same run,
with uncompressed Arrow scratch (what 0.1 wrote). The peak is the size of ``DST.tmp-*``
sampled every 20 ms by a thread while convert runs, and right after each Dask pass; the
largest is reached in the last passes, when the scratch files, the sorted buckets and the output
files exist at once (scratch is removed only then). Printed: peak / input bytes, and the ratio
of the two scratch modes. Runs on the synchronous scheduler.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import threading

import dask
import numpy as np
import pandas as pd
import pyarrow as pa


def folder_bytes(path: str) -> int:
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(d, n))
            except FileNotFoundError:  # removed while walking
                pass
    return total


def inputs(rows: int, root: str, compression: str = "snappy", kinds: list[str] | None = None) -> dict[str, str]:
    rng = np.random.default_rng(0)
    series = np.repeat(np.arange(rows // 1000), 1000)[:rows]
    shuffled = rng.permutation(rows)  # input order is not output order, as in real exports
    frames = {
        "random": pd.DataFrame(
            {
                "sid": series,
                "ts": np.arange(rows),
                "a": rng.standard_normal(rows),
                "b": rng.standard_normal(rows),
                "c": rng.integers(0, 2**62, rows),
            }
        ),
        "compressible": pd.DataFrame(
            {
                "sid": series,
                "ts": np.arange(rows),
                "a": np.round(np.sin(np.arange(rows) / 50), 2),
                "b": np.zeros(rows),
                "c": np.arange(rows) % 7,
            }
        ),
        # what a pandas export of real readings looks like: string ids, datetimes, short series
        # (200 rows, so the overlap rows stored at chunk cuts are a larger share), rounded readings
        "compressible-short": pd.DataFrame(
            {
                "sid": pd.Series(series * 5 + np.arange(rows) % 1000 // 200).map("sensor-{:05d}".format),
                "ts": pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(rows) % 200, unit="min"),
                "a": np.round(20 + 5 * np.sin(np.arange(rows) / 30), 1),
                "b": np.round(rng.standard_normal(rows).cumsum() % 10, 1),
                "c": np.arange(rows) % 7,
            }
        ),
    }
    frames = {name: frame for name, frame in frames.items() if kinds is None or name in kinds}
    paths = {}
    for name, frame in frames.items():
        paths[name] = os.path.join(root, f"{name}-{compression}.parquet")
        frame.iloc[shuffled].to_parquet(paths[name], compression=compression, index=False)
    return paths


def peak_ratio(src: str, dst: str, compressed: bool) -> float:
    from dask_windows.cli import convert as module
    from dask_windows.cli import scratch  # the scratch writer reads SCRATCH_OPTIONS from here

    saved = scratch.SCRATCH_OPTIONS
    if not compressed:
        scratch.SCRATCH_OPTIONS = pa.ipc.IpcWriteOptions()
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            for tmp in glob.glob(dst + ".tmp-*"):
                peak = max(peak, folder_bytes(tmp))

    def compute(label, *collections):
        nonlocal peak
        results = dask.compute(*collections)
        for tmp in glob.glob(dst + ".tmp-*"):
            peak = max(peak, folder_bytes(tmp))
        return results

    sampler = threading.Thread(target=sample, name="disk-sampler", daemon=True)
    sampler.start()
    try:
        module.convert(
            [src], dst, series="sid", time="ts", partition_size="4MB", input_block_size=2**20, compute=compute
        )
    finally:
        done.set()
        sampler.join()
        scratch.SCRATCH_OPTIONS = saved
    return peak / os.path.getsize(src)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--input-compression", nargs="+", default=["snappy", "zstd"])
    parser.add_argument("--kinds", nargs="+", help="random, compressible, compressible-short (default: all)")
    args = parser.parse_args()
    with dask.config.set(scheduler="sync"), tempfile.TemporaryDirectory() as root:
        for codec in args.input_compression:
            for name, src in inputs(args.rows, root, codec, args.kinds).items():
                zstd = peak_ratio(src, os.path.join(root, f"{name}-{codec}-zs"), compressed=True)
                plain = peak_ratio(src, os.path.join(root, f"{name}-{codec}-plain"), compressed=False)
                print(
                    f"{name:>18} ({codec:>6} input {os.path.getsize(src) / 1e6:5.1f} MB): peak disk / input: "
                    f"zstd scratch {zstd:.2f}x, uncompressed scratch (baseline) {plain:.2f}x "
                    f"({plain / zstd:.1f}x more)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
