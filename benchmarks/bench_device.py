"""Bytes sent to the training device per epoch, host path against ``WindowDataset(device=...)``, and host CPU time.

Usage::

    python benchmarks/bench_device.py [--sizes 10000 100000 1000000] [--window 512] [--batch-size 256]

Stride 1, ``L = --window``, ``C = 4`` float32 channels, one series per 100,000
rows, from numpy arrays (no decode cost, so the loader's own work shows).
For each size, one epoch of each loader, in one run:

* ``host``: batches gathered on the CPU (today's path); what crosses to the
  device is every batch (``B * C * L`` values), as ``DevicePrefetcher`` would
  copy it. Counted from the batches yielded.
* ``device`` on the ``"cpu"`` device: each buffer's rows once plus one int64
  start per window, counted by ``ds.device_traffic``. On the CPU the gathers
  still run on this host (torch's ``index_select``), so its CPU time is the
  device code's cost on a CPU, not what a GPU machine's host pays (there the
  host reads, builds buffers, stages each buffer's rows once and cuts start
  vectors; ``benchmarks/gpu_check.py`` measures that machine).

CPU time is the process's (``time.process_time``: every thread's), per epoch;
each figure is a ratio against the host path measured in the same run.
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="rows")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the host gather may use them)")
    return parser.parse_args(argv)


def series(rows: int) -> list[np.ndarray]:
    """``rows`` rows of ``CHANNELS`` float32 channels, as series of at most ``SERIES_ROWS`` rows."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((rows, CHANNELS), dtype=np.float32)
    return [values[a : a + SERIES_ROWS] for a in range(0, rows, SERIES_ROWS)]


def epoch(data: list[np.ndarray], device: Any, args: argparse.Namespace) -> dict[str, float]:
    """One epoch: bytes that cross to the device, batches, CPU and wall seconds."""
    # next_pass_seconds=0: the next epoch's first buffer is not read (and sent) ahead, so one epoch is counted
    ds = dw.WindowDataset(
        data, window=args.window, batch_size=args.batch_size, seed=0, device=device, next_pass_seconds=0
    )
    cpu, wall = time.process_time(), time.perf_counter()
    batch_bytes = batches = 0
    for x in ds:
        batch_bytes += x.numel() * x.element_size()
        batches += 1
        del x
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    sent = batch_bytes if device is None else ds.device_traffic.total_bytes
    return {"bytes": sent, "batches": batches, "windows": ds.num_windows, "cpu": cpu, "wall": wall}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"stride 1, L={args.window}, B={args.batch_size}, C={CHANNELS} float32; one epoch per loader and size; "
        f"torch threads {args.threads}"
    )
    head = f"{'rows':>10} {'windows':>10} {'loader':>12} {'bytes sent':>14} {'host/this':>10} {'CPU s':>8} {'this/host':>10}"
    print(head)
    for device in (None, "cpu"):  # first use: torch's and numpy's lazy set-up, not timed
        epoch(series(2 * args.window), device, args)
    for rows in args.sizes:
        data = series(rows)
        results = {name: epoch(data, device, args) for name, device in (("host", None), ("cpu", "cpu"))}
        host = results["host"]
        assert len({r["batches"] for r in results.values()}) == 1, results  # the same batches in each
        for name, r in results.items():
            label = "host" if name == "host" else f"device {name}"
            print(
                f"{rows:>10,} {r['windows']:>10,} {label:>12} {r['bytes']:>14,} {host['bytes'] / r['bytes']:>9.0f}x "
                f"{r['cpu']:>8.2f} {r['cpu'] / host['cpu']:>9.2f}x"
            )


if __name__ == "__main__":
    main()
