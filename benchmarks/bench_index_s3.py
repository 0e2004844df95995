"""Opening an S3 prefix from its dataset index at three object counts 10x apart, with request latency.

    PYTHONPATH=. python benchmarks/bench_index_s3.py [--sizes 100,1000,10000] [--latency 0.02] [--real 1000]

moto's S3 server behind the counting proxy of the tests (``tests/s3proxy``),
``--latency`` seconds added to every request, s3fs configured as a user would.
Every object holds the same small Parquet file (2 series, 64 rows), so objects
differ only in name: what grows is the object count. Up to ``--real`` objects
the index is built by ``write_index`` (timed: its footer and series reads are
concurrent); above, the index of ``--real`` objects has its rows repeated under
the new names (exact: equal bytes have equal sizes, ETags and footers) and is
written as ``table_bytes`` writes any index. Per size, best of ``--repeat``:
the open (``WindowDataset`` construction), the first batch after it, and the
requests of the open by kind; then the open without the index where it is
affordable (``--unindexed`` objects at most). The growth per object is the
slope between the two largest sizes. Printed as it goes; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

KW = dict(features=["f0"], targets=["f0"], series="sid", window=8, stride=4, batch_size=64)


def object_bytes() -> bytes:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"sid": np.repeat(np.arange(2, dtype=np.int64), 32), "f0": np.arange(64, dtype=np.float32)})
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=32)
    return out.getvalue()


def upload(fs, prefix: str, size: int, blob: bytes) -> None:
    batch = 500
    for lo in range(0, size, batch):
        fs.pipe({f"{prefix}/part-{k:07d}.parquet": blob for k in range(lo, min(size, lo + batch))})


def synthetic_index(fs, real_prefix: str, prefix: str, size: int, real: int) -> None:
    """The index of ``real_prefix`` (``real`` objects) with its rows repeated for the ``size`` objects of ``prefix``."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_windows.sources.parquet.footer_index import _META_KEY, INDEX_NAME, table_bytes

    table = pq.read_table(pa.BufferReader(fs.cat_file(f"{real_prefix}/{INDEX_NAME}")))
    header = json.loads(table.schema.metadata[_META_KEY])
    table = table.take(pa.array(np.arange(size) % real))
    paths = pa.array([f"part-{k:07d}.parquet" for k in range(size)], pa.string())
    table = table.set_column(table.column_names.index("path"), "path", paths)
    header["files"] = size
    fs.pipe(f"{prefix}/{INDEX_NAME}", table_bytes(table.replace_schema_metadata(None), header))


def open_and_first_batch(url: str, options: dict, index, s3, first: bool = True) -> tuple[float, float, dict]:
    import torch

    from dask_windows.dataset import WindowDataset

    s3.reset()
    started = time.perf_counter()
    ds = WindowDataset(url, storage_options=options, index=index, **KW)
    opened = time.perf_counter() - started
    kinds = {k: s3.log.count(k) for k in ("list", "head", "get")}
    if not first:
        return opened, float("nan"), kinds
    started = time.perf_counter()
    next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
    return opened, time.perf_counter() - started, kinds


def main() -> None:
    import warnings

    from s3proxy import S3Endpoint

    from dask_windows.sources.parquet.index_writer import write_index

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--real", type=int, default=1000, help="largest size whose index write_index builds")
    parser.add_argument("--unindexed", type=int, default=1000, help="largest size also opened without the index")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--first-batch", action="store_true", help="also time the first batch (default settings)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    sizes = [int(s) for s in args.sizes.split(",")]
    s3 = S3Endpoint()
    s3.make_bucket("scale")
    import s3fs

    direct = s3fs.S3FileSystem(**s3.storage_options(direct=True))
    options = s3.storage_options()
    blob = object_bytes()
    print(f"S3 (moto on loopback, {args.latency * 1e3:.0f} ms added per request); objects of {len(blob):,} bytes")
    built = None
    rows = []
    try:
        for size in sizes:
            prefix = f"scale/n{size}"
            started = time.perf_counter()
            upload(direct, prefix, size, blob)
            uploaded = time.perf_counter() - started
            s3.log.delay = args.latency
            build = ""
            if size <= args.real:
                started = time.perf_counter()
                report = write_index(f"s3://{prefix}/", series="sid", storage_options=options)
                build = (
                    f"index built in {time.perf_counter() - started:.2f} s ({report['bytes_per_file']:.0f} B/object)"
                )
                built = (prefix, size)
            else:
                assert built is not None, "--real must cover the smallest size"
                synthetic_index(direct, built[0], prefix, size, built[1])
                build = f"index: the {built[1]:,}-object index's rows repeated"
            best = min(
                (
                    open_and_first_batch(f"s3://{prefix}/", options, None, s3, args.first_batch)
                    for _ in range(args.repeat)
                ),
                key=lambda r: r[0],
            )
            line = (
                f"{size:>7,} objects: open {best[0]:6.2f} s"
                + (f", first batch {best[1]:5.2f} s after" if args.first_batch else "")
                + f", requests list {best[2]['list']} head {best[2]['head']} get {best[2]['get']}; {build}; "
                f"uploaded in {uploaded:.1f} s"
            )
            if size <= args.unindexed:
                plain = open_and_first_batch(f"s3://{prefix}/", options, False, s3, False)
                line += f"; without the index: open {plain[0]:.2f} s, {plain[2]['get']} GETs, {plain[2]['list']} lists"
            print(line, flush=True)
            rows.append((size, best[0]))
            s3.log.delay = 0.0
    finally:
        s3.close()
    if len(rows) >= 2:
        (n0, t0), (n1, t1) = rows[-2], rows[-1]
        per = (t1 - t0) / (n1 - n0)
        print(
            f"growth with the index: {per * 1e6:.1f} us an object between {n0:,} and {n1:,} "
            f"(extrapolated, not measured: {t1 + per * (10**6 - n1):.0f} s at 10^6 objects)"
        )


if __name__ == "__main__":
    main()
