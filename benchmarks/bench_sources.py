"""Windows per second from each source, and time to first batch with many small files.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_sources.py            # full run (a few minutes)
    PYTHONPATH=. python benchmarks/bench_sources.py --quick    # smaller sizes, for a smoke test
    PYTHONPATH=. python benchmarks/bench_sources.py --only open --open-counts 1000 10000 100000
    PYTHONPATH=. python benchmarks/bench_sources.py --only remote --remote-objects 1000 10000

``--only open``: opening 1k/10k/100k small local files (5,475 bytes, 200 rows, one
series each): ParquetSource and WindowDataset open times against the baseline a
user would write (list the folder, ``pq.read_metadata`` each file), in
``--open-rounds`` alternating rounds (median [min-max]), and the memory kept per
file (a deep size of the source's Python objects, which a parsed footer kept per
file would add ~12 KiB to, and the RSS growth). Beside each wall-clock time, the
process's CPU time (all threads): on a shared, loaded machine the wall clock
also counts the time slices other processes took. The files are kept under ``--dir``
for the next run. ``--only remote``: on moto's S3 server through a counting proxy,
the requests at open per object, and the three ways of reading a remote partition
(the hand-written ranges, ``fsspec.parquet.open_parquet_file``, pyarrow's
``pre_buffer`` with ``CacheOptions``): GETs, bytes and ms per partition, plus the
open time of 1,000 / 10,000 objects by ours and by ``pyarrow.dataset``.

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
        report(
            "Dask from_map on LocalCluster(2)", *windows_per_second(ds, 2), f"; open (one counting pass) {opened:.2f} s"
        )
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


def _deep_size(obj: object, skip: tuple = ()) -> int:
    """Bytes of the Python objects reachable from ``obj`` (each once; modules, types, functions left out)."""
    import gc
    import types

    not_data = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, *skip)
    seen: set[int] = set()
    total, todo = 0, [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, not_data):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        todo.extend(gc.get_referents(item))
    return total


def _rss_mib() -> float:
    with open("/proc/self/statm") as src:
        return int(src.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _small_files(root: str, count: int) -> str:
    """``count`` files of 200 rows (one series each) under ``root``, written once and reused."""
    folder = os.path.join(root, f"small-{count}")
    done = os.path.join(folder, "_DONE")
    if not os.path.exists(done):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(count):
            cols = {"sid": np.full(200, i, np.int64)}
            cols.update({name: rng.standard_normal(200).astype(np.float32) for name in FEATURES})
            pq.write_table(pa.table(cols), os.path.join(folder, f"part-{i:06d}.parquet"))
        open(done, "w").close()
    return folder


def _read_metadata_loop(folder: str) -> int:
    """The loop a user would write: list the folder, ``pq.read_metadata`` each file, count its rows."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))
    return sum(pq.read_metadata(os.path.join(folder, n)).num_rows for n in names)


def _timed(fn) -> tuple[object, float, float]:
    """``(fn(), wall seconds, CPU seconds of all the process's threads)``."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def _spread(values: list[float]) -> str:
    """``median [min-max]`` of a few rounds."""
    median = float(np.median(values))
    return f"{median:6.2f} s" + (f" [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else "")


def bench_open(counts: list[int], root: str, rounds: int = 2) -> None:
    """Open times of ``ParquetSource`` and ``WindowDataset`` against a ``pq.read_metadata`` loop, in
    alternating rounds, and the memory kept per file."""
    from dask_windows.sources import ParquetSource

    print(f"Opening many small local files ({rounds} alternating rounds; load {os.getloadavg()[0]:.2f}):", flush=True)
    for count in counts:
        folder = _small_files(root, count)
        seen: dict[str, list[float]] = {k: [] for k in ("base", "source", "source_cpu", "open", "open_cpu", "first")}
        kept = rss = 0.0
        for round_ in range(rounds):
            _, base, _ = _timed(lambda folder=folder: _read_metadata_loop(folder))
            before = _rss_mib()
            source, source_s, source_cpu = _timed(lambda folder=folder: ParquetSource(folder, series="sid"))
            for i in range(len(source.partitions)):
                source.read_runs(i, "sid")  # what the dataset does next: the runs the tail read told
            if round_ == 0:
                kept = _deep_size({k: v for k, v in vars(source).items() if k != "fs"}, (type(source.fs),))
                rss = _rss_mib() - before
            del source
            start = time.perf_counter()
            ds, opened, opened_cpu = _timed(
                lambda folder=folder: WindowDataset(folder, features=FEATURES, series="sid", window=32, batch_size=256)
            )
            next(iter(ds))
            first = time.perf_counter() - start
            del ds
            for key, value in zip(seen, (base, source_s, source_cpu, opened, opened_cpu, first)):
                seen[key].append(value)
        ratio = np.median(seen["base"]) / np.median(seen["open"])
        print(
            f"  {count:>7,} files: ParquetSource {_spread(seen['source'])} ({np.median(seen['source_cpu']):5.2f} s CPU), "
            f"WindowDataset open {_spread(seen['open'])} ({np.median(seen['open_cpu']):5.2f} s CPU), "
            f"first batch {_spread(seen['first'])}; pq.read_metadata loop {_spread(seen['base'])} "
            f"-> open is {ratio:.2f}x its speed; kept per file {kept / count:,.0f} B (Python objects), "
            f"RSS growth {rss * 2**20 / count:,.0f} B/file (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )


def _range_bytes(request: object, sizes: dict) -> int:
    value = getattr(request, "range", None)
    if not value:
        return sizes.get(request.path.lstrip("/"), 0)
    first, _, last = value.replace("bytes=", "").partition("-")
    if not first:
        return min(int(last), sizes.get(request.path.lstrip("/"), int(last)))
    return int(last) - int(first) + 1


def bench_remote(paths: list[str], object_counts: list[int], root: str) -> None:
    """Requests, bytes and time of reading remote partitions three ways, and opening many objects."""
    import fsspec.parquet
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import s3fs
    from s3proxy import S3Endpoint

    from dask_windows.sources import ParquetSource

    endpoint = S3Endpoint()
    try:
        endpoint.make_bucket("bench")
        direct = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
        for path in paths:
            direct.put_file(path, f"bench/data/{os.path.basename(path)}")
        sizes = {f"bench/data/{os.path.basename(p)}": os.path.getsize(p) for p in paths}
        options = endpoint.storage_options()
        source = ParquetSource("s3://bench/data/", storage_options=options, series="sid")
        columns = ["a", "b"]
        fs = s3fs.S3FileSystem(**options)
        keys = sorted(sizes)
        footers = {k: source._footers[k].metadata for k in keys}

        def ours(key: str) -> None:
            index = next(i for i, p in enumerate(source.partitions) if p.key[0] == key)
            source.read(index, columns)

        def fsspec_parquet(key: str) -> None:
            with fsspec.parquet.open_parquet_file(key, fs=fs, columns=columns) as src:
                pq.ParquetFile(src).read(columns=columns, use_threads=False)

        handler = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
        scan = pads.ParquetFragmentScanOptions(
            pre_buffer=True, cache_options=pa.CacheOptions(hole_size_limit=64 * 2**10, range_size_limit=64 * 2**20)
        )
        parquet_format = pads.ParquetFileFormat(default_fragment_scan_options=scan)

        def pre_buffer(key: str) -> None:
            fragment = parquet_format.make_fragment(key, handler)
            fragment.to_table(columns=columns, use_threads=False)

        def pre_buffer_footer(key: str) -> None:
            with fs.open(key, "rb", cache_type="none") as src:
                reader = pq.ParquetFile(src, metadata=footers[key], pre_buffer=True)
                reader.read(columns=columns, use_threads=False)

        ways = {
            "hand-written ranges (ours)": ours,
            "fsspec.parquet.open_parquet_file": fsspec_parquet,
            "pyarrow pre_buffer, CacheOptions": pre_buffer,
            "pyarrow pre_buffer, footer given": pre_buffer_footer,
        }
        print(
            f"Remote partitions, {len(keys)} objects of {next(iter(sizes.values())):,} bytes, reading "
            f"{columns} of {source.column_names()} (load {os.getloadavg()[0]:.2f}):"
        )
        results: dict[str, list] = {name: [] for name in ways}
        for _ in range(3):  # alternating rounds
            for name, way in ways.items():
                endpoint.reset()
                start = time.perf_counter()
                for key in keys:
                    way(key)
                seconds = time.perf_counter() - start
                gets = [r for r in endpoint.log.requests if r.kind == "get"]
                other = len(endpoint.log.requests) - len(gets)
                nbytes = sum(_range_bytes(r, sizes) for r in gets)
                results[name].append(
                    (len(gets) / len(keys), other / len(keys), nbytes / len(keys), seconds / len(keys))
                )
        for name, rows in results.items():
            gets, other, nbytes, ms = (np.median([r[k] for r in rows]) for k in range(4))
            spread = [r[3] * 1e3 for r in rows]
            print(
                f"  {name:<36} {gets:4.1f} GET + {other:3.1f} other requests, {nbytes / 2**20:6.2f} MiB, "
                f"{ms * 1e3:7.1f} ms per partition [{min(spread):.1f}-{max(spread):.1f}]",
                flush=True,
            )
        for count in object_counts:
            folder = _small_files(root, count)
            prefix = f"bench/many-{count}"
            if not direct.exists(prefix):
                direct.put(folder + "/", prefix + "/", recursive=True)
            endpoint.reset()
            start = time.perf_counter()
            ParquetSource(f"s3://{prefix}/", storage_options=options, series="sid")
            ours_s = time.perf_counter() - start
            log = endpoint.log
            gets = log.count("get") - log.count("list")
            endpoint.reset()
            start = time.perf_counter()
            dataset = pads.dataset(prefix, filesystem=handler, format="parquet")
            for fragment in dataset.get_fragments():
                fragment.ensure_complete_metadata()
            arrow_s = time.perf_counter() - start
            arrow_requests = len(endpoint.log.requests)
            print(
                f"  open {count:>6,} objects: ours {ours_s:6.2f} s ({gets / count:.2f} GET per object, "
                f"{log.count('list')} list); pyarrow.dataset + every footer {arrow_s:6.2f} s "
                f"({arrow_requests / count:.2f} requests per object)",
                flush=True,
            )
    finally:
        endpoint.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per file")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["local", "s3", "dask", "many"])
    parser.add_argument("--only", choices=["all", "open", "remote"], default="all")
    parser.add_argument("--open-counts", type=int, nargs="*", default=[1_000, 10_000])
    parser.add_argument("--open-rounds", type=int, default=2, help="alternating rounds of --only open")
    parser.add_argument("--remote-objects", type=int, nargs="*", default=[1_000])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_sources"))
    args = parser.parse_args()
    if args.only == "open":
        bench_open(args.open_counts, args.dir, args.open_rounds)
        return
    if args.only == "remote":
        root = tempfile.mkdtemp(prefix="dw-bench-")
        try:
            paths = []
            for i in range(4):  # 200,000 rows, 4 row groups, 5 columns each
                path = os.path.join(root, f"part-{i:05d}.parquet")
                pq.write_table(table(200_000, 50_000, i * 200_000, i), path, row_group_size=50_000)
                paths.append(path)
            bench_remote(paths, args.remote_objects, args.dir)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
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
