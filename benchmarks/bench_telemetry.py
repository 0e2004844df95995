"""The telemetry's overhead: passes with and without its counters, alternated, in one run.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_telemetry.py            # ~30 s

First the per-batch wrapper alone (the two clock reads and counters around
``next``, in ns a batch); then a features-only pass over in-memory arrays (the loader's cheapest batches, so
the counters' share is the largest it gets): small batches (B=64, L=64, C=4)
where a batch costs microseconds, iterated in this process. "off" replaces
the per-batch wrapper with the bare iterator and removes the dataset's
counters (no per-read timing either). Passes alternate, ten each, each side first in half of the pairs; CPU time of the process; the
median ratio is printed. Shared machine: only the ratio of this run counts.
The pass ratio is confounded: the gather's copy path (``batch.PathChoice``:
numpy or torch's threads, chosen by timing on the running stream) may differ
between passes on a busy machine, and a profile of one such run showed the
gather itself, not the counters, taking the extra time; the wrapper-alone
figure is the clean cost of the per-batch counters.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from dask_windows import dataset as dataset_module
from dask_windows.dataset import WindowDataset


def one_pass(ds: WindowDataset) -> tuple[float, int]:
    """CPU seconds of this process (all its threads) for one pass: what the counters add is CPU work,
    and CPU time is less moved than wall time by the other processes of a shared machine."""
    started, batches = time.process_time(), 0
    for _ in ds:
        batches += 1
    return time.process_time() - started, batches


def _seconds(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def main() -> None:
    series = [np.random.default_rng(i).standard_normal((50_000, 4)).astype(np.float32) for i in range(8)]
    ds = WindowDataset(series, window=64, stride=4, batch_size=64, next_pass_seconds=0)
    watched, telemetry = dataset_module.watched, ds._telemetry
    one_pass(ds)  # warm-up
    on, off = [], []
    for i in range(10):  # alternated, each side first in half of the pairs
        for with_telemetry in (True, False) if i % 2 == 0 else (False, True):
            if with_telemetry:
                dataset_module.watched, ds._telemetry = watched, telemetry
            else:
                dataset_module.watched = lambda _ds, batches: batches
                ds.__dict__.pop("_telemetry", None)
            seconds, batches = one_pass(ds)
            (on if with_telemetry else off).append(seconds)
    dataset_module.watched, ds._telemetry = watched, telemetry
    ratio = statistics.median(a / b for a, b in zip(on, off))
    from dask_windows.runtime.telemetry import Telemetry

    items = list(range(200_000))
    bare = min(_seconds(lambda: sum(1 for _ in items)) for _ in range(5))
    timed = min(_seconds(lambda: sum(1 for _ in Telemetry().watch(items))) for _ in range(5))
    print(f"the per-batch wrapper alone: {(timed - bare) / len(items) * 1e9:.0f} ns a batch (CPU, best of 5)")
    print(
        f"{batches:,} batches per pass ({statistics.median(off) / batches * 1e6:.1f} us CPU a batch without telemetry)"
    )
    print(f"with telemetry / without: {ratio:.4f} (median of 10 alternated pairs; overhead {ratio - 1:+.2%})")


if __name__ == "__main__":
    main()
