"""What this machine's cores allow: the copy of a stride-1 gather on one and two threads, and a row group's decode.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_ceilings.py            # 2M-row buffer, B=256 L=512 C=4, 8 rounds
    PYTHONPATH=. python benchmarks/bench_ceilings.py --batch 64 --window 128

Two ceilings behind the figures of ``bench_peers.py`` and ``bench_loader.py --only pieces``:

* **Gather threads.** A stride-1 batch is copied from a channel-major ``(C, rows)`` buffer as
  ``B * C`` runs of ``L`` values (``batch._Runs``, what dw gathers). Here the same copies run on
  one thread, then on two threads at once (``lanes.lane_batches`` with both lanes forced), beside
  a streaming ``np.copyto`` of large arrays on one and two threads; the ratios say how much a
  second core adds to each. Where the second thread adds little to the gather but much to the
  streaming copy, the limit is the gather's scattered runs, not memory bandwidth.
* **Row-group decode.** One row group of 125,000 rows x 4 float32 columns (pyarrow's default
  writer, snappy), decoded whole by ``ParquetFile.read_row_group`` on one thread, with and
  without a memory map: the cost that each extra decode of a row group per epoch adds.

Nothing is asserted: the machine is shared; report the load average printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from dask_windows.runtime.batch import _Runs  # noqa: E402
from dask_windows.speedups import lanes  # noqa: E402


class _Both(lanes.LaneChoice):
    """Every span on both lanes, never timed."""

    def span(self, left: int) -> tuple[bool, int, bool]:
        return True, left, False

    def record(self, both: bool, units: int, seconds: float) -> None:
        pass


def gather_rates(rows: int, channels: int, window: int, batch: int, windows: int, rounds: int) -> tuple[list, list]:
    """Windows/s of one thread's run gather and of two lanes, alternating, ``rounds`` each."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((channels, rows), dtype=np.float32)
    runs = _Runs(data, window, channel_major=True)
    one, two = [], []
    for _ in range(rounds):
        run = rng.integers(0, rows - window + 1, windows // batch * batch)
        for rates, batches in ((one, runs.batches(run, batch)), (two, lanes.lane_batches(runs, run, batch, _Both()))):
            began = time.perf_counter()
            for _ in batches:
                pass
            rates.append(len(run) / (time.perf_counter() - began))
    return one, two


def stream_rates(megabytes: int, reps: int = 6) -> tuple[float, float]:
    """GB/s copied by ``np.copyto`` of ``megabytes`` arrays on one thread and on two at once."""
    n = megabytes << 18  # float32 values
    sources = [np.ones(n, np.float32) for _ in range(2)]
    targets = [np.ones(n, np.float32) for _ in range(2)]  # touched: no page faults in the timing

    def copy(k: int) -> None:
        for _ in range(reps):
            np.copyto(targets[k], sources[k])

    rates = []
    for threads in (1, 2):
        workers = [threading.Thread(target=copy, args=(k,)) for k in range(threads)]
        began = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rates.append(threads * reps * n * 4 / (time.perf_counter() - began) / 1e9)
    return rates[0], rates[1]


def decode_ms(rounds: int = 40) -> tuple[float, float]:
    """Milliseconds to decode one 125,000-row, 4-column float32 row group: plain reads, memory-mapped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    columns = [f"f{c}" for c in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "walk.parquet")
        table = pa.table({c: np.cumsum(rng.standard_normal(1_000_000), dtype=np.float32) for c in columns})
        pq.write_table(table, path, row_group_size=125_000)
        out = []
        for mapped in (False, True):
            f = pq.ParquetFile(path, memory_map=mapped)
            f.read_row_group(3, columns=columns, use_threads=False)
            began = time.perf_counter()
            for k in range(rounds):
                f.read_row_group(k % 8, columns=columns, use_threads=False)
            out.append((time.perf_counter() - began) / rounds * 1e3)
    return out[0], out[1]


def _range(values: list[float]) -> str:
    return f"{np.median(values) / 1e6:.2f}M [{min(values) / 1e6:.2f}-{max(values) / 1e6:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="buffer rows")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--windows", type=int, default=400_000, help="windows per round and way")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    print(f"CPUs usable: {lanes.usable_cpus()}; load average {os.getloadavg()[0]:.2f}")
    one, two = gather_rates(args.rows, args.channels, args.window, args.batch, args.windows, args.rounds)
    ratios = [b / a for a, b in zip(one, two)]
    print(
        f"stride-1 gather B={args.batch} L={args.window} C={args.channels} from a {args.rows:,}-row buffer, "
        f"windows/s: one thread {_range(one)}, two lanes {_range(two)}; two / one "
        f"{np.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    single, double = stream_rates(256)
    print(
        f"np.copyto of 256 MiB arrays: one thread {single:.1f} GB/s, two {double:.1f} GB/s; two / one {double / single:.2f}x"
    )
    plain, mapped = decode_ms()
    print(
        f"one row group, 125,000 rows x 4 float32 (snappy), decoded on one thread: {plain:.2f} ms, memory-mapped {mapped:.2f} ms"
    )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
