"""Opening with the dataset index at 10^4, 10^5 and 10^6 files: time to the first batch and memory per file.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_startup_scale.py --work /tmp/scale --sizes 10000,100000,1000000

Each size is a folder of local Parquet files (four columns, 200 rows, one
series each, as ``bench_startup.file_bytes`` writes them) with the index
``dask-windows index`` writes. Sizes up to ``--real`` files are written for
real; a larger size is made of **hard links** to the files of the largest
real size (each real file linked ``size / real`` times, so a series id repeats
in that many files) with a synthetic index: the real index's rows repeated
with the links' paths (its files' sizes and mtimes are theirs: a hard link
shares its inode). What is measured is the CPU work per file of opening from
the index (listing, the index read, partitions, the series runs it tells,
the window grid, the plan of the first epoch) and the first batch; the
per-object request cost of a remote store is ``bench_startup.py``'s.

For each size, in a fresh process (imports and first calls warmed on a tiny
dataset first): seconds to open and to the first batch (best of
``--repeat``), the resident memory the open and the first batch added (``/proc/self/statm``:
the Python objects, numpy arrays and the allocator's slack), and up to
``--traced`` files, in another fresh process, the bytes the opened source and
the opened dataset hold per file (``tracemalloc`` for Python's allocations,
exact but several times slower, so not timed, plus Arrow's allocated bytes:
the index's footers stay in Arrow's buffer). The growth between sizes is printed; nothing is asserted (the
machine is shared: compare the figures of one run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

BASE = dict(features=["f0", "f1"], series="sid", window=16, batch_size=32)
KW = dict(BASE, buffer_partitions=1, pieces_per_partition=1, prefetch_partitions=0)


def settings(defaults: bool) -> dict:
    """The dataset's keywords: every other setting at its default (``--defaults``: the pool order, its
    1 GiB budget and read-ahead), or whole partitions one at a time with nothing read ahead."""
    return BASE if defaults else KW


def make_real(folder: str, size: int) -> None:
    """``size`` files and their index in ``folder`` (kept between runs)."""
    from bench_startup import file_bytes

    from dask_windows.sources.parquet.footer_index import INDEX_NAME
    from dask_windows.sources.parquet.index_writer import write_index

    if os.path.exists(os.path.join(folder, INDEX_NAME)):
        return
    os.makedirs(folder, exist_ok=True)
    for i in range(size):
        with open(os.path.join(folder, f"part-{i:07d}.parquet"), "wb") as dst:
            dst.write(file_bytes(i))
    write_index(folder, series="sid")


def make_linked(folder: str, size: int, real: str, real_size: int) -> None:
    """``size`` hard links to the files of ``real``, and the real index's rows repeated for them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_windows.sources.parquet.footer_index import _META_KEY, INDEX_NAME, table_bytes

    if os.path.exists(os.path.join(folder, INDEX_NAME)):
        return
    os.makedirs(folder, exist_ok=True)
    for k in range(size):
        link = os.path.join(folder, f"part-{k:07d}.parquet")
        if not os.path.exists(link):
            os.link(os.path.join(real, f"part-{k % real_size:07d}.parquet"), link)
    table = pq.read_table(os.path.join(real, INDEX_NAME))
    header = json.loads(table.schema.metadata[_META_KEY])
    table = table.take(pa.array(np.arange(size) % real_size))
    paths = pa.array([f"part-{k:07d}.parquet" for k in range(size)], pa.string())
    table = table.set_column(table.column_names.index("path"), "path", paths)
    header["files"] = size  # its root is relative to its folder (".")
    with open(os.path.join(folder, INDEX_NAME), "wb") as dst:
        dst.write(table_bytes(table.replace_schema_metadata(None), header))


def child(folder: str, mode: str, repeat: int, defaults: bool = False) -> None:
    """Time (``mode="time"``) or measure the memory (``"memory"``) of opening ``folder``."""
    import gc
    import tempfile

    from bench_startup import file_bytes

    from dask_windows.dataset import WindowDataset
    from dask_windows.sources import ParquetSource

    with tempfile.TemporaryDirectory() as warm:  # imports and first calls, off the clock
        with open(os.path.join(warm, "a.parquet"), "wb") as dst:
            dst.write(file_bytes(0))
        from dask_windows.sources.parquet.index_writer import write_index

        write_index(warm, series="sid")
        next(iter(WindowDataset(warm, **settings(defaults))))
    out: dict = {}
    if mode == "time":
        best: dict = {}
        for _ in range(repeat):
            gc.collect()
            rss = _rss()
            started, cpu = time.perf_counter(), time.process_time()
            ds = WindowDataset(folder, **settings(defaults))
            opened = time.perf_counter()
            next(iter(ds))
            first = time.perf_counter()
            spent = time.process_time() - cpu  # CPU seconds of every thread: less moved by other jobs
            grown = _rss() - rss  # resident bytes the open and the first batch added
            for key, value in (
                ("open", opened - started),
                ("first_batch", first - started),
                ("cpu", spent),
                ("rss", grown),
            ):
                best[key] = min(best.get(key, value), value)
            del ds
        out = {**best, "files": len(ParquetSource(folder, series="sid").files)}
    else:
        import tracemalloc

        import pyarrow as pa

        gc.collect()
        arrow = pa.total_allocated_bytes()  # Arrow's own memory (the index's footer bytes): not traced
        tracemalloc.start()
        source = ParquetSource(folder, series="sid")
        out["source"] = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes() - arrow
        del source
        gc.collect()
        tracemalloc.reset_peak()
        base, arrow = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
        ds = WindowDataset(folder, **settings(defaults))
        out["dataset"] = tracemalloc.get_traced_memory()[0] - base + pa.total_allocated_bytes() - arrow
        out["files"] = len(ds.source.files)
        tracemalloc.stop()
    print(json.dumps(out))


def _rss() -> int:
    """Resident bytes of this process (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def run_child(folder: str, mode: str, repeat: int, defaults: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", folder, mode, str(repeat), str(int(defaults))],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:6] == ["1"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the data (kept: writing 10^5 files takes minutes)")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--real", type=int, default=100000, help="largest size written as real files")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--traced", type=int, default=100000, help="largest size measured with tracemalloc (slow)")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the dataset's default settings (pool order, 1 GiB budget) instead of whole partitions one at a time",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    real_sizes = [s for s in sizes if s <= args.real]
    which = (
        "default settings" if args.defaults else "buffer_partitions=1, pieces_per_partition=1, prefetch_partitions=0"
    )
    print(f"opening local Parquet with its index, {which} (shared, loaded machine: compare within this run)")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    rows = {}
    for size in sizes:
        folder = os.path.join(args.work, f"n{size}")
        if size in real_sizes:
            make_real(folder, size)
            kind = "real files"
        else:
            base = max(real_sizes)
            make_linked(folder, size, os.path.join(args.work, f"n{base}"), base)
            kind = f"hard links to {base:,} files, synthetic index"
        timed = run_child(folder, "time", args.repeat, args.defaults)
        memory = run_child(folder, "memory", 1, args.defaults) if size <= args.traced else None
        rows[size] = (timed, memory)
        print(
            f"  {size:>9,} files ({kind}): open {timed['open']:.2f} s, first batch {timed['first_batch']:.2f} s "
            f"({timed['first_batch'] / size * 1e6:.1f} us/file; CPU {timed['cpu']:.2f} s, "
            f"{timed['cpu'] / size * 1e6:.1f} us/file); resident memory grown {timed['rss'] / size:.0f} B/file"
            + (
                ""
                if memory is None
                else f"; held per file (tracemalloc + Arrow): source {memory['source'] / size:.0f} B, "
                f"dataset {memory['dataset'] / size:.0f} B"
            )
            + f"; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    for a, b in zip(sizes, sizes[1:]):
        ta, tb = rows[a][0]["first_batch"], rows[b][0]["first_batch"]
        ca, cb = rows[a][0]["cpu"], rows[b][0]["cpu"]
        print(f"  {a:,} -> {b:,} files (x{b / a:.0f}): first batch x{tb / ta:.1f}, CPU x{cb / ca:.1f}")


if __name__ == "__main__":
    main()
