"""Time to the first batch on every rank of a gloo job: footers read per rank, shared, or from the index.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_startup.py                 # S3 10/100/1,000 objects, local 10^2-10^4 files
    PYTHONPATH=. python benchmarks/bench_startup.py --s3 100,1000,10000 --local 1000,10000,100000   # longer

S3 is moto's server on 127.0.0.1 behind the tests' counting proxy, with
``--delay`` seconds (20 ms) added to every request, as a remote store's
latency. For each size a job of ``--ranks`` gloo processes opens the same
dataset three ways, and each rank reports the seconds from the start of its
open to its first batch (the processes are started and the process group is
formed before the clock starts):

* ``per rank``: no index, every rank reads every footer (``DASK_WINDOWS_SHARE_FOOTERS=0``);
* ``shared``: no index, the first rank reads them and the others take them (``footer_share``;
  object stores only since the run below: local files are read per rank, as cached footers open
  faster than they travel between ranks);
* ``index``: the index written by ``dask-windows index`` (its writing time printed apart).

The proxy counts the requests of each job. The cost per object is the slope
between the two largest sizes, and the 10^6 line extrapolates with it. The
index's bytes per file (on disk, and held in memory by the opened source, as
``tracemalloc`` sees it) are printed for the local files. Nothing is asserted:
the machine is shared, compare figures of one run only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

KW = dict(features=["f0", "f1"], series="sid", window=16, batch_size=32, buffer_partitions=1, pieces_per_partition=1)


def file_bytes(i: int, rows: int = 200) -> bytes:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(i)
    table = pa.table(
        {
            "sid": np.full(rows, i, np.int64),
            "ts": np.arange(rows, dtype=np.int64),
            "f0": rng.standard_normal(rows).astype(np.float32),
            "f1": rng.standard_normal(rows).astype(np.float32),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def child(init: str, rank: int, world: int, url: str, options: str, out: str) -> None:
    """One rank: form the group, then time open + first batch."""
    import torch
    import torch.distributed as dist

    from dask_windows.dataset import WindowDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    warm = os.path.join(os.path.dirname(out), f"warm{rank}")  # imports and first-call costs, off the clock
    os.makedirs(warm, exist_ok=True)
    with open(os.path.join(warm, "a.parquet"), "wb") as dst:
        dst.write(file_bytes(0))
    next(iter(WindowDataset(warm, index=False, prefetch_partitions=0, **KW)))
    if url.startswith("s3://"):
        import s3fs  # noqa: F401
    dist.barrier()
    started = time.perf_counter()
    ds = WindowDataset(url, storage_options=json.loads(options) or None, prefetch_partitions=0, **KW)
    opened = time.perf_counter()
    next(iter(ds))
    first = time.perf_counter()
    with open(out, "w") as dst:
        json.dump({"open": opened - started, "first_batch": first - started}, dst)
    dist.barrier()
    dist.destroy_process_group()


def job(url: str, options: dict, ranks: int, share: bool, work: str) -> list[dict]:
    """Run one gloo job of ``ranks`` processes; each rank's timings."""
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "OMP_NUM_THREADS": "1",
        "DASK_WINDOWS_SHARE_FOOTERS": "1" if share else "0",
    }
    init = f"file://{tempfile.mktemp(dir=work)}"
    outs = [os.path.join(work, f"rank{r}.json") for r in range(ranks)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", init, str(r), str(ranks), url, json.dumps(options), outs[r]], env=env
        )
        for r in range(ranks)
    ]
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"a rank failed ({p.returncode})")
    return [json.load(open(o)) for o in outs]


def measure(kind: str, sizes: list[int], ranks: int, delay: float, work: str) -> dict:
    from dask_windows.sources.parquet.index_writer import write_index

    endpoint = None
    if kind == "s3":
        import s3fs
        from s3proxy import S3Endpoint

        endpoint = S3Endpoint()
        endpoint.make_bucket("bench")
        fs = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
    results = {}
    try:
        for size in sizes:
            blobs = {f"bench/n{size}/part-{i:07d}.parquet": file_bytes(i) for i in range(size)}
            if endpoint is not None:
                fs.pipe(blobs)  # concurrent PUTs, straight to moto
                url, options = f"s3://bench/n{size}/", endpoint.storage_options()
            else:
                url, options = os.path.join(work, f"n{size}"), {}
                os.makedirs(url)
                for key, data in blobs.items():
                    with open(os.path.join(work, key[len("bench/") :]), "wb") as dst:
                        dst.write(data)
            row: dict = {}
            for mode, share in (("per rank", False), ("shared", True)):
                if endpoint is not None:
                    endpoint.reset()
                    endpoint.set_delay(delay)
                times = job(url, options, ranks, share, work)
                row[mode] = {"seconds": max(t["first_batch"] for t in times), "requests": _requests(endpoint)}
            if endpoint is not None:
                endpoint.set_delay(delay)
            started = time.perf_counter()
            report = write_index(url, series="sid", storage_options=options or None)
            row["index written"] = {
                "seconds": time.perf_counter() - started,
                "bytes_per_file": report["bytes_per_file"],
            }
            if endpoint is not None:
                endpoint.reset()
                endpoint.set_delay(delay)
            times = job(url, options, ranks, True, work)
            row["index"] = {"seconds": max(t["first_batch"] for t in times), "requests": _requests(endpoint)}
            if endpoint is None:
                row["memory"] = _memory_per_file(url, size)
            results[size] = row
            print(f"  {kind} {size:>7,} objects: " + _line(row), flush=True)
            if endpoint is not None:
                endpoint.set_delay(0)
    finally:
        if endpoint is not None:
            endpoint.close()
    return results


def _requests(endpoint) -> str:
    """The job's requests at open (tail GETs, index GETs, LISTs) and for its first batches (data GETs)."""
    if endpoint is None:
        return "-"
    from dask_windows.sources.parquet.footer_index import INDEX_NAME

    gets = [r for r in endpoint.log.requests if r.kind == "get"]
    tails = sum(1 for r in gets if r.range is not None and r.range.startswith("bytes=-"))
    index = sum(1 for r in gets if r.path.endswith(INDEX_NAME))
    opening = f"open: {tails} footer + {index} index GET, {endpoint.log.count('list')} LIST"
    return opening + f"; first batches: {len(gets) - tails - index} GET"


def _memory_per_file(url: str, size: int) -> dict:
    """Bytes per file the opened source holds (tracemalloc), with and without the index."""
    import gc
    import tracemalloc

    from dask_windows.sources import ParquetSource

    out = {}
    ParquetSource(url, series="sid", index=False)  # imports and first-call allocations, not counted
    for label, index in (("footers", False), ("index", None)):
        gc.collect()
        tracemalloc.start()
        source = ParquetSource(url, series="sid", index=index)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out[label] = held / size
        footers = source._footers.values()
        out[label + " footer"] = (
            sum(
                sys.getsizeof(f)
                + sys.getsizeof(f.raw)
                + sys.getsizeof(f.rows)
                + sys.getsizeof(getattr(f, "digest", b""))
                for f in footers
            )
            / size
        )
        del source, footers
    return out


def _line(row: dict) -> str:
    parts = [f"{m} {row[m]['seconds']:.2f} s ({row[m]['requests']})" for m in ("per rank", "shared", "index")]
    parts.append(
        f"index written in {row['index written']['seconds']:.2f} s, {row['index written']['bytes_per_file']:.0f} B/file"
    )
    if "memory" in row:
        m = row["memory"]
        parts.append(
            f"source holds {m['footers']:.0f} / {m['index']:.0f} B/file, of which footers "
            f"{m['footers footer']:.0f} / {m['index footer']:.0f} (read footers / index)"
        )
    return "; ".join(parts)


def extrapolate(kind: str, results: dict) -> None:
    sizes = sorted(results)
    if len(sizes) < 2:
        return
    a, b = sizes[-2], sizes[-1]
    print(f"{kind}: per object (slope {a:,} -> {b:,}) and extrapolated to 10^6 objects")
    for mode in ("per rank", "shared", "index"):
        slope = (results[b][mode]["seconds"] - results[a][mode]["seconds"]) / (b - a)
        at = results[b][mode]["seconds"] + slope * (10**6 - b)
        growth = results[b][mode]["seconds"] / max(results[a][mode]["seconds"], 1e-9)
        print(f"  {mode:<9} {slope * 1e6:8.1f} us/object  x{growth:.1f} for x{b // a} objects  10^6: {at:8.1f} s")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        init, rank, world, url, options, out = sys.argv[2:8]
        child(init, int(rank), int(world), url, options, out)
        sys.stdout.flush()
        os._exit(0)  # gloo's threads can abort the interpreter's shutdown
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3", default="10,100,1000", help="object counts on S3 (comma-separated; '' for none)")
    parser.add_argument("--local", default="100,1000,10000", help="file counts on local disk ('' for none)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds added to every S3 request")
    args = parser.parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    print(f"time to first batch, slowest of {args.ranks} gloo ranks (shared machine: compare within this run)")
    with tempfile.TemporaryDirectory() as work:
        for kind, sizes in (("s3", args.s3), ("local", args.local)):
            sizes_list = [int(s) for s in sizes.split(",") if s]
            if sizes_list:
                extrapolate(kind, measure(kind, sizes_list, args.ranks, args.delay, work))


if __name__ == "__main__":
    main()
