"""Each accelerator on and off in the default order, in one run, on the shape it is meant to pay on.

    PYTHONPATH=. python benchmarks/bench_accelerators.py [--quick] [--rounds 5] [--only lanes,slots,...]

Every case runs ``WindowDataset``'s defaults (the pool order) but for the one switch, in paired,
interleaved rounds (on, off, off, on, ...: drift on a shared machine falls on both), and prints the
min and median of each side and the ratios ``off / on`` of the medians and of the minima (of times:
above 1.00 the accelerator pays; it is kept at 1.10 or more, docs/performance.md). The load average
is printed before and after each case: on a loaded machine a ratio within 0.90-1.15 is noise, not a
verdict (the same case gave 0.87x and 1.57x in two runs at load 7-11; benchmarks/log/accelerators.md).

* ``lanes``: two copying lanes for batches of features alone (``speedups/lanes.py``; on:
  ``DASK_WINDOWS_LANES=1``, off: ``=0``; by default they copy only made batches, since this case did
  not gain 10%). B=256 L=512 C=4 stride 1 (2 MiB batches), local Parquet, one process: milliseconds
  per batch after the first. Named batches with and without lanes: ``bench_workflow.py``.
* ``slots``: batches of DataLoader workers in shared slots (``speedups/slots.py``; off:
  ``DASK_WINDOWS_SLOTS=0``). The same shape through ``DataLoader(num_workers=2)``: milliseconds per batch
  after the first.
* ``nextpass``: the next pass's first units read ahead (``next_pass_seconds=30``, the default; off:
  ``0``). Four epochs back to back (``set_epoch`` before each) of short epochs (8 files of 40,000 rows,
  C=4, window 64, stride 16, B=256: the data is one fill, so the whole epoch is the pass's last step):
  the wait from an epoch's last batch to the next one's first (median of epochs 1-3) and the seconds
  per epoch from epoch 1's first batch to epoch 3's; with no model step and with ``--step-ms`` (a
  sleep per batch, as a GPU's step leaves the CPU free); on local Parquet and (``nextpassS3``) on S3:
  moto on loopback behind the tests' proxy, ``--latency`` added to every request.
* ``prefetch``: units read and steps built on threads (``prefetch_partitions=1``, the default; off:
  ``0``, everything on the loop's thread). One epoch on S3 of 16 files of 100,000 rows (more than the
  pool's first fill: units are read as the pass goes), with the model step.
* ``fill``: the pool's first units read on ``FILL_THREADS`` (8) threads on an object store (off: one
  thread). ``iter()`` to the first batch of a dataset already open on S3 (32 files of 10,000 rows).
* ``footers``: ranks under ``torch.distributed`` sharing the footers one rank read
  (``sources/parquet/footer_share.py``; off: ``DASK_WINDOWS_SHARE_FOOTERS=0``). Two gloo ranks (fresh
  processes each round) open ``--footer-files`` (1,000) objects on S3 at once: the slower rank's open,
  and the requests the store served.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # (s3proxy: moto behind a counting proxy)

import dask_windows as dw  # noqa: E402

C = 4
FEATURES = [f"f{c}" for c in range(C)]
ALL = "lanes,slots,nextpass,nextpassS3,prefetch,fill,footers"
RESULTS: list[tuple[str, str, list[float], list[float]]] = []  # (case, what, on, off)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def write(root: str, files: int, rows: int, group: int | None = None) -> str:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        table = pa.table({f: rng.standard_normal(rows).astype(np.float32) for f in FEATURES})
        pq.write_table(table, os.path.join(root, f"part-{i:04d}.parquet"), row_group_size=group or rows)
    return root


def paired(case: str, rounds: int, run: Callable[[bool], dict[str, float]]) -> None:
    """``run(on)`` in rounds on, off, off, on, ...; each figure it returns recorded on both sides."""
    print(f"{case}: load {load()}", flush=True)
    on: dict[str, list[float]] = {}
    off: dict[str, list[float]] = {}
    for r in range(rounds):
        for side in (True, False) if r % 2 == 0 else (False, True):
            for what, value in run(side).items():
                (on if side else off).setdefault(what, []).append(value)
    for what in on:
        RESULTS.append((case, what, on[what], off[what]))
        row(case, what, on[what], off[what])
    print(f"{case}: load after {load()}", flush=True)


def row(case: str, what: str, on: list[float], off: list[float]) -> None:
    print(
        f"  {case:15s} {what:26s} on min {min(on):8.4f} med {statistics.median(on):8.4f} | "
        f"off min {min(off):8.4f} med {statistics.median(off):8.4f} | off/on {ratios(on, off)}",
        flush=True,
    )


def ratios(on: list[float], off: list[float]) -> str:
    """``off / on`` of the medians and of the minima (the least disturbed round of each side)."""
    median = statistics.median(off) / max(statistics.median(on), 1e-12)
    return f"{median:5.2f}x (min {min(off) / max(min(on), 1e-12):5.2f}x)"


def env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# -- lanes and slots: B=256 L=512 C=4 stride 1 ------------------------------------------------------


def big_batches(root: str, batches: int, workers: int) -> dict[str, float]:
    """Milliseconds per batch after the first, over ``batches`` batches (``workers``: a DataLoader's)."""
    ds = dw.WindowDataset(root, features=FEATURES, series=None, window=512, stride=1, batch_size=256)
    if workers:
        import torch

        source: Any = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    else:
        source = ds
    it = iter(source)
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    ms = (time.perf_counter() - t0) / batches * 1e3
    del it
    ds.close()
    return {"ms per batch": ms}


def case_lanes(root: str, rounds: int, batches: int) -> None:
    def run(on: bool) -> dict[str, float]:
        env("DASK_WINDOWS_LANES", "1" if on else "0")
        try:
            return big_batches(root, batches, 0)
        finally:
            env("DASK_WINDOWS_LANES", None)

    paired("lanes", rounds, run)


def case_slots(root: str, rounds: int, batches: int) -> None:
    def run(on: bool) -> dict[str, float]:
        env("DASK_WINDOWS_SLOTS", None if on else "0")  # (read by the workers, forked after this)
        try:
            return big_batches(root, batches, 2)
        finally:
            env("DASK_WINDOWS_SLOTS", None)

    paired("slots", rounds, run)


# -- the next pass read ahead: short epochs back to back --------------------------------------------


def epochs(data: str, on: bool, step: float = 0.0, epochs: int = 4, **kwargs: Any) -> dict[str, float]:
    """Figures of ``epochs`` epochs back to back (``set_epoch`` before each): the median wait from an epoch's
    last batch to the next one's first, and the seconds per epoch from the first batch of epoch 1 to that of
    the last epoch (each such epoch pays one first fill: read ahead during it, or at its end without; the
    read-ahead of the pass after the last, never claimed, is left out). ``step``: seconds of a model's step
    per batch (a sleep, as a GPU's step leaves the CPU to the loader)."""
    ds = dw.WindowDataset(
        data, features=FEATURES, series=None, window=64, stride=16, batch_size=256,
        next_pass_seconds=30.0 if on else 0.0, **kwargs,
    )  # fmt: skip
    gaps, firsts, end = [], [], 0.0
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        it = iter(ds)
        next(it)
        firsts.append(time.perf_counter())
        if epoch:
            gaps.append(firsts[-1] - end)
        if epoch == epochs - 1:
            break
        for _ in it:
            if step:
                time.sleep(step)
        end = time.perf_counter()
    del it
    ds.close()
    return {
        "epoch end to next batch s": statistics.median(gaps),
        "s per epoch": (firsts[-1] - firsts[1]) / (epochs - 2),
    }


def case_nextpass(root: str, rounds: int, step: float) -> None:
    paired("nextpass", rounds, lambda on: epochs(root, on))
    paired(f"nextpass+{step * 1e3:.0f}ms", rounds, lambda on: epochs(root, on, step))


# -- the reader and builder threads (runtime/prefetch.py) ------------------------------------------


def case_prefetch(store: Store, url: str, rounds: int, step: float) -> None:
    """One epoch over data larger than the pool's fill (units read as the pass goes), read on the reader
    thread (``prefetch_partitions=1``, the default) or on the loop's (``0``)."""

    def run(on: bool) -> dict[str, float]:
        ds = dw.WindowDataset(
            url, features=FEATURES, series=None, window=64, stride=16, batch_size=256,
            prefetch_partitions=1 if on else 0, next_pass_seconds=0, storage_options=store.options,
        )  # fmt: skip
        t0 = time.perf_counter()
        for _ in ds:
            if step:
                time.sleep(step)
        seconds = time.perf_counter() - t0
        ds.close()
        return {"epoch s": seconds}

    paired(f"S3prefetch+{step * 1e3:.0f}ms", rounds, run)


# -- object store ----------------------------------------------------------------------------------


class Store:
    """moto's S3 server on loopback behind the tests' proxy, ``latency`` s added to every request."""

    def __init__(self, latency: float) -> None:
        import s3fs
        from s3proxy import S3Endpoint

        logging.getLogger("moto").setLevel(logging.ERROR)
        self.endpoint = S3Endpoint()
        self.endpoint.make_bucket("bench")
        self.fs = s3fs.S3FileSystem(**self.endpoint.storage_options(direct=True))
        self.latency = latency

    def put(self, root: str, name: str) -> str:
        self.endpoint.log.delay = 0.0
        for f in sorted(os.listdir(root)):
            self.fs.put(os.path.join(root, f), f"bench/{name}/{f}")
        self.endpoint.log.delay = self.latency
        return f"s3://bench/{name}/"

    @property
    def options(self) -> dict:
        return self.endpoint.storage_options()

    def close(self) -> None:
        self.endpoint.close()


def case_nextpass_s3(store: Store, url: str, rounds: int, step: float) -> None:
    paired(f"S3nextpass+{step * 1e3:.0f}ms", rounds, lambda on: epochs(url, on, step, storage_options=store.options))


def case_fill(store: Store, url: str, rounds: int) -> None:
    import dask_windows.runtime.pool as pool_module

    threads = pool_module.FILL_THREADS

    def run(on: bool) -> dict[str, float]:
        ds = dw.WindowDataset(
            url, features=FEATURES, series=None, window=64, stride=16, batch_size=256,
            storage_options=store.options, next_pass_seconds=0,
        )  # fmt: skip
        pool_module.FILL_THREADS = threads if on else 1
        try:
            t0 = time.perf_counter()
            it = iter(ds)
            next(it)
            seconds = time.perf_counter() - t0
            del it
        finally:
            pool_module.FILL_THREADS = threads
            ds.close()
        return {"iter to first batch s": seconds}

    paired("fill", rounds, run)


def case_footers(store: Store, url: str, rounds: int, ranks: int) -> None:
    """``ranks`` gloo ranks open ``url`` at once, sharing footers or not (fresh processes each time)."""
    import socket

    def run(on: bool) -> dict[str, float]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        child = [sys.executable, os.path.abspath(__file__), "--rank-child", f"tcp://127.0.0.1:{port}", url]
        child += [json.dumps(store.options), str(ranks)]
        environ = dict(os.environ, DASK_WINDOWS_SHARE_FOOTERS="1" if on else "0")
        store.endpoint.reset()
        procs = [
            subprocess.Popen([*child, str(r)], stdout=subprocess.PIPE, text=True, env=environ) for r in range(ranks)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        seconds = max(float(out.strip().splitlines()[-1]) for out in outs)
        return {"slowest rank's open s": seconds, "requests": float(len(store.endpoint.log.requests))}

    paired(f"footers{ranks}", rounds, run)


def rank_child(init: str, url: str, options: str, ranks: int, rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ranks)
    dist.barrier()
    t0 = time.perf_counter()
    ds = dw.WindowDataset(url, features=FEATURES, series=None, window=64, storage_options=json.loads(options))
    seconds = time.perf_counter() - t0
    ds.close()
    print(seconds, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # (gloo's threads can abort the interpreter's shutdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, fewer batches and objects")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=150, help="batches timed per round (lanes, slots)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to every S3 request")
    parser.add_argument("--step-ms", type=float, default=2.0, help="a model's step per batch (nextpass)")
    parser.add_argument("--footer-files", type=int, default=1000, help="objects the ranks open (footers)")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks opening at once (footers)")
    parser.add_argument("--only", default=ALL)
    parser.add_argument("--rank-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_child:
        init, url, options, ranks, rank = args.rank_child
        rank_child(init, url, options, int(ranks), int(rank))
        return
    if args.quick:
        args.rounds, args.batches, args.footer_files = 3, 60, 256
    only = set(args.only.split(","))
    print(f"CPUs {os.cpu_count()}, load {load()}; {args.rounds} rounds; ratios off/on of median (min) times")
    with tempfile.TemporaryDirectory() as tmp:
        if only & {"lanes", "slots"}:
            big = write(os.path.join(tmp, "big"), 4, 250_000)
            if "lanes" in only:
                case_lanes(big, args.rounds, args.batches)
            if "slots" in only:
                case_slots(big, args.rounds, args.batches)
        short = write(os.path.join(tmp, "short"), 8, 40_000)
        if "nextpass" in only:
            case_nextpass(short, args.rounds, args.step_ms / 1e3)
        if only & {"nextpassS3", "prefetch", "fill", "footers"}:
            store = Store(args.latency)
            try:
                if "nextpassS3" in only:
                    case_nextpass_s3(store, store.put(short, "short"), args.rounds, args.step_ms / 1e3)
                if "prefetch" in only:
                    streamed = store.put(write(os.path.join(tmp, "streamed"), 16, 100_000, group=25_000), "streamed")
                    case_prefetch(store, streamed, args.rounds, args.step_ms / 1e3)
                if "fill" in only:
                    case_fill(store, store.put(write(os.path.join(tmp, "fill"), 32, 10_000), "fill"), args.rounds)
                if "footers" in only:
                    many = write(os.path.join(tmp, "many"), args.footer_files, 1_000)
                    case_footers(
                        store,
                        store.put(many, "many"),
                        min(args.rounds, 3) if args.only == ALL else args.rounds,
                        args.ranks,
                    )
            finally:
                store.close()
    print(f"\nsummary: off/on of the median (and min) times, >= 1.10 pays; load {load()}")
    for case, what, on, off in RESULTS:
        print(f"  {case:15s} {what:26s} {ratios(on, off)}")


if __name__ == "__main__":
    main()
