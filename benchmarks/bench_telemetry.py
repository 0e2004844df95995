"""The telemetry's overhead: passes with the counters on and off, interleaved, the gather path forced alike.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_telemetry.py            # ~30-60 s
    PYTHONPATH=. python benchmarks/bench_telemetry.py --pairs 30 --passes 2
    PYTHONPATH=. python benchmarks/bench_telemetry.py --shape 256,128,8   # batches of a typical model
    PYTHONPATH=. python benchmarks/bench_telemetry.py --verdict   # wait share and verdict, ~15 s

``--verdict`` runs real loops instead: an input-bound one (``--read-ms`` injected into each read of
the source, nothing done with the batches) and a compute-bound one (``--step-ms`` of sleep per batch,
reads as they are), in the default pool order and the buffer order of whole partitions, and prints
each loop's wait share beside its verdict: the verdict must say input-bound exactly when the share
reaches ``tuning.INPUT_BOUND_SHARE``.

What is compared: whole passes over in-memory arrays, features only, small
batches (B=64, L=64, C=4), iterated in this process: the loader's cheapest
batches (a few microseconds each), where the counters' share is the largest it
gets. "off" is ``telemetry.set_enabled(False)``: no wrapper around ``next``,
no clock reads around reads and waits (the runtime receives no telemetry).

Both arms take the same gather path: the adaptive choice that picks a copy
by timing the running stream (``lanes``: one or two copying threads) is
forced to numpy on one thread, since on a busy machine they may pick differently between passes,
and a profile of the earlier, unforced run showed that choice, not the
counters, taking the extra time.

Rounds are interleaved: pair ``i`` runs on-then-off for even ``i`` and
off-then-on for odd ``i``; each arm's figure is the process CPU time of
``--passes`` passes (less moved by other processes than wall time). The ratio
of each pair is printed as its median with the quartiles and extremes, and the
per-batch cost of the wrapper alone (the clock reads around ``next``). The
machine is shared: only the ratios of one run count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from dask_windows.dataset import WindowDataset
from dask_windows.runtime import telemetry as telemetry_module
from dask_windows.speedups import lanes


def passes(ds: WindowDataset, count: int) -> tuple[float, int]:
    """CPU seconds of this process (all its threads) for ``count`` passes, and batches per pass."""
    started, batches = time.process_time(), 0
    for _ in range(count):
        batches = sum(1 for _ in ds)
    return time.process_time() - started, batches


def _seconds(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def force_one_gather_path() -> None:
    """numpy's copy on this thread in both arms (no second lane)."""
    lanes.worth = lambda *args, **kwargs: False  # type: ignore[assignment]


class _SlowReads:
    """A source read method that sleeps first: the injected read latency."""

    def __init__(self, read, seconds: float) -> None:
        self.read, self.seconds = read, seconds

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.read(*args, **kwargs)


def verdicts(read_ms: float, step_ms: float) -> None:
    """Wait share and verdict of an input-bound and a compute-bound loop, in both orders."""
    import warnings

    from dask_windows.tuning import INPUT_BOUND_SHARE

    series = [np.random.default_rng(i).standard_normal((2_000, 4)).astype(np.float32) for i in range(24)]
    orders = {
        "pool": dict(buffer_bytes=64 << 10),  # holds a few of the 24 units: reads go on through the pass
        "buffer": dict(pieces_per_partition=1, buffer_partitions=1, partition_rows=2_000),
    }
    print(f"threshold: input-bound from a wait share of {INPUT_BOUND_SHARE:.0%} after the first batch")
    for order, settings in orders.items():
        for loop in ("input-bound", "compute-bound"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PoolWarning: the small budget is on purpose
                ds = WindowDataset(series, window=64, stride=16, batch_size=64, next_pass_seconds=0, **settings)
            if loop == "input-bound":
                for name in ("read_rows", "read_ranges", "read"):
                    setattr(ds.source, name, _SlowReads(getattr(ds.source, name), read_ms / 1e3))
            for _ in ds:
                if loop == "compute-bound":
                    time.sleep(step_ms / 1e3)
            stats = ds.stats()
            agrees = stats.verdict.input_bound == (stats.verdict.wait_share >= INPUT_BOUND_SHARE)
            print(
                f"{order:6} {loop:13} reads {stats.reads:3} fetch {stats.fetch_seconds:6.3f} s, reads waited "
                f"{stats.reads_waited_seconds:6.3f} s | wait share {stats.verdict.wait_share:6.1%} | "
                f"{'agrees' if agrees else 'CONTRADICTS'} | {stats.verdict}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--passes", type=int, default=2, help="passes per arm of a pair")
    parser.add_argument("--shape", default="64,64,4", help="batch size, window, channels (B,L,C)")
    parser.add_argument("--verdict", action="store_true", help="wait share and verdict of real loops instead")
    parser.add_argument("--read-ms", type=float, default=40.0, help="--verdict: latency injected into each read")
    parser.add_argument("--step-ms", type=float, default=20.0, help="--verdict: the compute-bound loop's step")
    args = parser.parse_args()
    if args.verdict:
        verdicts(args.read_ms, args.step_ms)
        return
    force_one_gather_path()
    size, window, channels = (int(v) for v in args.shape.split(","))
    series = [np.random.default_rng(i).standard_normal((50_000, channels)).astype(np.float32) for i in range(8)]
    ds = WindowDataset(series, window=window, stride=4, batch_size=size, next_pass_seconds=0)
    passes(ds, 2)  # warm-up
    on, off = [], []
    for i in range(args.pairs):
        for enabled in (True, False) if i % 2 == 0 else (False, True):
            telemetry_module.set_enabled(enabled)
            seconds, batches = passes(ds, args.passes)
            (on if enabled else off).append(seconds)
    telemetry_module.set_enabled(True)
    ratios = sorted(a / b for a, b in zip(on, off))
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])

    items = list(range(200_000))
    bare = min(_seconds(lambda: sum(1 for _ in items)) for _ in range(5))
    timed = min(_seconds(lambda: sum(1 for _ in telemetry_module.Telemetry().watch(items))) for _ in range(5))
    per_batch_off = statistics.median(off) / (batches * args.passes)
    wrapper = (timed - bare) / len(items)
    print("gather path forced in both arms: numpy, one thread (lanes off)")
    print(
        f"batches of B={size}, L={window}, C={channels}: {batches:,} per pass, {per_batch_off * 1e6:.1f} us CPU a batch with telemetry off"
    )
    print(f"the per-batch wrapper alone: {wrapper * 1e9:.0f} ns a batch ({wrapper / per_batch_off:.2%} of a batch)")
    print(
        f"on / off over {args.pairs} interleaved pairs of {args.passes} passes: median {median:.4f} "
        f"(overhead {median - 1:+.2%}), quartiles {q1:.4f}-{q3:.4f}, range {ratios[0]:.4f}-{ratios[-1]:.4f}; "
        f"fastest on / fastest off {min(on) / min(off):.4f}"
    )


if __name__ == "__main__":
    main()
