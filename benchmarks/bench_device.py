"""Bytes sent to the training device per epoch, host pool order against ``WindowDataset(device=...)``, and speed.

Usage::

    python benchmarks/bench_device.py [--sizes 10000 100000 1000000] [--window 512] [--batch-size 256]
                                      [--buffer-bytes N]

Stride 1, ``L = --window``, ``C = 4`` float32 channels, one series per 100,000
rows, from numpy arrays (no decode cost, so the loader's own work shows). For
each size, one epoch of each loader, in one run:

* ``host pool``: the default (pool) order, batches gathered on the CPU; what
  crosses to the device is every batch (``B * C * L`` values), as
  ``DevicePrefetcher`` would copy it. Counted from the batches yielded.
* ``device pool`` on the ``"cpu"`` device: the same order, each unit's rows sent
  once into a pool on the device plus one int64 start per window
  (``ds.device_traffic``); its batches are checked equal to the host pool's.
* ``device whole``: ``pieces_per_partition=1`` (whole partitions, whole
  buffers sent once), for reference.

``rows sent / decoded`` is the rows crossing against the dataset's rows once
(1.00: each row once; a little more where a window crosses a unit cut). On the
CPU device the gathers still run on this host (torch's ``index_select``), so
windows/s and CPU time are the device code's cost on a CPU, not what a GPU
machine's host pays (there the host reads and decodes units, stages each unit's
rows once and cuts start vectors; ``benchmarks/gpu_check.py`` measures that).

CPU time is the process's (``time.process_time``: every thread's), per epoch;
each figure is a ratio against the host pool order measured in the same run.
Bytes are exact counts; times were taken on a shared, loaded machine.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

import dask_windows as dw

CHANNELS = 4
SERIES_ROWS = 100_000
LOADERS = (("host pool", None, {}), ("device pool", "cpu", {}), ("device whole", "cpu", {"pieces_per_partition": 1}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="rows")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--buffer-bytes", type=int, default=None, help="the pool's budget (default: 1 GiB)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the host gather may use them)")
    return parser.parse_args(argv)


def series(rows: int) -> list[np.ndarray]:
    """``rows`` rows of ``CHANNELS`` float32 channels, as series of at most ``SERIES_ROWS`` rows."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((rows, CHANNELS), dtype=np.float32)
    return [values[a : a + SERIES_ROWS] for a in range(0, rows, SERIES_ROWS)]


def epoch(data: list[np.ndarray], device: Any, args: argparse.Namespace, **order: Any) -> dict[str, Any]:
    """One epoch: bytes that cross to the device, rows sent, batches, CPU and wall seconds (and the batches'
    checksums, to compare loaders)."""
    budget = None if order else args.buffer_bytes  # (the buffer orders take no budget)
    # next_pass_seconds=0: the whole-partition order's next epoch is not read (and sent) ahead: one epoch counted
    ds = dw.WindowDataset(
        data, window=args.window, batch_size=args.batch_size, seed=0, device=device, next_pass_seconds=0,
        buffer_bytes=budget, **order,
    )  # fmt: skip
    cpu, wall = time.process_time(), time.perf_counter()
    batch_bytes = batches = 0
    sums = []
    for x in ds:
        batch_bytes += x.numel() * x.element_size()
        batches += 1
        sums.append(float(x[:, 0, 0].double().sum()))  # the first value of each window: order and values
        del x
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    traffic = ds.device_traffic
    sent = batch_bytes if device is None else traffic.total_bytes
    rows = sum(len(a) for a in data)
    return {
        "bytes": sent, "batches": batches, "windows": ds.num_windows, "cpu": cpu, "wall": wall,
        "rows_sent": traffic.row_bytes / (4 * CHANNELS) / rows if device is not None else float("nan"),
        "pool_mib": traffic.pool_bytes / 2**20, "sums": sums,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"stride 1, L={args.window}, B={args.batch_size}, C={CHANNELS} float32; one epoch per loader and size; "
        f"torch threads {args.threads}; pool budget {args.buffer_bytes or 'default (1 GiB)'}"
    )
    head = (
        f"{'rows':>10} {'windows':>10} {'loader':>13} {'bytes sent':>14} {'host/this':>10} {'rows sent/rows':>15} "
        f"{'pool MiB':>9} {'windows/s':>11} {'this/host':>10} {'CPU s':>7} {'this/host':>10}"
    )
    print(head)
    for _, device, order in LOADERS:  # first use: torch's and numpy's lazy set-up, not timed
        epoch(series(2 * args.window), device, args, **order)
    for rows in args.sizes:
        data = series(rows)
        results = {name: epoch(data, device, args, **order) for name, device, order in LOADERS}
        host = results["host pool"]
        assert len({r["batches"] for r in results.values()}) == 1, results  # the same number of batches in each
        assert results["device pool"]["sums"] == host["sums"], "the device pool's batches differ from the host's"
        for name, r in results.items():
            pool = f"{r['pool_mib']:.2f}" if name == "device pool" else "-"
            sent = "-" if r["rows_sent"] != r["rows_sent"] else f"{r['rows_sent']:.3f}"  # (nan: the host sends batches)
            speed = r["windows"] / r["wall"]
            print(
                f"{rows:>10,} {r['windows']:>10,} {name:>13} {r['bytes']:>14,} {host['bytes'] / r['bytes']:>9.0f}x "
                f"{sent:>15} {pool:>9} {speed:>11,.0f} {host['wall'] / r['wall']:>9.2f}x "
                f"{r['cpu']:>7.2f} {r['cpu'] / host['cpu']:>9.2f}x"
            )


if __name__ == "__main__":
    main()
