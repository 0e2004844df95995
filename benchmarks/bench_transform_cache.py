"""What keeping a workflow's transformed rows across epochs pays when they outgrow memory: on disk too.

A workflow (``bench_workflow.workflow``: fill + per-series normalise + 2 categoricals + 4 time
features, 7 channels, the value also the target over the horizon) over raw Parquet whose
transformed rows are about 4x ``--cache-bytes`` (8 MiB: 64 series x 16,384 rows, 32 bytes a
transformed row), and at each of ``--scales`` times that many series (default 1 and 10). The pool
(``--buffer-bytes``, 8 MiB) is smaller than the data, so every epoch reads every range again: what
a dataset far larger than memory does. Loaders, each in a fresh process, ``--epochs`` epochs of
one dataset (``bench_workflow.measure_epochs``: the first from before ``WindowDataset(...)``):

* **stored channels**: the same 7 channels computed once and stored as float32 Parquet, no
  workflow: the baseline of every ratio, measured in the same run;
* **workflow, no cache** (``cache_bytes=0``): every range decoded and transformed every epoch;
* **workflow, memory** (``cache_bytes``): the first ranges read kept in memory, the rest read again;
* **workflow, memory + disk** (``cache_bytes`` and ``cache_dir``): the ranges past the memory
  written once to a local folder (``workflow.cache``'s disk tier) and read back in later epochs.

Each as windows per wall-clock second and per CPU-second of the process (all its threads), epoch 1
and the later epochs pooled, with the bytes kept in memory and on disk. The files are read back
through the page cache here (the machine's memory holds them); where it does not, the later
epochs read them from the disk.

    python benchmarks/bench_transform_cache.py [--scales 1 10] [--epochs 3] [--rounds 1]
        [--cache-bytes 8388608] [--buffer-bytes 8388608] [--series 64] [--rows-per-series 16384]
        [--batch 128 --window 96 --horizon 24 --stride 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_workflow import measure_epochs, raw_frame, workflow  # noqa: E402

LOADERS = {  # name -> what a child process opens (``child``)
    "stored channels (no workflow)": "stored",
    "workflow, no cache (cache_bytes=0)": "none",
    "workflow, memory (cache_bytes)": "memory",
    "workflow, memory + disk (cache_dir)": "disk",
}


def write_data(folder: str, args: argparse.Namespace, series: int) -> None:
    """Raw Parquet files (each whole series), the fitted workflow, the stored channels, the settings."""
    raw, ready = os.path.join(folder, "raw"), os.path.join(folder, "ready")
    os.makedirs(raw)
    os.makedirs(ready)
    per_file = max(1, args.series // 8)  # 8 files at scale 1
    for k, first in enumerate(range(0, series, per_file)):  # written a file at a time: bounded memory
        frame = raw_frame(min(per_file, series - first), args.rows_per_series, seed=k)
        frame["series"] += first
        frame.to_parquet(os.path.join(raw, f"part{k:04d}.parquet"), index=False)
    target = args.horizon > 0
    wf = workflow(target).fit(raw, scheduler="threads")
    wf.save(os.path.join(folder, "wf.json"))
    channels = [*wf.continuous, *wf.categorical]
    import pandas as pd

    for name in sorted(os.listdir(raw)):
        frame = pd.read_parquet(os.path.join(raw, name))
        stored = wf.transform_frame(frame[wf.inputs])[channels].astype(np.float32).assign(series=frame["series"])
        stored.to_parquet(os.path.join(ready, name), index=False)
    common = dict(window=args.window, horizon=args.horizon, stride=args.stride, batch_size=args.batch, seed=0,
                  next_pass_seconds=0, buffer_bytes=args.buffer_bytes)  # fmt: skip
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"common": common, "channels": channels, "targets": list(wf.target),
                   "cache_bytes": args.cache_bytes}, f)  # fmt: skip


def child(kind: str, folder: str, epochs: int) -> None:
    """One loader's ``epochs`` epochs (``measure_epochs``), printed as JSON with the bytes kept."""
    import warnings

    from dask_windows import WindowDataset
    from dask_windows.planning.budget import PoolWarning
    from dask_windows.workflow import Workflow

    warnings.simplefilter("ignore", PoolWarning)  # (a pool smaller than the data, on purpose)
    with open(os.path.join(folder, "settings.json")) as f:
        settings = json.load(f)
    common = settings["common"]
    cache_dir = tempfile.mkdtemp(prefix="cache-", dir=folder)

    def make():
        if kind == "stored":
            return WindowDataset(os.path.join(folder, "ready"), features=settings["channels"],
                                 targets=settings["targets"] or None, series="series", **common)  # fmt: skip
        wf = Workflow.load(os.path.join(folder, "wf.json"))
        wf.cache_bytes = 0 if kind == "none" else settings["cache_bytes"]
        wf.cache_dir = cache_dir if kind == "disk" else None
        made.append(WindowDataset(os.path.join(folder, "raw"), workflow=wf, **common))
        return made[-1]

    made: list = []
    doc = measure_epochs(make, epochs)
    cache = made[0].source.cache if made else None
    doc["memory"] = cache.held if cache else 0
    doc["disk"] = cache.disk_held if cache else 0
    print(json.dumps(doc))
    shutil.rmtree(cache_dir, ignore_errors=True)


def run_scale(args: argparse.Namespace, scale: int) -> dict:
    folder = tempfile.mkdtemp(prefix="bench_transform_cache_")
    try:
        series = args.series * scale
        write_data(folder, args, series)
        keys = ("whole", "whole_cpu", "later", "later_cpu", "all", "all_cpu", "memory", "disk", "windows")
        figures: dict[str, dict[str, list[float]]] = {name: {k: [] for k in keys} for name in LOADERS}
        for _ in range(args.rounds):  # the loaders alternated, each in a fresh process
            for name, kind in LOADERS.items():
                command = [sys.executable, __file__, "--child", kind, folder, str(args.epochs)]
                out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                                     env=dict(os.environ, PYTHONPATH=REPO))  # fmt: skip
                doc = json.loads(out.stdout.strip().splitlines()[-1])
                for k in keys:
                    figures[name][k].append(doc[k])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = {name: {k: float(np.median(v)) for k, v in per.items()} for name, per in figures.items()}
    base = median["stored channels (no workflow)"]
    rows = series * args.rows_per_series
    print(f"scale {scale}: {series} series x {args.rows_per_series:,} rows = {rows:,} rows (about "
          f"{rows * 32 / 2**20:,.0f} MiB transformed), cache_bytes={args.cache_bytes:,}, buffer_bytes="
          f"{args.buffer_bytes:,}, B={args.batch}, window {args.window}, horizon {args.horizon}, stride {args.stride}, "
          f"{args.epochs} epochs x {args.rounds} rounds (median), {base['windows']:,.0f} windows an epoch; ratios to "
          "the stored channels")  # fmt: skip
    print(f"  {'':<38} {'epoch 1: windows/s':>24} {'windows/CPU-s':>24} | {'epochs 2+: windows/s':>24} "
          f"{'windows/CPU-s':>24} | kept in memory, on disk")  # fmt: skip
    for name, m in median.items():
        cells = [f"{m[k]:>12,.0f} ({m[k] / base[k]:.2f}x)" for k in ("whole", "whole_cpu", "later", "later_cpu")]
        print(f"  {name:<38} {cells[0]:>24} {cells[1]:>24} | {cells[2]:>24} {cells[3]:>24} | "
              f"{m['memory'] / 2**20:,.1f} MiB, {m['disk'] / 2**20:,.1f} MiB")  # fmt: skip
    return {name: {k: round(m[k] / base[k], 3) for k in keys[:6]} for name, m in median.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache-bytes", type=int, default=8 << 20)
    parser.add_argument("--buffer-bytes", type=int, default=8 << 20)
    parser.add_argument("--series", type=int, default=64)
    parser.add_argument("--rows-per-series", type=int, default=16_384)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--window", type=int, default=96)
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--stride", type=int, default=4)
    args = parser.parse_args()
    if args.child:
        kind, folder, epochs = args.child
        child(kind, folder, int(epochs))
        return
    ratios = {f"scale {scale}": run_scale(args, scale) for scale in args.scales}
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
