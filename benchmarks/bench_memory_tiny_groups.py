"""Resident memory of the pool order over files of tiny row groups, at three data sizes 10x apart.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_memory_tiny_groups.py                 # 2 files of 1e3, 1e4, 1e5 rows
    PYTHONPATH=. python benchmarks/bench_memory_tiny_groups.py --rows 2000 20000 200000 --passes 3

The layout of a streaming writer: two files of 4 float32 columns in row groups of ``--group-rows``
(8) rows. Each size and budget runs in a fresh process, which opens the dataset, trims the heap and
takes its RSS as the base, then runs ``--passes`` passes, recording the peak RSS of each pass (the
higher of the RSS sampled at every batch and the kernel's high-water mark, reset before each pass) and
the RSS after the pass once the heap is trimmed, both above the base. What tests/runtime/test_pool_memory.py
asserts at one size (peak within the budget plus 64 MiB; the last pass ending within 8 MiB of the first)
is printed here for each: the growth from the first pass's end to the last's is the figure that must not
grow with the data. Nothing is asserted: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time, warnings
from dask_windows import WindowDataset
from dask_windows.runtime.memory import trim

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # MiB

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM back to the current RSS
        return True
    except OSError:
        return False

path, budget, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
warnings.simplefilter("ignore")  # the budget holds few units: PoolWarning, expected here
ds = WindowDataset(path, window=64, stride=8, batch_size=64, features=["f0", "f1", "f2", "f3"], buffer_bytes=budget)
trim()
base = status("VmRSS")
peaks, ends, batches, seconds = [], [], [], []
for _ in range(passes):
    hwm = reset_peak()
    peak, n, started = 0.0, 0, time.perf_counter()
    for _batch in ds:
        n += 1
        peak = max(peak, status("VmRSS"))
    seconds.append(time.perf_counter() - started)
    trim()
    ends.append(status("VmRSS") - base)
    peaks.append(max(peak, status("VmHWM") if hwm else 0.0, status("VmRSS")) - base)
    batches.append(n)
print(json.dumps({"base": base, "peaks": peaks, "ends": ends, "batches": batches, "seconds": seconds}))
"""


def write(root: str, rows: int, group_rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for i in range(2):
        table = pa.table({f"f{c}": rng.random(rows, dtype=np.float32) for c in range(4)})
        pq.write_table(table, os.path.join(root, f"part-{i}.parquet"), row_group_size=group_rows)


def measure(root: str, budget: int, passes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, root, str(budget), str(passes)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="rows per file")
    parser.add_argument("--group-rows", type=int, default=8)
    parser.add_argument("--budgets", type=int, nargs="+", default=[128 << 10, 1 << 20], help="buffer_bytes")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    print(
        f"2 files x 4 float32 columns, row groups of {args.group_rows} rows; {args.passes} passes; MiB above the open"
    )
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(
        "rows/file  budget  groups   batches  s/pass  peak per pass (MiB)   end per pass (MiB)   growth first->last end"
    )
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as root:
            write(root, rows, args.group_rows)
            for budget in args.budgets:
                started = time.perf_counter()
                found = measure(root, budget, args.passes)
                peaks = " ".join(f"{p:6.1f}" for p in found["peaks"])
                ends = " ".join(f"{e:6.1f}" for e in found["ends"])
                growth = found["ends"][-1] - found["ends"][0]
                print(
                    f"{rows:>9,} {budget >> 10:>5} KiB {2 * -(-rows // args.group_rows):>7,} {found['batches'][0]:>8,} "
                    f"{sum(found['seconds']) / len(found['seconds']):>6.2f}  {peaks}   {ends}   {growth:+6.1f} MiB"
                    f"  (base RSS {found['base']:.0f} MiB, {time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
