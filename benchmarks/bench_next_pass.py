"""The next pass's first buffer read ahead (``next_pass_seconds``) on and off: epochs back to back.

The data and the cases of ``bench_loader.py --only pieces`` (one series in files of 8 row groups),
streamed as that bench streams them (whole epochs, ``set_epoch`` before each); for each case and
piece setting (the default ``k`` and ``pieces_per_partition=1``), with the read-ahead on (default)
and off (``next_pass_seconds=0``), in alternating rounds:

* windows/s over whole epochs, first batches included (best of the rounds), and the ratio of the
  default pieces with the read-ahead to ``k=1`` with it (the bench's figure) and without it (the
  0.1 loader);
* the time from ``iter()`` to the first batch of each later epoch (median over the epochs).

    PYTHONPATH=. python benchmarks/bench_next_pass.py --partitions 8 --seconds 2

``--memory``: the peak RSS of one epoch (its last buffer's drain, when the next pass's first buffer
is read, included) with the read-ahead on and off, on the data and in the child processes of
``bench_disk.py --only memory``, against the formula of docs/memory.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_loader  # (the data and cases of --only pieces)

import dask_windows as dw

CPU: list[float] = []  # windows per CPU second of each ``epochs`` call
CASES = bench_loader.PIECE_CASES[:3]  # the short windows, where an epoch lasts a fraction of a second


def dataset(root: str, case: tuple, ppp: int | None, seconds: float) -> dw.WindowDataset:
    window, stride, batch = case
    return dw.WindowDataset(
        root, features=[f"f{c}" for c in range(bench_loader.C)], window=window, stride=stride,
        batch_size=batch, shuffle=True, seed=0, pieces_per_partition=ppp, next_pass_seconds=seconds,
    )  # fmt: skip


def epochs(root: str, case: tuple, ppp: int | None, on: bool, seconds: float) -> tuple[float, list[float]]:
    """``(windows/s, [iter() to first batch s of each epoch])`` over whole epochs for about ``seconds``
    (windows per CPU second of the process appended to ``CPU``).

    Timed from the ``iter()`` of the second epoch: with the read-ahead each timed epoch then pays for
    one first buffer (the next epoch's, read during its last buffer) as without it (its own).
    """
    ds = dataset(root, case, ppp, 30.0 if on else 0.0)
    batch = case[2]
    n = sum(1 for _ in ds)  # epoch 0, untimed
    n, epoch, t0, c0, firsts = 0, 0, time.perf_counter(), time.process_time(), []
    while time.perf_counter() - t0 < seconds:
        epoch += 1
        ds.set_epoch(epoch)
        began = time.perf_counter()
        it = iter(ds)
        if next(it, None) is not None:
            n += 1
            firsts.append(time.perf_counter() - began)
        n += sum(1 for _ in it)
    elapsed = time.perf_counter() - t0
    CPU.append(n * batch / (time.process_time() - c0))
    ds.close()
    return n * batch / elapsed, firsts


def memory(directory: str, rows: int) -> None:
    """Peak RSS of one epoch with ``next_pass_seconds`` 30 and 0 (each point in its own process)."""
    import bench_disk

    paths = bench_disk.write_files(os.path.join(directory, f"memory-8x{rows}"), 8, rows)
    partition = rows * bench_disk.C * 4
    batch = bench_disk.B * bench_disk.C * bench_disk.L * 4
    print(
        f"peak RSS of one epoch (bench_disk --only memory data, partition = {partition / 2**20:.0f} MiB); load "
        f"{os.getloadavg()[0]:.2f}"
    )
    print("  buffer  prefetch  peak on (P)  peak off (P)  on/off  formula (P)  on/formula")
    for bp, pf in ((1, 1), (2, 1), (4, 1), (2, 2)):
        peaks = {}
        for on in (30, 0):
            options = {
                "stride": bench_disk.L,
                "buffer_partitions": bp,
                "prefetch_partitions": pf,
                "next_pass_seconds": on,
            }
            peaks[on] = bench_disk.child(bench_disk.HERE, {"kind": "memory", "paths": paths, "options": options})[
                "peak"
            ]
        expect = bench_disk.formula(bp, pf) * partition + 2 * batch
        print(
            f"  {bp:>6}  {pf:>8}  {peaks[30] / partition:>11.2f}  {peaks[0] / partition:>12.2f}  "
            f"{peaks[30] / peaks[0]:>6.3f}  {expect / partition:>11.2f}  {peaks[30] / expect:>10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_bench"))
    parser.add_argument("--memory", action="store_true", help="peak RSS on and off instead (bench_disk's data)")
    parser.add_argument("--rows", type=int, default=2 << 20, help="--memory: rows per file")
    args = parser.parse_args()
    if args.memory:
        memory(args.dir, args.rows)
        return
    root = os.path.join(args.dir, f"series{args.partitions}x{bench_loader.PIECE_ROWS}")
    bench_loader.write_series(root, args.partitions)
    print(
        f"next pass read ahead: {args.partitions} x {bench_loader.PIECE_ROWS:,}-row files of 8 row groups, "
        f"{args.rounds} alternating rounds of {args.seconds:.0f} s (best); load {os.getloadavg()[0]:.2f}"
    )
    modes = [(ppp, on) for ppp in (None, 1) for on in (True, False)]
    for case in CASES:
        rates: dict[tuple, list[float]] = {m: [] for m in modes}
        firsts: dict[tuple, list[float]] = {m: [] for m in modes}
        cpu: dict[tuple, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode in modes:
                r, f = epochs(root, case, *mode, args.seconds)
                rates[mode].append(r)
                firsts[mode] += f
                cpu[mode].append(CPU[-1])
        best = {m: max(r) for m, r in rates.items()}
        first = {m: statistics.median(f) if f else float("nan") for m, f in firsts.items()}
        label = {(None, True): "default on ", (None, False): "default off", (1, True): "k=1 on ", (1, False): "k=1 off"}
        cells = " | ".join(f"{label[m]} {best[m]:>10,.0f}/s first {first[m] * 1e3:5.1f} ms" for m in modes)
        print(
            f"  L={case[0]:<3} stride {case[1]:<2} B={case[2]:<3} {cells} || default on / k=1 on "
            f"{best[(None, True)] / best[(1, True)]:.2f}x, / k=1 off {best[(None, True)] / best[(1, False)]:.2f}x, "
            f"default off / k=1 off {best[(None, False)] / best[(1, False)]:.2f}x; per CPU second on/off: "
            f"default {max(cpu[(None, True)]) / max(cpu[(None, False)]):.2f}x, "
            f"k=1 {max(cpu[(1, True)]) / max(cpu[(1, False)]):.2f}x"
        )
    print(f"  load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
