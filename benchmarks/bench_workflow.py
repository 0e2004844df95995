"""What a workflow costs: windows/s with it against the same channels stored ready, and the fit.

Loader: stride 1, B=256, L=512. A raw Parquet dataset (hourly rows of ``--series`` series: a
value with 2% missing, two string categories, a zoned timestamp) is read through a workflow of
fill + per-series normalise + 2 categoricals + 4 time features (7 channels). The baseline is the
same 7 channels computed once and stored as float32 columns (what a rewritten copy would hold),
read without a workflow: the ratio is the workflow's cost alone, measured in this run, the
loaders alternated (``--rounds``), each in a fresh process timed over one epoch from its first
batch. The named batch (``wf.named()``, and ``wf.named(code_dtype="int32")``) is measured too,
and the workflow on a copy whose two categories are stored as integers (what reading strings
into Python objects costs the first).
Besides windows/s, each loader's windows per CPU-second of its process and of its consuming
thread alone (the gather and the batch's tensors, which is what the named batch changes; other
jobs on a shared machine move it least). ``--before REF...`` adds the named batch as other git commits make it (their package exported
with ``git archive``), in the same run; ``--profile KIND`` prints a cProfile of that loader's
consuming thread.

Fit: ``Workflow.fit`` on a LocalCluster of this machine (the default: one in-process worker of 2
threads) at sizes 10x apart (``--fit-rows``), each in a fresh process, on files of up to 1M rows
written with pyarrow (``--fit-data DIR`` keeps them for the next run; each file its own series,
so the series grow with the rows): seconds, rows/s, the peak resident memory of the process (the
client and its in-process workers), the artifact's size, and each one's growth against the
previous size. The fit's progress goes to stderr.

    python benchmarks/bench_workflow.py [--series 64] [--rows-per-series 20000] [--files 8] [--rounds 1]
        [--before REF ...] [--profile named] [--fit-rows 20000 200000 2000000] [--fit-data DIR] [--skip-loader]
    python benchmarks/bench_workflow.py --series 16 --rows-per-series 10000 --files 4 --rounds 3 --before 0eaecb2 --fit-rows
    python benchmarks/bench_workflow.py --skip-loader --fit-rows 1000000 10000000 100000000 --fit-data /tmp/fit
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.environ.get("BENCH_WORKFLOW_PACKAGE", REPO))  # (--before: another commit's package)


def raw_frame(series: int, rows: int, seed: int = 0) -> pd.DataFrame:
    """``series`` hourly series of ``rows`` rows: value (2% NaN), store, family, a zoned timestamp."""
    rng = np.random.default_rng(seed)
    n = series * rows
    sid = np.repeat(np.arange(series), rows)
    level = rng.uniform(10, 1000, series)[sid]
    value = level * (1 + 0.1 * rng.standard_normal(n))
    value[rng.random(n) < 0.02] = np.nan
    stamps = pd.date_range("2020-01-01", periods=rows, freq="h", tz="Europe/Berlin")
    return pd.DataFrame({
        "series": sid,
        "time": np.tile(stamps, series),
        "value": value,
        "store": np.array([f"store{i % 17}" for i in range(series)])[sid],
        "family": np.array(["food", "tools", "toys", "garden", "books"])[rng.integers(0, 5, n)],
    })  # fmt: skip


def workflow():
    from dask_windows.workflow import Categorify, FillMissing, Normalize, TimeFeatures, Workflow

    return Workflow(
        [FillMissing(["value"], value=0.0), Normalize(["value"], per_series=True), Categorify(["store", "family"]),
         TimeFeatures("time", ["hour", "dayofweek", "dayofyear", "month"])],
        series="series", continuous=["value", "time_hour", "time_dayofweek", "time_dayofyear", "time_month"],
        categorical=["store", "family"],
    )  # fmt: skip


def rate(ds, cpu: list | None = None) -> float:
    """Windows per second over one epoch, from its first batch (the first buffer's wait left out).

    ``cpu``: gets the windows per second of this process's CPU time (all its threads) over the same
    span, a figure that other jobs on a shared machine move much less than the wall clock, then
    the windows per second of the consuming thread's own CPU time (the gather and the batch's
    tensors, without the reader threads: what the named batch changes)."""
    it = iter(ds)
    first = next(it)
    windows = 0
    start, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
    for batch in it:
        windows += len(
            batch[0] if isinstance(batch, tuple) else batch["past_cont"] if isinstance(batch, dict) else batch
        )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    thread_seconds = time.thread_time() - start_thread
    del it, first
    if cpu is not None:
        cpu += [windows / cpu_seconds, windows / thread_seconds]
    return windows / seconds


LOADERS = {  # name -> what a child process opens (``loader_child``)
    "stored channels (no workflow)": "stored",
    "workflow (tuple)": "tuple",
    "workflow (tuple), int categories": "ints",
    "workflow (named batch)": "named",
    "workflow (named batch), int32 codes": "named32",
}


def loader_child(kind: str, folder: str, profile: bool) -> None:
    """One loader's windows/s over one epoch, printed as JSON (``--profile``: cProfile of this thread on stderr)."""
    from dask_windows import WindowDataset
    from dask_windows.workflow import Workflow

    with open(os.path.join(folder, "settings.json")) as f:
        settings = json.load(f)
    common, channels = settings["common"], settings["channels"]
    raw, ready, coded = (os.path.join(folder, name) for name in ("raw", "ready", "coded"))
    if kind == "stored":
        ds = WindowDataset(ready, features=channels, series="series", **common)
    elif kind == "ints":
        ds = WindowDataset(coded, workflow=Workflow.load(os.path.join(folder, "wf_ints.json")), **common)
    else:
        wf = Workflow.load(os.path.join(folder, "wf.json"))
        if kind == "named32":  # (only then: a --before commit's package may not know code_dtype)
            wf = wf.named(code_dtype="int32")
        ds = WindowDataset(raw, workflow=wf.named() if kind == "named" else wf, **common)
    cpu: list[float] = []
    if not profile:
        print(json.dumps({"rate": rate(ds, cpu), "cpu": cpu[0], "thread": cpu[1]}))
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    value = rate(ds, cpu)
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    print(json.dumps({"rate": value, "cpu": cpu[0], "thread": cpu[1]}))


def export(ref: str) -> str:
    """The package as commit ``ref`` holds it, in a temporary folder (for ``--before``)."""
    where = tempfile.mkdtemp(prefix="bench_workflow_before_")
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "dask_windows"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", where], input=archive.stdout, check=True)
    return where


def loader(args: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="bench_workflow_")
    frame = raw_frame(args.series, args.rows_per_series)
    raw, ready, coded = (os.path.join(folder, name) for name in ("raw", "ready", "coded"))
    for path in (raw, ready, coded):
        os.makedirs(path)
    per_file = args.rows_per_series * max(1, args.series // args.files)
    # The categories as integers: the workflow's cost without Arrow's string-to-object conversion.
    ints = frame.assign(**{c: pd.factorize(frame[c], sort=True)[0] for c in ("store", "family")})
    for k, at in enumerate(range(0, len(frame), per_file)):  # series whole in each file
        frame.iloc[at : at + per_file].to_parquet(os.path.join(raw, f"part{k:03d}.parquet"), index=False)
        ints.iloc[at : at + per_file].to_parquet(os.path.join(coded, f"part{k:03d}.parquet"), index=False)
    wf = workflow().fit(raw, scheduler="threads")
    workflow().fit(coded, scheduler="threads").save(os.path.join(folder, "wf_ints.json"))
    wf.save(os.path.join(folder, "wf.json"))
    channels = [*wf.continuous, *wf.categorical]
    stored = wf.transform_frame(frame[wf.inputs])[channels].astype(np.float32).assign(series=frame["series"])
    for k, at in enumerate(range(0, len(frame), per_file)):
        stored.iloc[at : at + per_file].to_parquet(os.path.join(ready, f"part{k:03d}.parquet"), index=False)
    common = dict(window=512, stride=1, batch_size=256, seed=0, next_pass_seconds=0,
                  pieces_per_partition=args.pieces)  # fmt: skip
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"common": common, "channels": channels}, f)
    runs = {name: (kind, REPO) for name, kind in LOADERS.items()}
    for ref in args.before or ():  # the named batch as commit REF made it, in the same run
        runs[f"workflow (named batch) at {ref}"] = ("named", export(ref))
    figures: dict[str, list[float]] = {name: [] for name in runs}
    per_cpu: dict[str, list[float]] = {name: [] for name in runs}
    per_thread: dict[str, list[float]] = {name: [] for name in runs}  # the consuming thread's CPU
    for _ in range(args.rounds):  # the loaders alternated, each in a fresh process
        for name, (kind, package) in runs.items():
            profile = "profile" if args.profile == kind and package == REPO else "plain"
            command = [sys.executable, __file__, "--loader-child", kind, folder, profile]
            out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                                 env=dict(os.environ, PYTHONPATH=package, BENCH_WORKFLOW_PACKAGE=package))  # fmt: skip
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            figures[name].append(doc["rate"])
            per_cpu[name].append(doc["cpu"])
            per_thread[name].append(doc["thread"])
    base = float(np.median(figures["stored channels (no workflow)"]))
    base_cpu = float(np.median(per_cpu["stored channels (no workflow)"]))
    base_thread = float(np.median(per_thread["stored channels (no workflow)"]))
    rows = len(frame)
    print(f"loader: {args.series} series x {args.rows_per_series:,} rows = {rows:,} rows, {len(channels)} channels, "
          f"{args.files} files, pieces_per_partition={args.pieces or 'default'}, stride 1, B=256, L=512, "
          f"one epoch x {args.rounds} rounds (median), each loader in a fresh process")  # fmt: skip
    for name, values in figures.items():
        med = float(np.median(values))
        cpu = float(np.median(per_cpu[name]))
        thread = float(np.median(per_thread[name]))
        print(f"  {name:<44} {med:>9,.0f} windows/s  ratio {med / base:.3f} "
              f"(rounds {', '.join(f'{v / base:.3f}' for v in values)})  "
              f"{cpu:>9,.0f} windows/CPU-s  ratio {cpu / base_cpu:.3f}  "
              f"{thread:>9,.0f} windows/consumer-CPU-s  ratio {thread / base_thread:.3f}")  # fmt: skip
    print(json.dumps({k: float(np.median(v)) / base for k, v in figures.items()}))
    print(json.dumps({k: float(np.median(v)) / base_cpu for k, v in per_cpu.items()}))
    print(json.dumps({k: float(np.median(v)) / base_thread for k, v in per_thread.items()}))


def write_fit_data(folder: str, files: int, rows_per_file: int) -> list[str]:
    """``files`` Parquet files of ``rows_per_file`` rows, ``raw_frame``'s columns (written with pyarrow: fast).

    Each file holds its own ``rows_per_file // 20000`` hourly series (so the series, hence the
    artifact, grow with the data), 2% of the values missing; files already there are kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    series = max(1, rows_per_file // 20000)
    per = rows_per_file // series
    n = series * per
    rng = np.random.default_rng(0)
    hours = np.tile(np.arange(per, dtype=np.int64) * 3_600_000_000, series)  # (n,) microseconds from the start
    start = np.datetime64("2020-01-01T00:00:00", "us").astype(np.int64)
    stores = pa.array(np.repeat(np.array([f"store{i % 17}" for i in range(series)]), per))
    family = pa.array(np.array(["food", "tools", "toys", "garden", "books"])[rng.integers(0, 5, n)])
    paths = []
    for k in range(files):
        path = os.path.join(folder, f"part{k:05d}.parquet")
        paths.append(path)
        if os.path.exists(path):
            continue
        level = np.repeat(rng.uniform(10, 1000, series), per)
        value = level * (1 + 0.1 * rng.standard_normal(n))
        value[rng.random(n) < 0.02] = np.nan
        table = pa.table({
            "series": pa.array(np.repeat(np.arange(series) + k * series, per)),
            "time": pa.array(start + hours, pa.timestamp("us", tz="Europe/Berlin")),
            "value": pa.array(value, from_pandas=True),
            "store": stores,
            "family": family,
        })  # fmt: skip
        pq.write_table(table, path + ".tmp", row_group_size=1 << 17)
        os.replace(path + ".tmp", path)
    return paths


def fit_child(files: list[str]) -> None:
    import logging

    from dask_windows.workflow.fit import FitReport  # noqa: F401 (imported before the clock starts)

    progress = logging.getLogger("dask_windows.workflow.fit")  # the fit's progress, on stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("    %(asctime)s %(message)s", "%H:%M:%S"))
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    wf = workflow().fit(files)  # a LocalCluster of this machine, in this process
    r = wf.fit_report
    artifact = os.path.join(tempfile.mkdtemp(prefix="bench_workflow_fit_"), "wf.json")
    wf.save(artifact)
    print(json.dumps({"rows": r.rows, "partitions": r.partitions, "seconds": r.seconds, "peak": r.peak_rss_bytes,
                      "series": len(wf.series_keys or []), "artifact": os.path.getsize(artifact)}))  # fmt: skip


def fits(args: argparse.Namespace) -> None:
    sizes = sorted(args.fit_rows)
    per_file = min(1_000_000, sizes[0])
    if any(rows % per_file for rows in sizes):
        raise SystemExit(f"--fit-rows {sizes}: each a multiple of the smallest (or of 1,000,000)")
    folder = args.fit_data or tempfile.mkdtemp(prefix="bench_workflow_fit_")
    began = time.perf_counter()
    paths = write_fit_data(folder, sizes[-1] // per_file, per_file)
    print(f"fit data: {len(paths)} files of {per_file:,} rows in {folder} ({time.perf_counter() - began:.0f} s to "
          "write); a LocalCluster of this machine (1 worker process-less, 2 threads), a fresh process per size:")  # fmt: skip
    previous = None
    for rows in sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--fit-child", *paths[: rows // per_file]], stdout=subprocess.PIPE,
            text=True, env=dict(os.environ, PYTHONPATH=REPO), check=True,
        )  # fmt: skip
        doc = json.loads(out.stdout.strip().splitlines()[-1])
        line = (f"  {doc['rows']:>12,} rows {doc['series']:>6,} series {doc['partitions']:>4} partitions  "
                f"{doc['seconds']:>8.1f} s  {doc['rows'] / doc['seconds']:>10,.0f} rows/s  "
                f"peak RSS {doc['peak'] / 2**20:>7,.0f} MiB  artifact {doc['artifact'] / 1024:>8,.1f} KiB")  # fmt: skip
        if previous is not None:
            x = doc["rows"] / previous["rows"]
            line += (f"  | x{x:g} rows: time x{doc['seconds'] / previous['seconds']:.2f}, "
                     f"peak x{doc['peak'] / previous['peak']:.2f}, artifact x{doc['artifact'] / previous['artifact']:.2f}")  # fmt: skip
        print(line, flush=True)
        previous = doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=64)
    parser.add_argument("--rows-per-series", type=int, default=20000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--pieces", type=int, default=None, help="pieces_per_partition (default: the loader's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fit-rows", type=int, nargs="*", default=[20000, 200000, 2000000])
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--before", metavar="REF", nargs="+", help="also the named batch as git commits REF made it")
    parser.add_argument("--profile", choices=sorted(set(LOADERS.values())),
                        help="cProfile this loader's consuming thread (on stderr)")  # fmt: skip
    parser.add_argument("--loader-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--fit-data", default=None, help="folder of the fit's Parquet files (kept; default: a temp one)"
    )
    parser.add_argument("--fit-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_child:
        fit_child(args.fit_child)
        return
    if args.loader_child:
        kind, folder, profile = args.loader_child
        loader_child(kind, folder, profile == "profile")
        return
    if not args.skip_loader:
        loader(args)
    if args.fit_rows:
        fits(args)


if __name__ == "__main__":
    main()
