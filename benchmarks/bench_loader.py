"""Loader throughput against the best in-RAM numpy gather and tsai's memmap approach.

Prints windows/s and GB/s of batches for B=256, L=512, C=4, stride 1, shuffled, over
local Parquet with 1M-row partitions, and in the same run on the same rows:

  (a)  the best vectorised numpy gather of random windows from one in-RAM (rows, C) array
       into a contiguous (B, C, L) batch - the faster of a sliding-window view indexed by the
       batch's starts with one transposing copy, and a gather of contiguous (L, C) blocks
       followed by one transposing copy;
  (a') the same gather from a channel-major (C, rows) copy (our buffer layout without the
       loader around it) - the stricter bound for the loader's own overhead;
  (b)  tsai's TSUnwindowedDataset approach: a (B, L) int64 index built with repeat/arange,
       fancy-indexed from one .npy memmap, made contiguous as (B, C, L).

Then the same stream through a DataLoader with 0, 1 and 2 worker processes, and the peak
RSS of streaming a dataset and one four times as large (separate processes).
``--only normalisation`` prints windows/s with no, global and per-window normalisation
against the 0.1 per-batch arithmetic, in alternating rounds.
``--only pieces`` prints windows/s and peak RSS of the default order (or ``--pieces-k K``; above 1
deprecated since 0.3, served by the pool order) against ``pieces_per_partition=1`` (the 0.1 order,
whole partitions) for short and long windows
(L=32 stride 8, L=64 stride 16, L=512 stride 1; B=64..256) over one long series in
Parquet files of 8 row groups, alternating rounds, ratios from the same run.

Last, page checksums: the same rows written with page CRCs, read with verification on
(the default) and off, as partition reads (MB/s of decoded columns) and as loader windows/s.

    python benchmarks/bench_loader.py [--partitions 4] [--seconds 3]
    python benchmarks/bench_loader.py --only normalisation [--cpu]   (whole epochs of 2 x 400,000 rows)
    python benchmarks/bench_loader.py --crc-only --partitions 2 --seconds 4
    python benchmarks/bench_loader.py --only pieces --partitions 4 --seconds 2 [--pieces-k K]
    python benchmarks/bench_loader.py --only workers --partitions 2 --seconds 2
    python benchmarks/bench_loader.py --only pool   (bench_mixing.py --pool: the default pool order)
    python benchmarks/bench_loader.py --only first [--partitions 8] [--rows 1000000] [--rounds 3] [--windows N]

``--only first`` prints, for the default settings and the hand-written Dask loop (``bench_peers.hand_loop``),
each in a fresh process per round (rounds alternate; medians and ranges): seconds to open, to the first
batch after it, their sum, and steady windows/s after the first batch, with the ratios dw / hand; then
the series scan at open: seconds to open 8, 80 and 800 files of 10,000 rows (10 series each) with
``series=`` and without (the difference is the scan), and its growth per file.

``--only workers`` prints windows/s with num_workers=0/1/2 (batches in reused shared slots,
``dask_windows.speedups.slots``) and with 1 worker on torch's own hand-off (``DASK_WINDOWS_SLOTS=0``), at
B=256 L=512 and B=64 L=128, over zstd files and with ``normalize="sample"``, each with its ratio
to num_workers=0 in the same run, and the DataLoader's own ceiling (batches/s of tiny items).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dask_windows as dw

B, L, C = 256, 512, 4
ROWS = 1_000_000


def write_dataset(root: str, partitions: int, seed: int = 0, rows: int = ROWS) -> None:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for p in range(partitions):
        path = os.path.join(root, f"part-{p:05d}.parquet")
        if os.path.exists(path):
            continue
        cols = {f"f{c}": rng.standard_normal(rows, dtype=np.float32) for c in range(C)}
        cols["sid"] = np.repeat(np.arange(p * 10, p * 10 + 10), rows // 10)
        pq.write_table(pa.table(cols), path, row_group_size=250_000)


def first_child(arg: str) -> None:
    """One contender of ``--only first`` in this fresh process: prints ``{open, first, rate}`` as JSON."""
    job = json.loads(arg)
    root, seconds, kind = job["root"], job["seconds"], job["kind"]
    features = [f"f{c}" for c in range(C)]
    if kind == "hand":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import dask.dataframe as dd
        from bench_peers import hand_batches

        t0 = time.perf_counter()
        frame = dd.read_parquet(root, columns=["sid", *features])
        opened = time.perf_counter()
        it = hand_batches(frame, features, B, L, 1)
        if job.get("contiguous"):  # (B, C, L) laid out as (B, L, C): made what dw yields, as a model would
            it = (x.contiguous() for x in it)
    else:
        if job.get("whole_pool"):  # the order before issue 33: the whole pool read before the first step
            import dask_windows.planning.budget as pool_module

            pool_module.POOL_FIRST_BYTES = 1 << 62
        t0 = time.perf_counter()
        ds = dw.WindowDataset(root, features=features, series="sid", window=L, batch_size=B, seed=0, **job["kw"])
        opened = time.perf_counter()
        it = iter(ds)
    next(it)
    first = time.perf_counter()
    n, t1, windows = 0, time.perf_counter(), job.get("windows", 0)
    for _ in it:
        n += 1
        if (n * B >= windows) if windows else (time.perf_counter() - t1 > seconds):
            break
    print(json.dumps({"open": opened - t0, "first": first - opened, "rate": n * B / (time.perf_counter() - t1)}))


def scan_child(arg: str) -> None:
    """Seconds to open ``root`` with and without ``series=`` in this fresh process (warmed on a tiny open)."""
    job = json.loads(arg)
    features = [f"f{c}" for c in range(C)]
    dw.WindowDataset(job["warm"], features=features, series="sid", window=8, batch_size=4)  # imports, first calls
    out = {}
    for series in ("sid", None):
        t0 = time.perf_counter()
        dw.WindowDataset(job["root"], features=features, series=series, window=8, batch_size=4)
        out[str(series)] = time.perf_counter() - t0
    print(json.dumps(out))


def _child(flag: str, job: dict) -> dict:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), flag, json.dumps(job)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_rows(directory: str, partitions: int, rows: int, seconds: float, rounds: int, windows: int = 0) -> None:
    """Open, first batch and steady windows/s of the default against the hand-written Dask loop; the scan."""
    root = os.path.join(directory, f"first{partitions}x{rows}")
    write_dataset(root, partitions, rows=rows)
    contenders = {
        "dw (default)": {"kind": "dw", "kw": {}},
        "hand (Dask loop)": {"kind": "hand"},
        # before issue 33: the whole pool read before the first step, and no next-pass read-ahead (with it on,
        # the patched fill makes the next pass read its whole pool during this pass's measured seconds)
        "dw, pool filled": {"kind": "dw", "kw": {"next_pass_seconds": 0}, "whole_pool": True},
        # the same work on both sides: the hand loop's (B, C, L) is a view laid out as (B, L, C) (each window
        # one run of L x C values), which dw yields with layout="NLC"; made contiguous, it is dw's default
        "dw, layout NLC": {"kind": "dw", "kw": {"layout": "NLC"}},
        "hand, contiguous": {"kind": "hand", "contiguous": True},
        # the hand loop's mixing: a batch draws on one file's rows (16 MB), not on a pool of 128 MB
        "dw, 20 MB pool": {"kind": "dw", "kw": {"buffer_bytes": 20 << 20}},
    }
    got: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, job in contenders.items():
            got[name].append(_child("--first-child", {**job, "root": root, "seconds": seconds, "windows": windows}))
    print(
        f"open and first batch: {partitions} x {rows:,}-row Parquet files (10 series each, row groups of 250,000), "
        f"B={B} L={L} C={C} stride 1, shuffled; {rounds} alternating rounds, a fresh process each, steady windows/s "
        f"over {f'{windows:,} windows' if windows else f'{seconds:.0f} s'} after the first batch (median [range]); "
        f"load {os.getloadavg()[0]:.2f}"
    )
    med = {
        name: {k: float(np.median([r[k] for r in runs])) for k in ("open", "first", "rate")}
        for name, runs in got.items()
    }
    for name, runs in got.items():
        cells = []
        for key, unit in (("open", "s"), ("first", "s")):
            v = [r[key] for r in runs]
            cells.append(f"{key} {np.median(v):5.2f} {unit} [{min(v):.2f}-{max(v):.2f}]")
        both = [r["open"] + r["first"] for r in runs]
        v = [r["rate"] for r in runs]
        print(
            f"  {name:<18} " + "  ".join(cells) + f"  open+first {np.median(both):5.2f} s  "
            f"steady {np.median(v):10,.0f} windows/s [{min(v):,.0f}-{max(v):,.0f}]"
        )
    dw_, hand = med["dw (default)"], med["hand (Dask loop)"]
    print(
        f"  dw / hand: open+first {(dw_['open'] + dw_['first']) / (hand['open'] + hand['first']):.2f}x (goal <= 2), "
        f"first batch after open {dw_['first'] / hand['first']:.2f}x, steady {dw_['rate'] / hand['rate']:.2f}x (goal >= 0.9)"
    )
    same = med["dw, layout NLC"]["rate"] / hand["rate"], dw_["rate"] / med["hand, contiguous"]["rate"]
    small = med["dw, 20 MB pool"]["rate"] / hand["rate"]
    print(
        f"  the same output: dw NLC / hand {same[0]:.2f}x, dw / hand made contiguous {same[1]:.2f}x; "
        f"the hand loop's mixing (dw with a 20 MB pool) / hand {small:.2f}x"
    )
    scan_root = os.path.join(directory, "scan")
    write_dataset(os.path.join(scan_root, "warm"), 1, rows=1_000)
    times = {}
    for files in (8, 80, 800):
        folder = os.path.join(scan_root, f"n{files}")
        write_dataset(folder, files, rows=10_000)
        times[files] = _child("--scan-child", {"root": folder, "warm": os.path.join(scan_root, "warm")})
    print("series scan at open: files of 10,000 rows (10 series each), open with series= and without, fresh processes")
    for files, t in times.items():
        scan = t["sid"] - t["None"]
        print(
            f"  {files:>4} files: open {t['sid']:6.2f} s with series=, {t['None']:6.2f} s without: scan {scan:6.3f} s"
        )
    per = [
        (times[b]["sid"] - times[b]["None"] - times[a]["sid"] + times[a]["None"]) / (b - a)
        for a, b in ((8, 80), (80, 800))
    ]
    print(f"  scan growth: {per[0] * 1e3:.2f} ms per file (8 -> 80), {per[1] * 1e3:.2f} ms per file (80 -> 800)")


def rate(fn, seconds: float) -> float:
    """Windows per second of calling ``fn`` (one batch per call) for about ``seconds``."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n * B / (time.perf_counter() - t0)


def baselines(root: str, seconds: float) -> dict:
    table = pq.read_table(os.path.join(root, "part-00000.parquet"), columns=[f"f{c}" for c in range(C)])
    rows_c = np.stack([table.column(c).to_numpy() for c in range(C)], axis=1)  # (rows, C)
    chan = np.ascontiguousarray(rows_c.T)  # (C, rows)
    rng = np.random.default_rng(1)
    starts = [rng.integers(0, ROWS - L + 1, B) for _ in range(64)]
    k = [0]

    def next_starts() -> np.ndarray:
        k[0] += 1
        return starts[k[0] % 64]

    view_rc = sliding_window_view(rows_c, L, axis=0)  # (rows-L+1, C, L), L strided by C

    def gather_a() -> torch.Tensor:
        out = np.empty((B, C, L), np.float32)
        out[...] = view_rc[next_starts()]  # one transposing copy into the contiguous batch
        return torch.from_numpy(out)

    rows_view = np.lib.stride_tricks.as_strided(
        rows_c, (ROWS - L + 1, L, C), (rows_c.strides[0], *rows_c.strides), writeable=False
    )  # (rows-L+1, L, C): each window one contiguous block

    def gather_a_blocks() -> torch.Tensor:
        out = np.empty((B, C, L), np.float32)
        out[...] = rows_view[next_starts()].transpose(0, 2, 1)  # contiguous gather, then one transpose
        return torch.from_numpy(out)

    view_cm = sliding_window_view(chan, L, axis=1).transpose(1, 0, 2)  # (rows-L+1, C, L), L contiguous

    def gather_a2() -> torch.Tensor:
        return torch.from_numpy(view_cm[next_starts()])

    npy = os.path.join(root, "..", "tsai.npy")
    if not os.path.exists(npy):
        np.save(npy, rows_c)
    mm = np.load(npy, mmap_mode="r")

    def tsai_b() -> torch.Tensor:
        s = next_starts()
        idx = np.repeat(s, L) + np.tile(np.arange(L), B)  # (B*L,) rows, as TSUnwindowedDataset builds them
        x = mm[idx].reshape(B, L, C)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)))

    variants = {
        "view + transposing copy": rate(gather_a, seconds),
        "block gather + transpose": rate(gather_a_blocks, seconds),
    }
    best = max(variants, key=variants.get)
    return {"a": variants[best], "a_variant": best, "a_prime": rate(gather_a2, seconds), "b": rate(tsai_b, seconds)}


def loader_rate(root: str, seconds: float) -> tuple[float, float]:
    ds = dw.WindowDataset(
        root, features=[f"f{c}" for c in range(C)], series="sid", window=L, batch_size=B, shuffle=True, seed=0
    )
    t0 = time.perf_counter()
    it = iter(ds)
    next(it)
    first = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    for _ in it:
        n += 1
        if time.perf_counter() - t0 > seconds:
            break
    return n * B / (time.perf_counter() - t0), first


def loader_workers_rate(root: str, num_workers: int, seconds: float) -> float:
    """Windows/s through ``DataLoader(ds, batch_size=None, num_workers=...)``, first batch excluded."""
    ds = dw.WindowDataset(root, features=[f"f{c}" for c in range(C)], series="sid", window=L, batch_size=B)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers))
    next(it)
    n, t0 = 0, time.perf_counter()
    for _ in it:
        n += 1
        if time.perf_counter() - t0 > seconds:
            break
    return n * B / (time.perf_counter() - t0)


def workers_rows(directory: str, root: str, partitions: int, seconds: float) -> None:
    """windows/s with 0, 1, 2 DataLoader workers (slots) and 1 on torch's hand-off, ratios to 0 workers."""
    zstd = os.path.join(directory, "zstd")
    os.makedirs(zstd, exist_ok=True)
    for name in sorted(os.listdir(root))[:partitions]:
        if not os.path.exists(os.path.join(zstd, name)):
            table = pq.read_table(os.path.join(root, name))
            pq.write_table(table, os.path.join(zstd, name), row_group_size=250_000, compression="zstd")
    cases = [
        ("stride 1", root, B, L, None),
        ("stride 1", root, 64, 128, None),
        ("zstd files", zstd, B, L, None),
        ('normalize="sample"', root, B, L, "sample"),
    ]
    with open("/proc/loadavg") as f:
        load = f.read()[:14]
    print(f"DataLoader workers, {partitions} x {ROWS:,}-row partitions, C={C}, load average {load}")
    ceiling = _ceiling(1, seconds), _ceiling(2, seconds)
    print(f"DataLoader ceiling (tiny items): {ceiling[0]:,.0f} / {ceiling[1]:,.0f} batches/s (1/2 workers)")
    for label, data, b, w, normalize in cases:
        ds = dw.WindowDataset(
            data, features=[f"f{c}" for c in range(C)], series="sid", window=w, batch_size=b, normalize=normalize
        )
        rates = {}
        for workers, slots in ((0, True), (1, True), (2, True), (1, False)):
            os.environ["DASK_WINDOWS_SLOTS"] = "1" if slots else "0"  # read in the (forked) workers
            rates[workers, slots] = _loader_rate(ds, b, workers, seconds)
        os.environ.pop("DASK_WINDOWS_SLOTS")
        zero = rates[0, True]
        cells = "  ".join(f"W={k[0]}{'' if k[1] else ' torch'} {v:10,.0f} ({v / zero:4.2f}x)" for k, v in rates.items())
        print(f"{label:20s} B={b:3d} L={w:3d}  {cells}")


def _loader_rate(ds: dw.WindowDataset, b: int, num_workers: int, seconds: float) -> float:
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers))
    next(it)
    n, t0 = 0, time.perf_counter()
    for _ in it:
        n += 1
        if time.perf_counter() - t0 > seconds:
            break
    return n * b / (time.perf_counter() - t0)


class _Tiny(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10**9))


def _ceiling(num_workers: int, seconds: float) -> float:
    """Batches/s the DataLoader moves from workers when making a batch costs nothing."""
    it = iter(torch.utils.data.DataLoader(_Tiny(), batch_size=None, num_workers=num_workers))
    next(it)
    n, t0 = 0, time.perf_counter()
    for _ in it:
        n += 1
        if time.perf_counter() - t0 > seconds:
            break
    return n / (time.perf_counter() - t0)


def stream_rss(root: str) -> None:
    """Child mode: stream one full epoch, print peak RSS in MiB as JSON."""
    torch.set_num_threads(1)
    ds = dw.WindowDataset(root, features=[f"f{c}" for c in range(C)], series="sid", window=L, batch_size=B)
    batches = sum(1 for _ in ds)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"batches": batches, "peak_rss_mib": peak}))


def child_rss(root: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--rss-child", root], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _old_sample(x: np.ndarray) -> None:
    """The per-batch ``normalize="sample"`` of 0.1 (for the comparison): five numpy passes."""
    mean = x.mean(axis=2, keepdims=True)
    x -= mean
    std = np.sqrt(np.mean(np.square(x), axis=2, keepdims=True))
    x /= np.maximum(std, 1e-8)


NORM_ROWS = 400_000  # rows per file of the normalisation rows (two files: one buffer, one epoch per figure)


def normalisation_rows(root: str, seconds: float, rounds: int = 3, cpu: bool = False) -> None:
    """Windows/s without normalisation, with global statistics and per window, alternating rounds.

    Each figure is one whole epoch after its first batch (``seconds`` is not used): the per-buffer
    work (the tail of the shuffle, ``normalize="sample"``'s table of window statistics, reading
    the next buffer) is then charged to the windows it serves, where a window of a few seconds
    at the start of an epoch charged it the next buffer's too.

    The 0.1 ways are measured in the same run as a normalize=None stream followed by their own
    per-batch arithmetic: global statistics as ``(x - mean) * (1 / std)`` on every batch, and
    ``"sample"`` as its five-pass numpy formula. ``cpu``: windows per second of the process's CPU
    time (``time.process_time``: every thread, BLAS's included) instead of wall time, the figure
    that stays put on a busy machine, where the wall-time ratios of one run swing by 2x (global
    statistics are applied while decoding, which both clocks leave out here: the two partitions
    are one buffer, decoded before the first batch, when timing starts).
    """
    clock = time.process_time if cpu else time.perf_counter
    features = [f"f{c}" for c in range(C)]
    mean = np.array([0.1, -0.2, 0.3, 0.05], np.float32)
    std = np.array([1.1, 0.9, 1.3, 0.7], np.float32)
    inv = (1.0 / std)[None, :, None]

    def stream(normalize: object, after: object = None) -> float:
        ds = dw.WindowDataset(root, features=features, series="sid", window=L, batch_size=B, normalize=normalize)
        it = iter(ds)
        next(it)
        n, c0 = 0, clock()
        for x in it:
            if after is not None:
                after(x.numpy())
            n += 1
        used = clock() - c0
        it.close()
        return n * B / used

    def per_batch_global(x: np.ndarray) -> None:
        x -= mean[None, :, None]
        x *= inv

    cases = {
        "none": lambda: stream(None),
        "global, once per partition (now)": lambda: stream({"mean": mean, "std": std}),
        "global, per batch (0.1)": lambda: stream(None, per_batch_global),
        "sample, vectorised (now)": lambda: stream("sample"),
        "sample, 0.1 formula": lambda: stream(None, _old_sample),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            results[name].append(case())
    none = np.median(results["none"])
    clock_note = "; per second of the process's CPU time" if cpu else ""
    print(
        f"normalisation, B={B} L={L} C={C} stride 1, 2 x {NORM_ROWS:,}-row partitions, {rounds} alternating rounds "
        f"of one epoch each (median, range{clock_note}); load {os.getloadavg()[0]:.2f}"
    )
    for name, rates in results.items():
        print(
            f"  {name:<34} {np.median(rates):>11,.0f} windows/s  [{min(rates):,.0f}-{max(rates):,.0f}]  "
            f"{np.median(rates) / none:5.2f}x of none"
        )
    print(
        f"  sample now / sample 0.1: {np.median(results['sample, vectorised (now)']) / np.median(results['sample, 0.1 formula']):.2f}x"
        f" (goal >= 2); global now / none: {np.median(results['global, once per partition (now)']) / none:.2f} (goal >= 0.95)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=4, help="1M-row partitions of the small dataset")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_bench"))
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--crc-only", action="store_true", help="only the page checksum on/off figures")
    parser.add_argument(
        "--only",
        choices=["all", "normalisation", "workers", "pieces", "pool", "first"],
        default="all",
        help="which figures",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (first)")
    parser.add_argument("--pieces-child", help=argparse.SUPPRESS)
    parser.add_argument("--first-child", help=argparse.SUPPRESS)
    parser.add_argument("--scan-child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=ROWS, help="--only first: rows per file")
    parser.add_argument(
        "--windows", type=int, default=0, help="--only first: steady windows/s over this many windows (0: --seconds)"
    )
    parser.add_argument(
        "--pieces-k", type=int, help="--only pieces: pieces_per_partition of 'default' (None: the default)"
    )
    parser.add_argument("--cpu", action="store_true", help="normalisation rows per second of the process's CPU time")
    args = parser.parse_args()
    if args.rss_child:
        stream_rss(args.rss_child)
        return
    if args.pieces_child:
        pieces_child(args.pieces_child)
        return
    if args.first_child:
        first_child(args.first_child)
        return
    if args.scan_child:
        scan_child(args.scan_child)
        return
    if args.only == "first":
        first_rows(args.dir, args.partitions, args.rows, args.seconds, args.rounds, args.windows)
        return
    if args.only == "pool":  # the pool order on the mixing issue's layouts (bench_mixing --pool, its defaults)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_mixing

        sys.argv = [sys.argv[0], "--pool", "--dir", os.path.join(args.dir, "pool")]
        bench_mixing.main()
        return
    if args.only == "pieces":
        torch.set_num_threads(1)
        pieces_rows(args.dir, args.partitions, args.seconds, k=args.pieces_k)
        return
    if args.crc_only:
        print_crc_rates(args.dir, args.partitions, args.seconds)
        return
    torch.set_num_threads(1)
    if args.only == "normalisation":
        norm_root = os.path.join(args.dir, "norm")
        write_dataset(norm_root, 2, rows=NORM_ROWS)
        normalisation_rows(norm_root, args.seconds, cpu=args.cpu)
        return
    small, large = os.path.join(args.dir, "x1"), os.path.join(args.dir, "x4")
    write_dataset(small, args.partitions)
    if args.only == "workers":
        workers_rows(args.dir, small, args.partitions, args.seconds)
        return
    write_dataset(large, 4 * args.partitions)
    gb = B * C * L * 4 / 1e9  # GB per batch-of-windows unit
    base = baselines(small, args.seconds)
    ours, first = loader_rate(small, args.seconds)
    print(f"B={B} L={L} C={C} stride=1 shuffled, {args.partitions} x {ROWS:,}-row Parquet partitions, 1 torch thread")
    print(
        f"WindowDataset                 {ours:12,.0f} windows/s  {ours / B * gb:6.2f} GB/s  first batch {first:.2f} s"
    )
    print(
        f"(a)  numpy gather (rows, C)   {base['a']:12,.0f} windows/s  {base['a'] / B * gb:6.2f} GB/s  (best: {base['a_variant']})"
    )
    print(f"(a') numpy gather (C, rows)   {base['a_prime']:12,.0f} windows/s  {base['a_prime'] / B * gb:6.2f} GB/s")
    print(f"(b)  tsai memmap index        {base['b']:12,.0f} windows/s  {base['b'] / B * gb:6.2f} GB/s")
    print(f"ratio vs (a)  {ours / base['a']:6.2f}x   (goal >= 0.75)")
    print(f"ratio vs (a') {ours / base['a_prime']:6.2f}x")
    print(f"ratio vs (b)  {ours / base['b']:6.2f}x   (goal >= 3)")
    for workers in (0, 1, 2):
        rate_w = loader_workers_rate(small, workers, args.seconds)
        print(f"DataLoader(num_workers={workers})  {rate_w:12,.0f} windows/s")
    r1, r4 = child_rss(small), child_rss(large)
    print(
        f"peak RSS streaming {args.partitions} partitions: {r1['peak_rss_mib']:.0f} MiB ({r1['batches']} batches); "
        f"{4 * args.partitions} partitions: {r4['peak_rss_mib']:.0f} MiB ({r4['batches']} batches); "
        f"ratio {r4['peak_rss_mib'] / r1['peak_rss_mib']:.3f} (goal <= 1.15)"
    )
    print_crc_rates(args.dir, args.partitions, args.seconds)


PIECE_ROWS = 1_000_000  # rows per file of the pieces comparison (8 row groups each)
PIECE_CPU: list[float] = []  # windows per CPU second of each pieces_stream call, in order
PIECE_STEADY: list[float] = []  # windows/s of each call without its epochs' waits for their first batch
PIECE_CASES = ((32, 8, 64), (32, 8, 256), (64, 16, 128), (512, 1, 256))  # (L, stride, B)


def write_series(root: str, partitions: int, seed: int = 0) -> None:
    """One long random-walk series cut into files in time order, 8 row groups each."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for p in range(partitions):
        path = os.path.join(root, f"part-{p:05d}.parquet")
        if os.path.exists(path):
            continue
        cols = {f"f{c}": np.cumsum(rng.standard_normal(PIECE_ROWS), dtype=np.float32) for c in range(C)}
        pq.write_table(pa.table(cols), path, row_group_size=PIECE_ROWS // 8)


def pieces_dataset(root: str, case: tuple, ppp: int | None) -> dw.WindowDataset:
    window, stride, batch = case
    return dw.WindowDataset(
        root, features=[f"f{c}" for c in range(C)], window=window, stride=stride, batch_size=batch,
        shuffle=True, seed=0, pieces_per_partition=ppp,
    )  # fmt: skip


def row_group_reads(ds: dw.WindowDataset) -> str:
    """Units decoded in one epoch: each unit (a row group, or small ones merged; whole partitions: a partition)
    once."""
    from dask_windows.planning.world import World

    plan = ds._plan(World())
    return f"{len(plan.units)} (pool)"


def pieces_stream(
    root: str, case: tuple, ppp: int | None, seconds: float, fresh_peak: bool = False
) -> tuple[float, int]:
    """``(windows/s, pieces per partition)`` streaming epochs of ``case`` for about ``seconds``, first batch excluded
    (windows per CPU second appended to ``PIECE_CPU``; windows/s without the time from each later
    epoch's ``iter()`` to its first batch, and that batch, to ``PIECE_STEADY``: on these small
    datasets an epoch lasts 0.3-0.5 s, so the wait for its first buffer weighs more than on data
    whose epochs last minutes).

    ``fresh_peak``: reset the process's peak RSS after opening (the scan at open reads every file
    once, whatever the order), so that the peak is the stream's.
    """
    batch = case[2]
    ds = pieces_dataset(root, case, ppp)
    if fresh_peak:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: VmHWM := VmRSS
    it = iter(ds)
    next(it)
    n, epoch, t0, c0 = 0, 0, time.perf_counter(), time.process_time()
    firsts, startup = 0, 0.0  # later epochs' first batches, and the time from iter() to each
    while time.perf_counter() - t0 < seconds:
        for _ in it:
            n += 1
            if time.perf_counter() - t0 > seconds:
                break
        else:
            epoch += 1
            ds.set_epoch(epoch)
            began = time.perf_counter()
            it = iter(ds)
            if next(it, None) is not None:  # each epoch's wait for its first buffer, timed apart
                n, firsts = n + 1, firsts + 1
            startup += time.perf_counter() - began
    elapsed = time.perf_counter() - t0
    PIECE_CPU.append(n * batch / (time.process_time() - c0))  # windows per CPU second, both threads
    PIECE_STEADY.append((n - firsts) * batch / max(elapsed - startup, 1e-9))
    return n * batch / elapsed, ds.spec.pieces_per_partition


def pieces_child(arg: str) -> None:
    """Child mode: stream ``case`` for the seconds given, print the stream's peak RSS in MiB as JSON."""
    root, window, stride, batch, ppp, seconds = arg.split(",")
    case = (int(window), int(stride), int(batch))
    rate_, _ = pieces_stream(root, case, None if ppp == "default" else int(ppp), float(seconds), fresh_peak=True)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    print(json.dumps({"rate": rate_, "peak_rss_mib": peak}))


def pieces_rows(directory: str, partitions: int, seconds: float, rounds: int = 2, k: int | None = None) -> None:
    """Default piece order (or ``pieces_per_partition=k``) against ``pieces_per_partition=1`` (the 0.1
    order), same run, alternating."""
    root = os.path.join(directory, f"series{partitions}x{PIECE_ROWS}")
    write_series(root, partitions)
    print(
        f"pieces: one series, {partitions} x {PIECE_ROWS:,}-row Parquet files of 8 row groups, C={C}, shuffled, "
        f"{rounds} alternating rounds of {seconds:.0f} s (best); load {os.getloadavg()[0]:.2f}"
    )
    for case in PIECE_CASES:
        rates: dict[str, list[float]] = {"default": [], "1": []}
        cpu: dict[str, list[float]] = {"default": [], "1": []}
        steady: dict[str, list[float]] = {"default": [], "1": []}
        ppp = 1
        for _ in range(rounds):
            for mode in rates:
                value, used = pieces_stream(root, case, k if mode == "default" else 1, seconds)
                rates[mode].append(value)
                cpu[mode].append(PIECE_CPU[-1])
                steady[mode].append(PIECE_STEADY[-1])
                ppp = used if mode == "default" else ppp
        rss = {}
        for mode in rates:
            arg = ",".join(map(str, (root, *case, k if mode == "default" and k else mode, seconds)))
            out = subprocess.run(
                [sys.executable, __file__, "--pieces-child", arg], capture_output=True, text=True, check=True
            )
            rss[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]
        best = {mode: max(r) for mode, r in rates.items()}
        reads = {mode: row_group_reads(pieces_dataset(root, case, k if mode == "default" else 1)) for mode in rates}
        print(
            f"  L={case[0]:<3} stride {case[1]:<2} B={case[2]:<3} default (k={ppp:<3}) {best['default']:>10,.0f} windows/s "
            f"{rss['default']:4.0f} MiB | k=1 {best['1']:>10,.0f} windows/s {rss['1']:4.0f} MiB | "
            f"ratio {best['default'] / best['1']:.2f}x (goal >= 0.8), per CPU second "
            f"{max(cpu['default']) / max(cpu['1']):.2f}x  RSS {rss['default'] / rss['1']:.3f}x (goal <= 1)  "
            f"row groups decoded/epoch {reads['default']} vs {reads['1']}; "
            f"after each epoch's first batch {max(steady['default']) / max(steady['1']):.2f}x"
        )
    print(f"  load after: {os.getloadavg()[0]:.2f}")


def write_crc_dataset(root: str, partitions: int, seed: int = 0) -> None:
    """The rows of ``write_dataset``, written with page CRCs (as ``dask-windows convert`` writes)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for p in range(partitions):
        path = os.path.join(root, f"part-{p:05d}.parquet")
        if os.path.exists(path):
            continue
        cols = {f"f{c}": rng.standard_normal(ROWS, dtype=np.float32) for c in range(C)}
        cols["sid"] = np.repeat(np.arange(p * 10, p * 10 + 10), ROWS // 10)
        pq.write_table(pa.table(cols), path, row_group_size=250_000, write_page_checksum=True)


def crc_rates(root: str, verify: bool, seconds: float) -> tuple[float, float, float]:
    """``(MB/s of partition reads, loader windows/s after the first batch, first batch s)``, CRCs on or off."""
    features = [f"f{c}" for c in range(C)]
    ds = dw.WindowDataset(root, features=features, series="sid", window=L, batch_size=B, shuffle=True, seed=0)
    ds.source.verify_checksums = verify
    nbytes, n, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2 or n == 0:
        columns = ds.source.read(n % len(ds.partitions), features)
        nbytes += sum(v.nbytes for v in columns.values())
        n += 1
    read = nbytes / 1e6 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    it = iter(ds)
    next(it)  # reads the first buffer's partitions
    first = time.perf_counter() - t0
    k, t0 = 0, time.perf_counter()
    for _ in it:
        k += 1
        if time.perf_counter() - t0 > seconds / 2:
            break
    return read, k * B / (time.perf_counter() - t0), first


def print_crc_rates(directory: str, partitions: int, seconds: float) -> None:
    root = os.path.join(directory, "crc")
    write_crc_dataset(root, min(partitions, 2))
    off = crc_rates(root, False, seconds)
    on = crc_rates(root, True, seconds)
    off2 = crc_rates(root, False, seconds)  # measured again: the spread of the figures
    for label, r in (("off", off), ("on ", on), ("off", off2)):
        print(
            f"page CRC verification {label}: partition reads {r[0]:7,.0f} MB/s  loader {r[1]:10,.0f} windows/s"
            f"  first batch {r[2]:.2f} s"
        )
    best = [max(a, b) for a, b in zip(off, off2)]
    # An epoch reads each 1M-row partition once and yields about 1M windows from it; the CRC is
    # checked in the read only, so the epoch's throughput ratio is that of (read + yield) times,
    # with the yield time of the faster measurement on both sides (the gather does not change).
    yield_s = ROWS / max(best[1], on[1])
    epoch_off = ROWS * C * 4 / 1e6 / best[0] + yield_s
    epoch_on = ROWS * C * 4 / 1e6 / on[0] + yield_s
    print(
        f"ratio on/off: partition reads {on[0] / best[0]:.3f}x  loader after the first batch {on[1] / best[1]:.3f}x "
        f"(noise: the gather never touches a CRC)  epoch throughput (read + yield) {epoch_off / epoch_on:.3f}x "
        "(goal >= 0.95)"
    )


if __name__ == "__main__":
    main()
