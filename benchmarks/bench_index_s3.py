"""Opening an S3 prefix from its dataset index at object counts 10x apart, with request latency.

    PYTHONPATH=. python benchmarks/bench_index_s3.py [--sizes 100,1000,10000] [--latency 0.02] [--real 1000]
    PYTHONPATH=. python benchmarks/bench_index_s3.py --sizes 1000,10000,100000,1000000 --real 1000 \
        --populate backend --ranks 2 --first-batch --unindexed 0 --repeat 1 [--buffer-bytes 16384] \
        [--baseline /tmp/main]      # /tmp/main: `git archive main dask_windows | tar -x -C /tmp/main`

moto's S3 server behind the counting proxy of the tests (``tests/s3proxy``),
``--latency`` seconds added to every request, s3fs configured as a user would.
Every object holds the same small Parquet file (2 series, 64 rows), so objects
differ only in name: what grows is the object count. Up to ``--real`` objects
the index is built by ``write_index`` through the proxy with the latency on
(timed: its listing, footer and series reads are concurrent); above, the index
of ``--real`` objects has its rows repeated under the new names (exact: equal
bytes have equal sizes, ETags and footers) and is written as ``table_bytes``
writes any index.

``--populate put`` uploads every object through s3fs (500 keys a request
batch: minutes at 10^5). ``--populate backend`` (for 10^5 and 10^6) puts them
into moto's in-process backend directly, no request: up to ``--real`` objects
one moto key each (80 us and 5 KB an object), above that **one key object
shared by every name** (6 us and 200 B a name). A shared key answers GET and
HEAD of every name with the same bytes, ETag and size, which is all the open
from an index and the reads ask; a listing of such a prefix would repeat one
name, so those sizes are never listed (their index is the synthetic one).

Per size, best of ``--repeat``: ``--ranks`` processes (ranks of one job,
``rank=r, world_size=R``) each open the prefix (``WindowDataset``
construction, its imports done before the clock starts) and, with
``--first-batch``, take the first batch at the default settings; each prints
its open and first-batch seconds and its resident memory (``/proc/self/statm``
after imports, after the open, after the first batch; and its peak). The
requests of all ranks are counted by kind at the proxy; ``--baseline`` has the
ranks of another version of the package open the same objects right after, for
a ratio measured in the same run. Then the open without
the index where it is affordable (``--unindexed`` objects at most, one rank).
The growth per object is the slope between the two largest sizes. Printed as
it goes; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

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


def populate(prefix: str, size: int, blob: bytes, shared: bool) -> None:
    """Put ``size`` objects of ``blob`` under ``prefix`` (``bucket/key``) into moto's in-process backend,
    no request: one moto key each, or (``shared``) one key object under every name."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    bucket, _, folder = prefix.partition("/")
    names = (f"{folder}/part-{k:07d}.parquet" for k in range(size))
    if not shared:
        for name in names:
            backend.put_object(bucket, name, blob)
        return
    key = backend.put_object(bucket, next(names), blob)
    keys = backend.buckets[bucket].keys
    for name in names:
        keys[name] = key


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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    """Peak resident bytes of this process since its ``exec`` (``VmHWM``; ``ru_maxrss`` would carry the
    parent's resident memory at the fork over the ``exec``: the benchmark's server, not the rank)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(url: str, options: str, index: str, rank: int, world: int, first: bool, budget: int) -> None:
    """One rank: open ``url`` and take its first batch; print a JSON line of seconds and resident bytes."""
    import json
    import warnings

    import s3fs  # noqa: F401  (imports off the clock, as in a process that trains)
    import torch  # noqa: F401

    from dask_windows.dataset import WindowDataset

    warnings.simplefilter("ignore")
    out: dict = {"rss_start": _rss()}
    cpu = time.process_time()  # CPU seconds of every thread: less moved by other jobs on the machine
    started = time.perf_counter()
    kw = dict(KW, buffer_bytes=budget) if budget else KW
    ds = WindowDataset(
        url, storage_options=json.loads(options), index=json.loads(index), rank=rank, world_size=world, **kw
    )
    out["open"] = time.perf_counter() - started
    out["cpu_open"] = time.process_time() - cpu
    out["rss_open"] = _rss()
    if first:
        started = time.perf_counter()
        next(iter(ds))
        out["first"] = time.perf_counter() - started
        out["cpu_first"] = time.process_time() - cpu
        out["rss_first"] = _rss()
    out["rss_peak"] = _peak()
    print(json.dumps(out), flush=True)


def open_ranks(
    url: str, options: dict, index, s3, ranks: int, first: bool, budget: int = 0, root: str = ROOT
) -> tuple[list[dict], dict]:
    """``ranks`` processes opening ``url`` at once with the package under ``root``: each one's figures, and
    the requests of all by kind."""
    import json
    import subprocess

    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, __file__, "--child", url, json.dumps(options), json.dumps(index)]
    s3.reset()  # the ranks make no request before their open (imports only)
    procs = [
        subprocess.Popen(
            [*argv, str(r), str(ranks), str(int(first)), str(budget)], env=env, stdout=subprocess.PIPE, text=True
        )
        for r in range(ranks)
    ]
    outs = []
    for proc in procs:
        stdout, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a rank failed (exit {proc.returncode})")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs, {k: s3.log.count(k) for k in ("list", "head", "get")}


def describe(outs: list[dict], kinds: dict, first: bool) -> str:
    """One line of the ranks' figures: the slowest rank's seconds, the largest rank's memory."""
    mib = 1 << 20
    slowest = max(outs, key=lambda o: o["open"])
    line = (
        f"open {slowest['open']:6.2f} s (CPU {max(o['cpu_open'] for o in outs):.2f} s; slowest of {len(outs)} rank(s))"
    )
    if first:
        line += f", first batch {max(o['first'] for o in outs):5.2f} s after it (CPU from the open "
        line += f"{max(o['cpu_first'] for o in outs):.2f} s)"
    line += f", requests of all ranks: list {kinds['list']} head {kinds['head']} get {kinds['get']}; RSS per rank: "
    line += f"{max(o['rss_start'] for o in outs) / mib:.0f} MiB after imports, "
    line += f"+{max(o['rss_open'] - o['rss_start'] for o in outs) / mib:.0f} MiB by the open"
    if first:
        line += f", +{max(o['rss_first'] - o['rss_start'] for o in outs) / mib:.0f} MiB by the first batch"
    return line + f", peak {max(o['rss_peak'] for o in outs) / mib:.0f} MiB"


def main() -> None:
    import warnings

    from s3proxy import S3Endpoint

    from dask_windows.sources.parquet.index_writer import write_index

    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, options, index, rank, world, first, budget = sys.argv[2:9]
        child(url, options, index, int(rank), int(world), first == "1", int(budget))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--real", type=int, default=1000, help="largest size whose index write_index builds")
    parser.add_argument("--unindexed", type=int, default=1000, help="largest size also opened without the index")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1, help="processes opening at once (ranks of one job)")
    parser.add_argument("--populate", choices=("put", "backend"), default="put")
    parser.add_argument("--first-batch", action="store_true", help="also time the first batch")
    parser.add_argument(
        "--baseline",
        default="",
        help="a folder holding another version of the package (e.g. `git archive main dask_windows`): its ranks "
        "open each size too, right after these, for a ratio measured in the same run",
    )
    parser.add_argument(
        "--buffer-bytes", type=int, default=0, help="the ranks' buffer_bytes (0: the default budget, 1 GiB)"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    sizes = [int(s) for s in args.sizes.split(",")]
    s3 = S3Endpoint()
    s3.make_bucket("scale")
    import s3fs

    direct = s3fs.S3FileSystem(**s3.storage_options(direct=True))
    options = s3.storage_options()
    blob = object_bytes()
    print(
        f"S3 (moto on loopback, {args.latency * 1e3:.0f} ms added per request); objects of {len(blob):,} bytes; "
        f"{args.ranks} rank(s); buffer_bytes={args.buffer_bytes or 'default'}; load average {os.getloadavg()[0]:.1f}"
    )
    built = None
    rows = []
    try:
        for size in sizes:
            prefix = f"scale/n{size}"
            started = time.perf_counter()
            if args.populate == "put":
                upload(direct, prefix, size, blob)
            else:
                populate(prefix, size, blob, shared=size > args.real)
            uploaded = time.perf_counter() - started
            s3.log.delay = args.latency
            build = ""
            if size <= args.real:
                s3.reset()
                started = time.perf_counter()
                report = write_index(f"s3://{prefix}/", series="sid", storage_options=options)
                took = time.perf_counter() - started
                build = (
                    f"index built in {took:.2f} s ({took / size * 1e3:.2f} ms/object, {s3.log.count('get')} GETs, "
                    f"{s3.log.count('list')} lists; {report['bytes_per_file']:.0f} B/object)"
                )
                built = (prefix, size)
            else:
                assert built is not None, "--real must cover the smallest size"
                synthetic_index(direct, built[0], prefix, size, built[1])
                build = f"index: the {built[1]:,}-object index's rows repeated"
            versions = [("", ROOT)] + ([("baseline: ", args.baseline)] if args.baseline else [])
            line = f"{size:>9,} objects: {build}; populated in {uploaded:.1f} s"
            for label, root in versions:
                runs = [
                    open_ranks(
                        f"s3://{prefix}/", options, None, s3, args.ranks, args.first_batch, args.buffer_bytes, root
                    )
                    for _ in range(args.repeat)
                ]
                outs, kinds = min(runs, key=lambda r: max(o["open"] for o in r[0]))
                line += "\n    " + label + describe(outs, kinds, args.first_batch)
                line += f"; load average {os.getloadavg()[0]:.1f}"
                if not label:
                    opened = max(o["open"] for o in outs), max(o["rss_open"] - o["rss_start"] for o in outs)
                    rows.append((size, *opened, max(o["cpu_open"] for o in outs)))
            if size <= args.unindexed:
                plain = open_ranks(f"s3://{prefix}/", options, False, s3, 1, False)
                line += f"; without the index: open {plain[0][0]['open']:.2f} s, {plain[1]['get']} GETs, "
                line += f"{plain[1]['list']} lists"
            print(line, flush=True)
            s3.log.delay = 0.0
    finally:
        s3.close()
    for (n0, t0, m0, c0), (n1, t1, m1, c1) in zip(rows, rows[1:]):
        per = (t1 - t0) / (n1 - n0)
        print(
            f"growth with the index between {n0:,} and {n1:,} objects: {per * 1e6:.1f} us (CPU "
            f"{(c1 - c0) / (n1 - n0) * 1e6:.1f} us) and {(m1 - m0) / (n1 - n0):.0f} B of RSS an object (open, per rank)"
        )


if __name__ == "__main__":
    main()
