"""Peak disk space of ``dask-windows convert`` relative to its input, compressed vs plain scratch.

    PYTHONPATH=. python benchmarks/bench_convert_scratch.py [--rows 400000]

For a random (incompressible) and a compressible input, each written as one snappy Parquet
file, it converts with the zstd scratch files convert uses and, as the baseline measured in the
same run, with uncompressed Arrow scratch (what 0.1 wrote). The peak is the size of
``DST.tmp-*`` right after each Dask pass; the largest is reached after the last pass, when
every scratch file and every output file exist at once (scratch is removed only then). Printed:
peak / input bytes, and the ratio of the two scratch modes. Runs on the synchronous scheduler.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile

import dask
import numpy as np
import pandas as pd
import pyarrow as pa


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def inputs(rows: int, root: str) -> dict[str, str]:
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
    }
    paths = {}
    for name, frame in frames.items():
        paths[name] = os.path.join(root, f"{name}.parquet")
        frame.iloc[shuffled].to_parquet(paths[name], compression="snappy", index=False)
    return paths


def peak_ratio(src: str, dst: str, compressed: bool) -> float:
    from dask_windows.cli import convert as module
    from dask_windows.cli import scratch  # the scratch writer reads SCRATCH_OPTIONS from here

    saved = scratch.SCRATCH_OPTIONS
    if not compressed:
        scratch.SCRATCH_OPTIONS = pa.ipc.IpcWriteOptions()
    peak = 0

    def compute(label, *collections):
        nonlocal peak
        results = dask.compute(*collections)
        for tmp in glob.glob(dst + ".tmp-*"):
            peak = max(peak, folder_bytes(tmp))
        return results

    try:
        module.convert(
            [src], dst, series="sid", time="ts", partition_size="4MB", input_block_size=2**20, compute=compute
        )
    finally:
        scratch.SCRATCH_OPTIONS = saved
    return peak / os.path.getsize(src)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    args = parser.parse_args()
    with dask.config.set(scheduler="sync"), tempfile.TemporaryDirectory() as root:
        for name, src in inputs(args.rows, root).items():
            zstd = peak_ratio(src, os.path.join(root, f"{name}-zstd"), compressed=True)
            plain = peak_ratio(src, os.path.join(root, f"{name}-plain"), compressed=False)
            print(
                f"{name:>12}: input {os.path.getsize(src) / 1e6:6.1f} MB; peak disk / input: "
                f"zstd scratch {zstd:.2f}x, uncompressed scratch (baseline) {plain:.2f}x "
                f"({plain / zstd:.1f}x more)"
            )


if __name__ == "__main__":
    main()
