"""Where a batch's CPU goes: the default order against the hand-written Dask loop, thread by thread.

``bench_loader.py --only first`` prints wall-clock windows/s; on a shared machine those move with
the load. This prints, for the same shape (B=256, L=512, C=4, stride 1, 8 x 1M-row Parquet files of
10 series), the CPU time per batch of every thread of a fresh process over a stretch of batches,
which the load moves far less:

    python benchmarks/bench_gather.py [--skip 0] [--windows 600000] [--rounds 2] [--whole] [--against DIR]

``--skip N`` leaves out the first N batches after the first one: at this shape the default reads
all 32 row groups (its pool) and builds 31 short steps over its first ~2,200 batches, then drains
one last step of 7.4M windows, so ``--skip 2300`` times the gather alone. ``--whole`` adds the
default with its whole pool read before the first batch (and no next-pass read-ahead); ``--against DIR``
the default of the package at ``DIR`` (a checkout of another commit), in the same rounds. Each line
also gives the longest wait between two batches (at this shape: the last step's build) and the
process's minor page faults over the stretch.

``--footprint`` prints the CPU of one batch's gather alone (numpy, one thread) from one in-RAM
array of 1M rows (one partition: what the hand loop gathers from) and of 8M rows (the whole
dataset: what the default's pool holds), channel-major as both loaders store it.

``--tried`` prints the micro-benchmarks behind the ideas tried for issue 33 (benchmarks/log/gather.md,
2026-12-08), one thread, alternating rounds: a batch's gather from 8M rows with its runs in batch
order, sorted by source address (without and with putting them back in batch order), and after
touching the next batch's runs (one cache line of each run, every fourth line, every line); the
first touch of a pool's pages (a fresh ``np.empty`` against the same array reused, ms per 250k-row
unit, minor faults); and the last step's shuffle at this shape (7.4M int32 windows) as a permutation
index and a gather through it against numpy's shuffle in place.

``--reader`` prints the reader's CPU per unit (one 250k-row row group of the same files, as the
pool reads it) by stage: the whole ``read_rows`` (Arrow's decode, the footer-statistics check, the
file-identity checks), the statistics check alone on the decoded table, and ``decode_pieces`` into
a pool arena (the copy and the NaN/inf check) of the float32 columns as read and of the same values
as float64 (what a pandas-written file holds). ``--against DIR`` times the package at ``DIR`` too
(a checkout of another commit, e.g. ``git worktree add /tmp/base main``), in alternating fresh
processes, and prints the ratio of each stage to it:

    python benchmarks/bench_gather.py --reader [--against DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_loader import B, C, L, write_dataset

FEATURES = [f"f{c}" for c in range(C)]


def _thread_ticks() -> dict[str, tuple[str, int]]:
    """Per thread id: its name and its user + system CPU ticks (Linux ``/proc``)."""
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        with open(task + "/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        with open(task + "/comm") as f:
            out[task.rsplit("/", 1)[-1]] = (f.read().strip(), int(fields[11]) + int(fields[12]))
    return out


def child(job: dict) -> dict:
    """One contender in this process: CPU per batch over ``windows`` windows after ``skip`` batches."""
    if job["kind"] == "hand":
        import dask.dataframe as dd
        from bench_peers import hand_batches

        it = hand_batches(dd.read_parquet(job["root"], columns=["sid", *FEATURES]), FEATURES, B, L, 1)
    else:
        import dask_windows as dw

        kw = {}
        if job["kind"] == "whole":
            import dask_windows.planning.budget as pool_module

            pool_module.POOL_FIRST_BYTES = 1 << 62
            kw["next_pass_seconds"] = 0
        ds = dw.WindowDataset(job["root"], features=FEATURES, series="sid", window=L, batch_size=B, seed=0, **kw)
        it = iter(ds)
    for _ in range(job["skip"] + 1):
        next(it)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    before, cpu, began, n = _thread_ticks(), time.process_time(), time.perf_counter(), 0
    longest, last = 0.0, began
    for _ in it:
        n += 1
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
        if n * B >= job["windows"]:
            break
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    threads = {
        names.get(k, name): round((ticks - before.get(k, ("", 0))[1]) * tick / n)
        for k, (name, ticks) in _thread_ticks().items()
        if ticks > before.get(k, ("", 0))[1]
    }
    threads["threads ended meanwhile"] = round(cpu / n * 1e6 - sum(threads.values()))  # (the builder's, readers')
    return {"rate": n * B / wall, "cpu_us": cpu / n * 1e6, "threads_us": threads, "wait": longest, "faults": faults}


def footprint(rounds: int) -> None:
    """CPU per batch of numpy's gather of B windows from 1M and 8M channel-major rows."""
    from numpy.lib.stride_tricks import as_strided

    rng = np.random.default_rng(0)
    print(
        f"gather alone: B={B} L={L} C={C} random windows, (B*C, L) runs of a (C, rows) array, one thread, CPU us/batch"
    )
    for rows in (1_000_000, 8_000_000):
        x = rng.standard_normal((C, rows), dtype=np.float32)
        flat = x.reshape(-1)
        runs = as_strided(flat, (flat.size - L + 1, L), (4, 4), writeable=False)
        offsets = np.arange(C) * rows
        got = []
        for _ in range(rounds):
            t = time.process_time()
            for _ in range(300):
                runs[(rng.integers(0, rows - L, B)[:, None] + offsets).reshape(-1)]
            got.append((time.process_time() - t) / 300 * 1e6)
        print(f"  {rows:>9,} rows ({x.nbytes >> 20} MiB): " + ", ".join(f"{v:.0f}" for v in got))


def tried(rounds: int) -> None:
    """The micro-benchmarks of ``--tried`` (see the module's docstring)."""
    from numpy.lib.stride_tricks import as_strided

    rng = np.random.default_rng(0)
    rows, batches = 8_000_000, 300
    x = rng.standard_normal((C, rows), dtype=np.float32)
    flat = x.reshape(-1)
    runs = as_strided(flat, (flat.size - L + 1, L), (4, 4), writeable=False)
    index = [(rng.integers(0, rows - L, B)[:, None] + np.arange(C) * rows).reshape(-1) for _ in range(batches)]
    ordered = [np.sort(i) for i in index]

    def placed() -> None:  # gathered in address order, then each run put back in its batch position
        for i in index:
            order = np.argsort(i, kind="stable")
            got = runs[i[order]]
            out = np.empty_like(got)
            out[order] = got

    def touched(every: int) -> Any:
        lines = [(i[:, None] + np.arange(0, L, every)).reshape(-1) for i in index]  # (made before the clock)

        def run() -> None:
            for k, i in enumerate(index):
                if k + 1 < len(index):
                    flat[lines[k + 1]]  # the next batch's runs brought towards the core
                runs[i]

        return run

    cases = {
        "batch order (as now)": lambda: [runs[i].shape for i in index],
        "address order, not put back": lambda: [runs[i].shape for i in ordered],
        "address order, put back": placed,
        "next batch touched, 1 line a run": touched(L),
        "next batch touched, every 4th line": touched(64),
        "next batch touched, every line": touched(16),
    }
    got: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        for name, case in cases.items() if r % 2 == 0 else reversed(cases.items()):
            clock = time.thread_time()
            case()
            got[name].append((time.thread_time() - clock) / batches * 1e6)
    print(
        f"gather of B={B} L={L} C={C} from {rows:,} channel-major rows, CPU us/batch (median [range]); load {os.getloadavg()[0]:.2f}"
    )
    for name, v in got.items():
        print(f"  {name:<36} {np.median(v):5.0f} [{min(v):.0f}-{max(v):.0f}]")
    unit = rng.standard_normal((C, 250_000), dtype=np.float32)
    units = 32
    print(f"first touch: {units} units of 250k rows x {C} float32 copied into a pool, CPU ms per unit (minor faults)")
    pool = None
    for name in ("fresh np.empty", "the same array again"):
        if pool is None:
            pool = np.empty((C, units * 250_000), np.float32)
        faults, clock = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
        for u in range(units):
            pool[:, u * 250_000 : (u + 1) * 250_000] = unit
        ms = (time.thread_time() - clock) / units * 1e3
        print(f"  {name:<22} {ms:6.2f} ms  ({resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults:,} faults)")
    n = 7_400_000
    window = rng.integers(0, 2**31 - 1, n).astype(np.int32)
    print(f"the last step's shuffle, {n:,} int32 windows, CPU seconds")
    for _ in range(rounds):
        clock = time.thread_time()
        indexed = window[np.random.default_rng(5).permutation(n)]
        mid = time.thread_time()
        shuffled = window.copy()
        np.random.default_rng(5).shuffle(shuffled)
        end = time.thread_time()
        same = np.array_equal(indexed, shuffled)
        print(
            f"  permutation + gather {mid - clock:.3f}   shuffle in place (with its copy) {end - mid:.3f}   same {same}"
        )


def reader_child(job: dict) -> dict:
    """CPU ms per unit of each reader stage, median over ``job["units"]`` reads, in this process."""
    import dask_windows as dw
    from dask_windows.runtime.buffer import decode_pieces
    from dask_windows.sources.parquet.stats_check import outside_statistics

    ds = dw.WindowDataset(job["root"], features=FEATURES, series="sid", window=L, batch_size=B, seed=0)
    source, spec, columns = ds.source, ds.spec, list(ds.spec.columns)
    units = [(p, g) for g in range(4) for p in range(len(source.partitions))][: job["units"]]
    rows = 250_000
    arena = np.empty((C, rows), np.float32)
    times: dict[str, list[float]] = {"read_rows": [], "stats check": [], "decode f32": [], "decode f64": []}
    for p, g in units[:2] + units:  # the first two warm up
        clock = time.process_time()
        piece = source.read_rows(p, columns, g * rows, (g + 1) * rows)
        read = time.process_time() - clock
        path = source.partitions[p].key[0]
        table = source._read_table(path, (g,), columns)
        clock = time.process_time()
        assert outside_statistics(source._metadata(path), (g,), table) is None
        check = time.process_time() - clock
        clock = time.process_time()
        decode_pieces(p, "unit", [piece], [g * rows], spec, None, None, (arena, None, 0))
        f32 = time.process_time() - clock
        wide = {c: v.astype(np.float64) for c, v in piece.items()}
        clock = time.process_time()
        decode_pieces(p, "unit", [wide], [g * rows], spec, None, None, (arena, None, 0))
        f64 = time.process_time() - clock
        for name, value in zip(times, (read, check, f32, f64)):
            times[name].append(value * 1e3)
    return {name: float(np.median(values[2:])) for name, values in times.items()}


def reader(root: str, rounds: int, against: str | None) -> None:
    """Print the reader's CPU per unit by stage, of this package and of the one at ``against``."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here} if against is None else {"against": os.path.abspath(against), "this": here}
    print(
        f"reader CPU ms per unit (250k rows x {C} float32 columns), medians of 16 units; load {os.getloadavg()[0]:.2f}"
    )
    got: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(rounds):
        for name, tree in trees.items():
            code = (
                f"import sys; sys.path.insert(0, {tree!r}); import dask_windows; "
                f"sys.path.insert(1, {os.path.dirname(os.path.abspath(__file__))!r}); "
                f"import json, bench_gather; print(json.dumps(bench_gather.reader_child(json.loads(sys.argv[1]))))"
            )
            job = json.dumps({"root": root, "units": 16})
            done = subprocess.run([sys.executable, "-c", code, job], capture_output=True, text=True, check=True)
            got[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  round {r + 1} {name:<7} " + ", ".join(f"{k} {v:.2f}" for k, v in got[name][-1].items()))
    if against is not None:
        for stage in got["this"][0]:
            ratios = [a[stage] / b[stage] for a, b in zip(got["this"], got["against"])]
            print(f"  {stage:<12} this / against: " + ", ".join(f"{v:.2f}" for v in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip", type=int, default=0, help="batches left out after the first")
    parser.add_argument("--windows", type=int, default=600_000, help="windows timed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--whole", action="store_true", help="also the default with its pool filled first")
    parser.add_argument("--footprint", action="store_true", help="only the gather alone from 1M and 8M rows")
    parser.add_argument("--reader", action="store_true", help="only the reader's CPU per unit, by stage")
    parser.add_argument("--tried", action="store_true", help="only the micro-benchmarks of the ideas tried")
    parser.add_argument("--against", help="also time the default of the package at this checkout, alternating")
    parser.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "dask_windows_bench"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.footprint:
        footprint(args.rounds)
        return
    if args.tried:
        tried(args.rounds)
        return
    root = os.path.join(args.dir, "first8x1000000")
    write_dataset(root, 8, rows=1_000_000)
    if args.reader:
        reader(root, args.rounds, args.against)
        return
    kinds = (["against"] if args.against else []) + ["dw", "hand"] + (["whole"] if args.whole else [])
    print(
        f"CPU per batch (us) by thread, {args.windows:,} windows after {args.skip} batches, B={B} L={L} C={C} "
        f"stride 1, 8 x 1M-row files; load {os.getloadavg()[0]:.2f}"
    )
    for r in range(args.rounds):
        for kind in kinds:
            job = {
                "kind": "dw" if kind == "against" else kind,
                "root": root,
                "skip": args.skip,
                "windows": args.windows,
            }
            command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(job)]
            if kind == "against":  # the package at --against imported first, then this file's child
                tree, here = os.path.abspath(args.against), os.path.dirname(os.path.abspath(__file__))
                code = (
                    f"import sys; sys.path.insert(0, {tree!r}); import dask_windows; sys.path.insert(1, {here!r}); "
                    "import json, bench_gather; print(json.dumps(bench_gather.child(json.loads(sys.argv[1]))))"
                )
                command = [sys.executable, "-c", code, json.dumps(job)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            threads = ", ".join(f"{k} {v}" for k, v in sorted(got["threads_us"].items(), key=lambda kv: -kv[1]))
            print(
                f"  round {r + 1} {kind:<7} {got['rate']:9,.0f} windows/s  CPU {got['cpu_us']:5.0f} us/batch  "
                f"longest wait {got['wait']:.2f} s  {got['faults']:,} faults  ({threads})"
            )


if __name__ == "__main__":
    main()
