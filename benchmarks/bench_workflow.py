"""What a workflow costs: windows/s with it against the same channels stored ready, and the fit.

Loader, at two shapes in one run (``SHAPES``): B=128, window 96, horizon 24, stride 4 on 64
series x 20,000 rows, and B=256, window 512, horizon 0, stride 1 on 64 series x 5,000 rows (each
row copied 512 times: fewer rows keep the run short); ``--batch --window --horizon --stride``
(``--rows-per-series``) measure one shape instead. A raw Parquet dataset (hourly rows of ``--series`` series: a value with 2% missing,
two string categories, a zoned timestamp) is read through a workflow of fill + per-series
normalise + 2 categoricals + 4 time features (7 channels, the value also the target over the
horizon). The baseline is the same 7 channels computed once and stored as float32 columns (what
a rewritten copy would hold), read without a workflow: the ratio is the workflow's cost alone,
measured in this run, the loaders alternated (``--rounds``), each in a fresh process.

Two figures per loader:

* **whole epoch**: from before ``WindowDataset(...)`` (the saved workflow loaded, the files
  opened) to the epoch's last batch, every window counted: the transforms are in it wherever
  they run (with the default pool, data that fit in it are transformed before the first batch);
* **steady state**: from the first batch to the last, the first batch's wait left out (what the
  gather costs once the rows are in memory; it leaves out the transforms when they all ran
  before the first batch).

``--epochs E`` (E > 1) runs ``E`` epochs of one dataset in each process and adds the first epoch,
the later ones pooled, and all of them: the workflow loaders with their transformed rows kept across
epochs (``Workflow(cache_bytes=)``'s default) and not (``cache_bytes=0``), the named batch's int32
and narrow codes kept, and the bytes kept.

Each as windows per wall-clock second and per CPU-second of the process (all its threads; other
jobs on a shared machine move it much less than the wall clock). The named batch
(``wf.named()``, ``wf.named(code_dtype="int32")`` and ``wf.named(code_dtype="narrow")``: the codes
as the loader keeps them, int8 here, not widened) is measured too, and the workflow on a
copy whose two categories are stored as integers (what reading strings into Python objects
costs the first). ``--before REF...`` adds the named batch as other git commits make it (their package exported
with ``git archive``), in the same run; ``--profile KIND`` prints a cProfile of that loader's
consuming thread; ``--breakdown`` adds one more epoch of each loader (not among the timed rounds: its
timers cost about 1 us a call) and prints where its CPU goes per batch: the consuming thread's gathers
of the features, targets and categorical codes and the batch's making (the emitter: tensors, a named
batch's fields), and the other threads (reads and, with a workflow, its transforms).

Fit: ``Workflow.fit`` on a LocalCluster of this machine (the default: one in-process worker of 2
threads) at sizes 10x apart (``--fit-rows``), each in a fresh process, on files of up to 1M rows
written with pyarrow (``--fit-data DIR`` keeps them for the next run; each file its own series,
so the series grow with the rows): seconds, rows/s, the peak resident memory of the process (the
client and its in-process workers), the artifact's size, and each one's growth against the
previous size. The fit's progress goes to stderr.

    python benchmarks/bench_workflow.py [--series 64] [--rows-per-series N] [--files 8] [--rounds 1]
        [--batch 128 --window 96 --horizon 24 --stride 4] [--buffer-bytes N]
        [--epochs 3] [--loaders named named8] [--before REF ...] [--profile named] [--breakdown] [--fit-rows 20000 200000 2000000] [--fit-data DIR] [--skip-loader]
    python benchmarks/bench_workflow.py --batch 256 --window 512 --horizon 0 --stride 1
    python benchmarks/bench_workflow.py --skip-loader --fit-rows 1000000 10000000 100000000 --fit-data /tmp/fit
"""

from __future__ import annotations

import argparse
import json
import math
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


def workflow(target: bool = False):
    from dask_windows.workflow import Categorify, FillMissing, Normalize, TimeFeatures, Workflow

    return Workflow(
        [FillMissing(["value"], value=0.0), Normalize(["value"], per_series=True), Categorify(["store", "family"]),
         TimeFeatures("time", ["hour", "dayofweek", "dayofyear", "month"])],
        series="series", continuous=["value", "time_hour", "time_dayofweek", "time_dayofyear", "time_month"],
        categorical=["store", "family"], target=["value"] if target else (),
    )  # fmt: skip


def measure(make) -> dict:
    """Windows per second of one epoch of ``make()``'s dataset: whole (from before ``make``) and steady.

    Returns:
        ``{"whole", "whole_cpu", "steady", "steady_cpu"}``: windows per wall-clock second and per
        CPU-second of this process (all its threads), over the whole epoch (every window, from
        before the dataset is made) and in steady state (from the first batch, its windows left out);
        ``"windows"``: the epoch's windows.
    """
    start, start_cpu = time.perf_counter(), time.process_time()
    it = iter(make())
    first = next(it)
    ready, ready_cpu = time.perf_counter(), time.process_time()
    count = lambda b: len(b[0] if isinstance(b, tuple) else b["past_cont"] if isinstance(b, dict) else b)
    head = count(first)
    windows = 0
    for batch in it:
        windows += count(batch)
    end, end_cpu = time.perf_counter(), time.process_time()
    del it, first
    return {
        "whole": (head + windows) / (end - start),
        "whole_cpu": (head + windows) / (end_cpu - start_cpu),
        "steady": windows / (end - ready),
        "steady_cpu": windows / (end_cpu - ready_cpu),
        "windows": head + windows,
        "seconds": end - start,
        "cpu_seconds": end_cpu - start_cpu,
    }


def measure_epochs(make, epochs: int) -> dict:
    """``measure`` of ``epochs`` epochs of one dataset: the first from before ``make``, each later one
    from its ``iter``; the keys of ``measure`` are the first epoch's, ``"later"`` / ``"later_cpu"`` the
    epochs after it pooled (windows over seconds), ``"all"`` / ``"all_cpu"`` every epoch's."""
    made: list = []
    doc = measure(lambda: made.append(make()) or made[0])
    rest = []
    for epoch in range(1, epochs):
        made[0].set_epoch(epoch)
        rest.append(measure(lambda: made[0]))
    for key, docs in (("later", rest), ("all", [doc, *rest])):
        windows = sum(d["windows"] for d in docs)
        doc[key] = windows / sum(d["seconds"] for d in docs) if docs else math.nan
        doc[key + "_cpu"] = windows / sum(d["cpu_seconds"] for d in docs) if docs else math.nan
    doc["kept"] = getattr(getattr(made[0].source, "cache", None), "held", 0)  # bytes kept across epochs
    return doc


LOADERS = {  # name -> what a child process opens (``loader_child``)
    "stored channels (no workflow)": "stored",
    "workflow (tuple)": "tuple",
    "workflow (tuple), int categories": "ints",
    "workflow (named batch)": "named",
    "workflow (named batch), int32 codes": "named32",
    "workflow (named batch), narrow codes": "named8",
}
#: With ``--epochs`` above 1: the workflow loaders with their transformed rows kept across epochs (the
#: default, ``Workflow(cache_bytes=)``) and without (``cache_bytes=0``), against the stored channels.
EPOCH_LOADERS = {
    "stored channels (no workflow)": "stored",
    "workflow (tuple), kept across epochs": "tuple",
    "workflow (tuple), not kept (cache_bytes=0)": "tuple0",
    "workflow (named batch), kept across epochs": "named",
    "workflow (named batch), not kept": "named0",
    "workflow (named batch), int32 codes, kept": "named32",
    "workflow (named batch), narrow codes, kept": "named8",
}


def timed_parts(parts: dict) -> None:
    """Wrap the consuming thread's steps so that ``parts`` adds up their thread CPU (ns) per step."""
    from dask_windows.runtime.batch import Gatherer, _Runs
    from dask_windows.workflow.batch import Emitter

    def wrap(cls, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def timed(*args, **kwargs):
            began = time.thread_time_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                parts[key] = parts.get(key, 0) + time.thread_time_ns() - began

        setattr(cls, name, timed)

    wrap(_Runs, "__call__", "gathers")  # every numpy run gather: features, and inside the next two
    wrap(Gatherer, "targets", "targets")
    wrap(Gatherer, "codes_at", "codes")
    wrap(Emitter, "__call__", "emitter")


def loader_child(kind: str, folder: str, profile: str, epochs: int = 1) -> None:
    """One loader's epoch (``measure``), printed as JSON (``profile``: ``"profile"`` a cProfile of this
    thread on stderr, ``"breakdown"`` the CPU per batch of its steps, ``timed_parts``)."""
    from dask_windows import WindowDataset
    from dask_windows.workflow import Workflow

    with open(os.path.join(folder, "settings.json")) as f:
        settings = json.load(f)
    common, channels, targets = settings["common"], settings["channels"], settings["targets"]
    raw, ready, coded = (os.path.join(folder, name) for name in ("raw", "ready", "coded"))
    keep = not kind.endswith("0")  # "tuple0", "named0": the loader with cache_bytes=0
    kind = kind.rstrip("0")

    def make():
        if kind == "stored":
            return WindowDataset(ready, features=channels, targets=targets, series="series", **common)
        if kind == "ints":
            return WindowDataset(coded, workflow=Workflow.load(os.path.join(folder, "wf_ints.json")), **common)
        wf = Workflow.load(os.path.join(folder, "wf.json"))
        if not keep:  # tuple0, named0: nothing kept across epochs
            wf.cache_bytes = 0
        if kind in ("named32", "named8"):  # (only then: a --before commit's package may not know code_dtype)
            wf = wf.named(code_dtype="int32" if kind == "named32" else "narrow")
        return WindowDataset(raw, workflow=wf.named() if kind == "named" else wf, **common)

    if profile == "breakdown":
        parts: dict = {}
        timed_parts(parts)
        thread, process = time.thread_time_ns(), time.process_time_ns()
        doc = measure(make)
        thread, process = time.thread_time_ns() - thread, time.process_time_ns() - process
        batches = math.ceil(doc["windows"] / settings["common"]["batch_size"])
        features = parts.get("gathers", 0) - parts.get("targets", 0) - parts.get("codes", 0)
        steps = {"features": features, **{k: parts.get(k, 0) for k in ("targets", "codes", "emitter")}}
        steps["consumer, the rest"] = thread - sum(steps.values())
        steps["other threads"] = process - thread
        print(json.dumps({k: v / batches / 1e3 for k, v in steps.items()}))  # us a batch
        return
    if profile != "profile":
        print(json.dumps(measure_epochs(make, epochs)))
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    doc = measure(make)
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    print(json.dumps(doc))


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
    target = args.horizon > 0  # the value predicted over the horizon
    wf = workflow(target).fit(raw, scheduler="threads")
    workflow(target).fit(coded, scheduler="threads").save(os.path.join(folder, "wf_ints.json"))
    wf.save(os.path.join(folder, "wf.json"))
    channels = [*wf.continuous, *wf.categorical]
    stored = wf.transform_frame(frame[wf.inputs])[channels].astype(np.float32).assign(series=frame["series"])
    for k, at in enumerate(range(0, len(frame), per_file)):
        stored.iloc[at : at + per_file].to_parquet(os.path.join(ready, f"part{k:03d}.parquet"), index=False)
    common = dict(window=args.window, horizon=args.horizon, stride=args.stride, batch_size=args.batch, seed=0,
                  next_pass_seconds=0, pieces_per_partition=args.pieces, buffer_bytes=args.buffer_bytes)  # fmt: skip
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"common": common, "channels": channels, "targets": list(wf.target)}, f)
    chosen = EPOCH_LOADERS if args.epochs > 1 else LOADERS
    runs = {name: (kind, REPO) for name, kind in chosen.items() if kind == "stored" or kind in (args.loaders or [kind])}
    for ref in args.before or ():  # the named batch as commit REF made it, in the same run
        runs[f"workflow (named batch) at {ref}"] = ("named", export(ref))
    keys = ("whole", "whole_cpu", "steady", "steady_cpu", "later", "later_cpu", "all", "all_cpu", "kept")
    figures: dict[str, dict[str, list[float]]] = {name: {k: [] for k in keys} for name in runs}
    for _ in range(args.rounds):  # the loaders alternated, each in a fresh process
        for name, (kind, package) in runs.items():
            profile = "profile" if args.profile == kind and package == REPO else "plain"
            command = [sys.executable, __file__, "--loader-child", kind, folder, profile, str(args.epochs)]
            out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                                 env=dict(os.environ, PYTHONPATH=package, BENCH_WORKFLOW_PACKAGE=package))  # fmt: skip
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            for k in keys:
                figures[name][k].append(doc[k])
    median = {name: {k: float(np.median(v)) for k, v in per.items()} for name, per in figures.items()}
    base = median["stored channels (no workflow)"]
    print(f"loader: {args.series} series x {args.rows_per_series:,} rows = {len(frame):,} rows, {len(channels)} "
          f"channels, {args.files} files, B={args.batch}, window {args.window}, horizon {args.horizon}, stride "
          f"{args.stride}, buffer_bytes={args.buffer_bytes or 'default'}, one epoch x {args.rounds} rounds (median), "
          "each loader in a fresh process; ratios to the stored channels")  # fmt: skip
    print(f"  {'':<38} {'whole epoch: windows/s':>30} {'windows/CPU-s':>24} | {'steady state: windows/s':>30} "
          f"{'windows/CPU-s':>24}")  # fmt: skip
    for name, m in median.items():
        cells = [f"{m[k]:>12,.0f} ({m[k] / base[k]:.2f}x)" for k in keys[:4]]
        print(f"  {name:<38} {cells[0]:>30} {cells[1]:>24} | {cells[2]:>30} {cells[3]:>24}")
    if args.epochs > 1:
        print(f"  {args.epochs} epochs of one dataset in each process: {'epoch 1: windows/s':>26} {'windows/CPU-s':>24} | "
              f"{'epochs 2+: windows/s':>30} {'windows/CPU-s':>24} | {'all epochs: windows/s':>30} {'windows/CPU-s':>24}")  # fmt: skip
        for name, m in median.items():
            cells = [f"{m[k]:>12,.0f} ({m[k] / base[k]:.2f}x)" for k in ("whole", "whole_cpu", "later", "later_cpu",
                                                                            "all", "all_cpu")]  # fmt: skip
            print(f"  {name:<44} {cells[0]:>20} {cells[1]:>24} | {cells[2]:>30} {cells[3]:>24} | "
                  f"{cells[4]:>30} {cells[5]:>24} | kept {m['kept'] / 2**20:,.1f} MiB")  # fmt: skip
    print(json.dumps({name: {k: round(m[k] / base[k], 3) for k in keys[:-1]} for name, m in median.items()}))
    if args.breakdown:  # one more epoch each, its steps timed (not among the rounds above)
        print("  CPU per batch (us), one epoch from the constructor, each loader in a fresh process:")
        for name, (kind, package) in runs.items():
            if package != REPO:
                continue
            command = [sys.executable, __file__, "--loader-child", kind, folder, "breakdown", "1"]
            out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                                 env=dict(os.environ, PYTHONPATH=package, BENCH_WORKFLOW_PACKAGE=package))  # fmt: skip
            steps = json.loads(out.stdout.strip().splitlines()[-1])
            cells = ", ".join(f"{k} {v:,.1f}" for k, v in steps.items())
            print(f"  {name:<38} {sum(steps.values()):>8,.1f}: {cells}")


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


SHAPES = (  # the two shapes of one run (issue 35): (B, window, horizon, stride, rows per series)
    (128, 96, 24, 4, 20000),
    (256, 512, 0, 1, 5000),  # stride 1: each row copied 512 times, so fewer rows keep the run short
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=64)
    parser.add_argument("--rows-per-series", type=int, default=None, help="default: the shape's (SHAPES)")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--pieces", type=int, default=None, help="pieces_per_partition (default: the loader's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=None, help="one shape only (with --window --horizon --stride)")
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument("--horizon", type=int, default=None)
    parser.add_argument("--stride", type=int, default=None)
    parser.add_argument("--buffer-bytes", type=int, default=None, help="the pool's budget (default: the loader's)")
    parser.add_argument("--fit-rows", type=int, nargs="*", default=[], help="also time the fit at these sizes")
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--before", metavar="REF", nargs="+", help="also the named batch as git commits REF made it")
    parser.add_argument("--profile", choices=sorted(set(LOADERS.values())),
                        help="cProfile this loader's consuming thread (on stderr)")  # fmt: skip
    parser.add_argument("--breakdown", action="store_true", help="also the CPU per batch of each loader's steps")
    parser.add_argument("--loaders", nargs="+", metavar="KIND", choices=sorted({*LOADERS.values(), *EPOCH_LOADERS.values()}),
                        help="only these loaders (and the stored channels, the baseline): more rounds in the time")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs of one dataset per process: epoch 1 and epochs 2+ apart, the workflow's "
                        "transformed rows kept across epochs and not")  # fmt: skip
    parser.add_argument("--loader-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument(
        "--fit-data", default=None, help="folder of the fit's Parquet files (kept; default: a temp one)"
    )
    parser.add_argument("--fit-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_child:
        fit_child(args.fit_child)
        return
    if args.loader_child:
        kind, folder, profile, epochs = args.loader_child
        loader_child(kind, folder, profile, int(epochs))
        return
    if not args.skip_loader:
        shapes = SHAPES
        custom = (args.batch, args.window, args.horizon, args.stride)
        if custom != (None,) * 4:  # one shape: the first's settings where not given
            shapes = ((*(d if v is None else v for v, d in zip(custom, SHAPES[0])), SHAPES[0][4]),)
        for batch, window, horizon, stride, rows in shapes:
            at = {"batch": batch, "window": window, "horizon": horizon, "stride": stride}
            shape = argparse.Namespace(**{**vars(args), **at, "rows_per_series": args.rows_per_series or rows})
            loader(shape)
    if args.fit_rows:
        fits(args)


if __name__ == "__main__":
    main()
