"""Reads against the disk, time to the first batch, and peak memory against the documented formula.

Three figures, each measured in one run, every loader run in its own process:

  disk    stride = window = 512, B=256, C=4, over uncompressed Parquet evicted from the page cache
          (``posix_fadvise(DONTNEED)``, no root needed; the script checks that it works): MiB/s of
          one loader epoch (file bytes / epoch time, waiting for reads included) against a cold
          sequential read of the same files just before it (the disk's speed), in alternating rounds;
          with ``--baseline`` (a checkout, e.g. the main branch) the same epoch with that code too.
          Both reads are cold: the files need not be larger than RAM, they are evicted before each.
  first   time from ``WindowDataset(...)`` (opening the files included) to the first batch, two 128 MiB
          partitions, stride 1 (16.7M window starts in the first buffer), cold and warm, this checkout
          and the baseline; median, range and the load average of each run (``--rounds 7`` for a median).
  memory  peak RSS of one epoch (``VmHWM`` after resetting it through ``/proc/self/clear_refs``, minus
          the RSS once the dataset is open) over buffer_partitions 1/2/4 x prefetch_partitions 0/1/2,
          in partitions of decoded bytes, against the formula of docs/memory.md.

    python benchmarks/bench_disk.py --only disk --rounds 3
    python benchmarks/bench_disk.py --only first --baseline /work/main
    python benchmarks/bench_disk.py --only memory
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
B, L, C = 256, 512, 4
FEATURES = [f"f{c}" for c in range(C)]


def write_files(root: str, partitions: int, rows: int, row_group: int = 1 << 20) -> list[str]:
    """Uncompressed float32 Parquet files of ``rows`` rows and ``C`` columns (file bytes ~ decoded bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for p in range(partitions):
        path = os.path.join(root, f"part-{p:05d}.parquet")
        if not os.path.exists(path):
            cols = {name: rng.standard_normal(rows, dtype=np.float32) for name in FEATURES}
            pq.write_table(pa.table(cols), path + ".tmp", row_group_size=row_group, compression="none")
            os.replace(path + ".tmp", path)
        paths.append(path)
    os.sync()
    return paths


def evict(paths: list[str]) -> None:
    """Drop the files' pages from the page cache (works without root for files we can open)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def sequential_read(paths: list[str]) -> float:
    """Seconds to read the files start to end with 8 MiB reads, one after the other."""
    t0 = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
    return time.perf_counter() - t0


def file_mib(paths: list[str]) -> float:
    return sum(os.path.getsize(p) for p in paths) / 2**20


def child(checkout: str, task: dict) -> dict:
    """Run ``task`` in a fresh interpreter importing ``dask_windows`` from ``checkout``."""
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(task)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tempfile.gettempdir(),
    )
    if out.returncode:
        raise RuntimeError(f"child failed ({checkout}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _read_bytes() -> int:
    """Bytes this process asked ``read``/``pread`` for (``rchar``: a row group read twice counts twice)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def _cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_child(task: dict) -> dict:
    import torch  # noqa: F401  (a training script has it imported: not part of the time to a batch)

    import dask_windows as dw
    from dask_windows import dataset  # noqa: F401

    kw = dict(features=FEATURES, series=None, window=task.get("window", L), batch_size=B)
    kw.update(task.get("options", {}))
    paths = task["paths"]
    if task["kind"] == "first":
        if task["cold"]:
            evict(paths)
        else:
            sequential_read(paths)
        t0, c0 = time.perf_counter(), _cpu()
        ds = dw.WindowDataset(paths, **kw)
        batches = iter(ds)
        next(batches)
        seconds, cpu = time.perf_counter() - t0, _cpu() - c0
        del batches  # closing the pass (joining its readers mid-read) is not part of the first batch
        return {"seconds": seconds, "cpu": cpu}
    ds = dw.WindowDataset(paths, **kw)
    if task["kind"] == "epoch":
        evict(paths)
        r0 = _read_bytes()
        t0, c0, m0 = time.perf_counter(), _cpu(), time.thread_time()
        n = sum(1 for _ in ds)
        cpu, main = _cpu() - c0, time.thread_time() - m0
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "batches": n, "cpu": cpu, "main": main, "read": _read_bytes() - r0}
    # memory: peak over one epoch above the RSS of the open dataset
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    for _ in ds:
        pass
    return {"peak": _status("VmHWM") - base}


def disk_figures(directory: str, partitions: int, rows: int, rounds: int, baseline: str | None) -> None:
    paths = write_files(os.path.join(directory, f"disk-{partitions}x{rows}"), partitions, rows)
    mib = file_mib(paths)
    before = cached_mib()
    evict(paths)
    print(f"eviction check: page cache {before:.0f} -> {cached_mib():.0f} MiB after evicting {mib:.0f} MiB of files")
    cold = sequential_read(paths)  # (evicted just above)
    warm = sequential_read(paths)  # the files are in the page cache now
    print(f"sequential read of {mib:.0f} MiB: warm {mib / warm:.0f} MiB/s, cold {mib / cold:.0f} MiB/s")
    stride = {"stride": L}
    runs = {
        "pieces=1": dict(stride, pieces_per_partition=1),
        "pieces=default": dict(stride),
    }
    checkouts = [("this", HERE)] + ([("baseline", baseline)] if baseline else [])
    figures: dict[str, list[float]] = {}
    loads = []
    for _ in range(rounds):
        loads.append(_load())
        for name, options in runs.items():
            for who, checkout in checkouts:
                # The disk's speed measured just before each epoch: the other users of a shared disk
                # change it from one minute to the next; each epoch is compared with its own neighbour.
                evict(paths)
                disk = mib / sequential_read(paths)
                figures.setdefault("disk", []).append(disk)
                got = child(checkout, {"kind": "epoch", "paths": paths, "options": options})
                figures.setdefault(f"{who} {name}", []).append(mib / got["seconds"] / disk)
                figures.setdefault(f"{who} {name} mib", []).append(mib / got["seconds"])
                figures.setdefault(f"{who} {name} cpu", []).append(got["cpu"] / (mib / 1024))
                figures.setdefault(f"{who} {name} main", []).append(got["main"] / got["cpu"])
                figures.setdefault(f"{who} {name} read", []).append(got["read"] / (mib * 2**20))
    print(f"cold epoch, window=stride={L}, B={B}, C={C}, {partitions} x {rows:,} rows, {rounds} rounds")
    disk = figures["disk"]
    print(f"  disk (cold sequential read before each epoch): {min(disk):.0f}-{max(disk):.0f} MiB/s")
    print(f"  1-minute load average at the start of each round: {', '.join(f'{x:.1f}' for x in loads)}")
    print("  (ratio: epoch MiB/s over the disk's MiB/s just before it, and over the run's fastest disk read;")
    print("   cpu: process CPU seconds per GiB of files;")
    print("   main: share of that CPU on the consumer's thread; read: bytes the process read / file bytes)")
    extra = (" mib", " cpu", " main", " read")
    for key in [k for k in figures if k != "disk" and not k.endswith(extra)]:
        ratios, speed, cpu, main, read = (figures[key + e] for e in ("", *extra))
        of_best = [v / max(disk) for v in speed]
        print(
            f"  {key:<24} ratio {min(ratios):.2f}-{max(ratios):.2f} (of the best disk read {min(of_best):.2f}-"
            f"{max(of_best):.2f})   {min(speed):.0f}-{max(speed):.0f} MiB/s   "
            f"cpu {min(cpu):.2f}-{max(cpu):.2f} s/GiB   main {min(main):.2f}-{max(main):.2f}   "
            f"read x{min(read):.2f}-{max(read):.2f}"
        )
    cores = len(os.sched_getaffinity(0))
    best = min(min(figures[k]) for k in figures if k.endswith(" cpu"))
    print(
        f"  (at {best:.2f} CPU s/GiB, the least above, this machine's {cores} cores, if nothing else ran, could feed "
        f"at most {cores * 1024 / best:.0f} MiB/s: {cores * 1024 / best / max(disk):.2f} of the fastest disk read)"
    )


def _load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def first_figures(directory: str, rounds: int, baseline: str | None) -> None:
    rows = (128 << 20) // (4 * C)  # 128 MiB of float32 per partition
    paths = write_files(os.path.join(directory, "first-2x128MiB"), 2, rows)
    checkouts = [("this", HERE)] + ([("baseline", baseline)] if baseline else [])
    got: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(rounds):
        for cold in (True, False):
            for who, checkout in checkouts:
                load = _load()  # 1-minute load average just before the run
                out = child(checkout, {"kind": "first", "paths": paths, "cold": cold})
                got.setdefault(f"{who} {'cold' if cold else 'warm'}", []).append((out["seconds"], out["cpu"], load))
    print(f"first batch, 2 partitions x 128 MiB, window={L}, stride 1, B={B}, defaults, {rounds} rounds")
    print("  (wall: WindowDataset(...) to the first batch, opening included; cpu: process CPU seconds until then,")
    print("   all threads; load: 1-minute load average before each run; best: the run with the lowest load)")
    for key, runs in got.items():
        wall, cpu, load = ([r[i] for r in runs] for i in range(3))
        calm = min(runs, key=lambda r: r[2])
        print(
            f"  {key:<16} wall median {np.median(wall):.2f} s ({min(wall):.2f}-{max(wall):.2f})   "
            f"cpu {np.median(cpu):.2f} s ({min(cpu):.2f}-{max(cpu):.2f})   load {min(load):.1f}-{max(load):.1f}   "
            f"at load {calm[2]:.1f}: {calm[0]:.2f} s"
        )
    if baseline:
        for kind in ("cold", "warm"):
            ratio = [a[0] / b[0] for a, b in zip(got[f"this {kind}"], got[f"baseline {kind}"])]
            print(f"  {kind}: this / baseline wall, per round: {', '.join(f'{r:.2f}' for r in ratio)}")


READ_PARTITIONS = 3.5  # what one of the reads in flight holds, in partitions (docs/memory.md)
READ_ALONE = 4.5  # what the one read of prefetch_partitions=0 holds, buffer being filled included
READ_THREADS = 2  # reads in flight with a background thread (as the retired buffer order read)


def formula(bp: int, pf: int) -> float:
    """Peak partitions above the open dataset (docs/memory.md), without the batches."""
    if pf == 0:
        return bp + READ_ALONE
    return 2 * bp + pf + READ_THREADS * READ_PARTITIONS


def memory_figures(directory: str, partitions: int, rows: int) -> None:
    paths = write_files(os.path.join(directory, f"memory-{partitions}x{rows}"), partitions, rows)
    partition = rows * C * 4
    batch = B * C * L * 4
    print(f"peak RSS of one epoch over {partitions} x {rows:,} rows (partition = {partition / 2**20:.0f} MiB decoded),")
    print(f"window=stride={L}, B={B}; formula = partitions (docs/memory.md) + 2 batches ({2 * batch / 2**20:.0f} MiB)")
    print("  buffer  prefetch  peak MiB  partitions  formula  measured/formula")
    for bp in (1, 2, 4):
        for pf in (0, 1, 2):
            options = {"stride": L, "buffer_partitions": bp, "prefetch_partitions": pf}
            peak = child(HERE, {"kind": "memory", "paths": paths, "options": options})["peak"]
            expect = formula(bp, pf) * partition + 2 * batch
            print(
                f"  {bp:>6}  {pf:>8}  {peak / 2**20:>8.0f}  {peak / partition:>10.2f}  "
                f"{expect / partition:>7.2f}  {peak / expect:>16.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["all", "disk", "first", "memory"], default="all")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_bench_disk"))
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the disk figure")
    parser.add_argument("--rows", type=int, default=4 << 20, help="rows per partition (disk and memory figures)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", help="another checkout to measure beside this one (e.g. /work/main)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().strip()}")
    if args.only in ("all", "disk"):
        disk_figures(args.dir, args.partitions, args.rows, args.rounds, args.baseline)
    if args.only in ("all", "first"):
        first_figures(args.dir, args.rounds, args.baseline)
    if args.only in ("all", "memory"):
        memory_figures(args.dir, 8, args.rows // 2)
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().strip()}")


if __name__ == "__main__":
    main()
