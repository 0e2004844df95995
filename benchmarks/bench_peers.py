"""dask_windows against the loop a user writes by hand, tsai where it imports, and a memcpy.

Run from the repository root (the defaults take about 1-2 minutes on 2 cores)::

    PYTHONPATH=. python benchmarks/bench_peers.py
    PYTHONPATH=. python benchmarks/bench_peers.py --files 16 --rows 1000000 --seconds 5 --rounds 3
    PYTHONPATH=. python benchmarks/bench_peers.py --files 4 --rows 1000000 --windows 2000000 --rounds 3
    PYTHONPATH=. python benchmarks/bench_peers.py --files 4 --rows 1000000 --breakdown

The same Parquet files (``--files`` x ``--rows`` rows, ``--series`` series laid
end to end, 4 float32 features) are read by:

* ``dw``: ``WindowDataset`` iterated in the main process (``num_workers=0``);
* ``hand``: the hand-written loop over a Dask DataFrame's partitions: compute a
  partition, ``sliding_window_view(x, L, axis=0)[starts]`` over the window
  starts of each series in it, shuffled, cut into batches of ``B`` (the ~30
  lines in ``hand_loop`` below) - the baseline; its ``(B, C, L)`` batches are a
  transposed view of ``(B, L, C)`` memory (not contiguous: the model's first
  layer pays the transpose), where ``dw`` yields contiguous ``(B, C, L)``;
* ``dwp``: ``dw`` with ``buffer_bytes`` of one file's rows, the memory the hand loop shuffles in
  (not run unless named): the default mixes across 8x that memory, and its random windows pay in
  cache misses what this row does not;
* ``dwn``: ``dw`` with no lanes (``DASK_WINDOWS_LANES=0``), ``dw2`` with lanes at every batch size
  (``=1``; by default only batches of 1 MiB and more go on two lanes); not run unless named;
* ``dw1``: ``dw`` with one torch intra-op thread (not run unless named in
  ``--contenders``): ``dwn``'s path, since lanes need torch allowed more than one thread;
* ``handc``: the same loop with ``.contiguous()`` on each batch, the layout dw yields;
* ``tsai``: tsai's ``TSUnwindowedDataset`` over the same rows as one array,
  where tsai imports (it needs fastai; otherwise the row says why);
* ``memcpy``: copying the same bytes per batch from a large array (the ceiling).

Each runs in its own process with torch's default intra-op threads
(``--torch-threads`` sets them), the contenders alternate in ``--rounds``
rounds, and the figures are medians with their range; a ratio is the median
over rounds of the two contenders' figures in the same round. Cases: stride 1 at B=256 L=512
C=4 and at B=64 L=128, and stride = window (B=256 L=512). Per case it prints
windows/s, time to first batch (from opening the data), CPU time per batch
(every thread of the contender's process: on a shared machine the steadier
figure), and the ratios dw / hand, dw / memcpy and first batch hand / dw; a
warning if the contenders' batches differ in shape or bytes.

``--windows N`` measures N windows (or to the end of the epoch) instead of
``--seconds``: a few seconds may hold dw's next buffer being built and none of
the hand loop's partition reads (or the reverse), so only equal windows read
compare reads as well as gathers. ``--breakdown`` only profiles dw's main
thread per batch (its CPU clock; gather, wrapping into tensors, the loop and
its generators, Python calls per batch).
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
C = 4
FEATURES = [f"f{c}" for c in range(C)]
CASES = [  # (name, B, L, stride or None for stride = window)
    ("stride 1, B=256 L=512", 256, 512, 1),
    ("stride 1, B=64 L=128", 64, 128, 1),
    ("stride = window, B=256 L=512", 256, 512, None),
]


def write_files(root: str, files: int, rows: int, series: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_series = max(1, files * rows // series)
    for f in range(files):
        path = os.path.join(root, f"part-{f:05d}.parquet")
        if os.path.exists(path):
            continue
        rows_here = np.arange(f * rows, (f + 1) * rows)
        columns = {"sid": (rows_here // per_series).astype(np.int64)}
        columns.update({name: rng.standard_normal(rows, dtype=np.float32) for name in FEATURES})
        pq.write_table(pa.table(columns), path, row_group_size=min(rows, 250_000))


def hand_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """The loop by hand: one Dask partition at a time, every window of each series, shuffled."""
    import dask.dataframe as dd

    yield from hand_batches(dd.read_parquet(root, columns=["sid", *FEATURES]), FEATURES, batch, window, stride, seed)


def hand_batches(frame, features: list, batch: int, window: int, stride: int, seed: int = 0):
    """``hand_loop``'s batches from an opened Dask DataFrame (``bench_loader --only first`` times the open apart)."""
    import torch
    from numpy.lib.stride_tricks import sliding_window_view

    rng = np.random.default_rng(seed)
    for p in rng.permutation(frame.npartitions):
        part = frame.get_partition(int(p)).compute()
        x = part[features].to_numpy(np.float32)  # (rows, C)
        sid = part["sid"].to_numpy()
        bounds = np.flatnonzero(np.diff(sid)) + 1
        edges = np.concatenate([[0], bounds, [len(sid)]])
        starts = np.concatenate(
            [np.arange(a, b - window + 1, stride) for a, b in zip(edges[:-1], edges[1:]) if b - a >= window]
        )
        rng.shuffle(starts)
        view = sliding_window_view(x, window, axis=0)  # (rows - L + 1, C, L)
        for lo in range(0, len(starts), batch):
            yield torch.from_numpy(view[starts[lo : lo + batch]])


def handc_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """``hand`` made to yield what dw yields: C-contiguous ``(B, C, L)`` batches.

    ``sliding_window_view(x, L, axis=0)[starts]`` on row-major rows is a ``(B, C, L)`` array laid out
    as ``(B, L, C)`` (the channel axis is the fast one); a Conv1d or a transformer's linear layer makes
    it contiguous before using it, so this row is the hand loop doing the same work as dw.
    """
    for x in hand_loop(root, batch, window, stride, seed):
        yield x.contiguous()


def tsai_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """tsai's TSUnwindowedDataset over all rows as one (rows, C) array, shuffled batches."""
    import pyarrow.parquet as pq
    import torch
    from tsai.data.unwindowed import TSUnwindowedDataset  # needs fastai

    table = pq.read_table(root, columns=FEATURES)
    x = np.stack([table.column(c).to_numpy() for c in FEATURES], axis=1)
    ds = TSUnwindowedDataset(x, window_size=window, stride=stride, seq_first=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds))
    for lo in range(0, len(order), batch):
        out = ds[order[lo : lo + batch]]
        yield out[0] if isinstance(out, tuple) else torch.as_tensor(out)


def dw_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    import dask_windows as dw

    ds = dw.WindowDataset(
        root, features=FEATURES, series="sid", window=window, stride=stride, batch_size=batch, seed=seed
    )
    yield from ds


def dwp_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """``dw`` mixing within the memory the hand loop holds: ``buffer_bytes`` of one file's decoded rows.

    The hand loop shuffles the windows of one file at a time; ``dw`` by default mixes every file its
    1 GiB budget holds (here all of them), so its random windows range over 8x the memory, which
    costs a gather in cache misses. This row separates that price of mixing from the runtime's own.
    """
    import dask_windows as dw

    name = sorted(f for f in os.listdir(root) if f.endswith(".parquet"))[0]
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
    ds = dw.WindowDataset(
        root,
        features=FEATURES,
        series="sid",
        window=window,
        stride=stride,
        batch_size=batch,
        seed=seed,
        buffer_bytes=rows * (C + 2) * 4,
    )
    yield from ds


def dw1_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """``dw`` with one torch intra-op thread (``torch.set_num_threads(1)``): what the threads add."""
    import torch

    torch.set_num_threads(1)
    yield from dw_loop(root, batch, window, stride, seed)


def dw2_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """``dw`` with two lanes at every batch size (``DASK_WINDOWS_LANES=1``; by default from 1 MiB)."""
    os.environ["DASK_WINDOWS_LANES"] = "1"  # this child process only
    yield from dw_loop(root, batch, window, stride, seed)


def dwn_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """``dw`` with no lanes (``DASK_WINDOWS_LANES=0``): one copying thread, what they add by default."""
    os.environ["DASK_WINDOWS_LANES"] = "0"  # this child process only
    yield from dw_loop(root, batch, window, stride, seed)


def memcpy_loop(root: str, batch: int, window: int, stride: int, seed: int = 0):
    """Copies of ``B * C * L`` float32 values from a 256 MiB array (beyond the caches)."""
    import torch

    n = batch * C * window
    source = np.random.default_rng(seed).standard_normal(max(n * 4, 64 * 2**20), dtype=np.float32)
    offsets = np.arange(0, len(source) - n + 1, n)
    k = 0
    while True:
        out = np.empty(n, np.float32)
        np.copyto(out, source[offsets[k % len(offsets)] : offsets[k % len(offsets)] + n])
        k += 1
        yield torch.from_numpy(out.reshape(batch, C, window))


LOOPS = {
    "dw": dw_loop,
    "dwp": dwp_loop,
    "dw1": dw1_loop,
    "dw2": dw2_loop,
    "dwn": dwn_loop,
    "hand": hand_loop,
    "handc": handc_loop,
    "tsai": tsai_loop,
    "memcpy": memcpy_loop,
}


def child(args: argparse.Namespace) -> None:
    """Measure one contender: time to first batch, then windows/s for ``--seconds`` (or to the end)."""
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    stride = args.stride or args.window
    began = time.perf_counter()
    try:
        batches = LOOPS[args.child](args.root, args.batch, args.window, stride)
        first = next(batches)
    except ImportError as exc:
        print(json.dumps({"error": f"not importable: {exc}"}))
        return
    first_s = time.perf_counter() - began
    windows, count, start, cpu = 0, 0, time.perf_counter(), time.process_time()
    for x in batches:
        windows += len(x)
        count += 1
        if windows >= args.windows if args.windows else time.perf_counter() - start > args.seconds:
            break
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu  # every thread of the process: reads, builds, torch's threads
    print(
        json.dumps(
            {
                "first_s": first_s,
                "rate": windows / seconds if seconds else 0.0,
                "cpu_us": 1e6 * cpu / max(count, 1),  # CPU time per batch, all threads
                "shape": list(first.shape),
                "nbytes": first.numel() * first.element_size(),
                "contiguous": first.is_contiguous(),
            }
        )
    )


def breakdown(root: str, batch: int, window: int, stride: int, batches: int = 2000) -> str:
    """Where ``dw``'s main thread spends each batch (microseconds of its CPU time), by cProfile.

    Counted with the main thread's CPU clock, so a descheduled thread on a busy machine does not
    inflate it; profiling itself adds roughly a microsecond per Python call, which the call count shows
    (a generator's resumption counts as a call).
    """
    import cProfile
    import itertools
    import pstats

    stream = dw_loop(root, batch, window, stride)
    for _ in itertools.islice(stream, 200):  # past the first buffer's head and the path's first round
        pass
    wall, own, cpu = time.perf_counter(), time.thread_time(), time.process_time()
    timed = max(sum(1 for _ in itertools.islice(stream, batches)), 1)
    wall, own = (time.perf_counter() - wall) / timed * 1e6, (time.thread_time() - own) / timed * 1e6
    cpu = (time.process_time() - cpu) / timed * 1e6
    profile = cProfile.Profile(time.thread_time)
    stream = dw_loop(root, batch, window, stride)  # a second pass, profiled past its first batches
    for _ in itertools.islice(stream, 200):
        pass
    batches = profile.runcall(lambda: sum(1 for _ in itertools.islice(stream, batches)))
    if not batches:
        return f"{wall:.1f} us/batch wall, main thread {own:.1f} us CPU (all threads {cpu:.1f}); too few batches to profile"
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive, tottime, cumtime, callers)}
    total = sum(entry[2] for entry in stats.values()) / batches * 1e6
    calls = sum(entry[1] for entry in stats.values()) / batches

    def cumulative(name: str, caller: str | None = None) -> float:
        """Microseconds per batch in ``name`` and what it calls (only its calls from ``caller``)."""
        seconds = 0.0
        for (_, _, fn), (_, _, _, cum, callers) in stats.items():
            if fn == name:
                seconds += cum if caller is None else sum(c[3] for k, c in callers.items() if k[2] == caller)
        return seconds / batches * 1e6

    # The gather as the stream calls it: a run's generator of features-only batches, or per batch
    # numpy's run gather (``_Runs.__call__``), ``Gatherer.features`` or a bound gather.
    gather = sum(cumulative(name, "stream") for name in ("gather_run", "__call__", "features", "<lambda>"))
    emit = cumulative("_emit") + cumulative("emit")  # the batch output (``seams.TorchOutput.emit``; ``_emit`` before)
    return (
        f"{wall:.1f} us/batch wall, main thread {own:.1f} us CPU (all threads {cpu:.1f}); profiled: "
        f"gather {gather:.1f}, wrapping {emit:.1f}, loop and generators {total - gather - emit:.1f} "
        f"({calls:.1f} Python calls per batch)"
    )


def measure(
    name: str,
    root: str,
    batch: int,
    window: int,
    stride: int | None,
    seconds: float,
    torch_threads: int = 0,
    windows: int = 0,
) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--root",
        root,
        "--batch",
        str(batch),
        "--window",
        str(window),
        "--stride",
        str(stride or 0),
        "--seconds",
        str(seconds),
        "--windows",
        str(windows),
        "--torch-threads",
        str(torch_threads),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(lines[-1])


def _load() -> list[str]:
    """The 1, 5 and 15 minute load averages."""
    with open("/proc/loadavg") as src:
        return src.read().split()[:3]


def _ratios(mine: list[dict], base: list[dict], key: str) -> str:
    """Median and range over rounds of ``mine[key] / base[key]`` (a round's two runs are neighbours in time)."""
    values = [a[key] / b[key] for a, b in zip(mine, base) if "error" not in a and "error" not in b and b[key]]
    if not values:
        return "n/a"
    median, low, high = summary(values)
    return f"{median:.2f}x [{low:.2f} - {high:.2f}]"


def base_first(results: dict, mine: str) -> str:
    """Time to first batch, hand / ``mine`` (above 1: ``mine`` is first)."""
    return f"hand / {mine} {_ratios(results['hand'], results[mine], 'first_s')}"


def summary(values: list[float]) -> tuple[float, float, float]:
    return float(np.median(values)), float(min(values)), float(max(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows", type=int, default=500_000, help="rows per file")
    parser.add_argument("--series", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per contender and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--windows",
        type=int,
        default=0,
        help="measure this many windows (or to the end of the epoch) instead of --seconds: every contender then "
        "pays the same reads (a few seconds can hold the loader's next buffer and none of the hand loop's reads)",
    )
    parser.add_argument(
        "--contenders", nargs="*", default=["dw", "hand", "handc", "tsai", "memcpy"], choices=list(LOOPS)
    )
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch.set_num_threads in every contender (0: torch's default)"
    )
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_peers"))
    parser.add_argument(
        "--breakdown", action="store_true", help="only profile dw's main thread per batch, per case, in this process"
    )
    parser.add_argument("--child", choices=list(LOOPS), help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    root = os.path.join(args.dir, f"{args.files}x{args.rows}x{args.series}")
    write_files(root, args.files, args.rows, args.series)
    load = _load()
    if args.breakdown:
        print(f"dw per batch, main thread (load average {' '.join(load)}):")
        for case, batch, window, stride in CASES[:2]:  # stride = window has too few batches to profile
            print(f"  {case}: {breakdown(root, batch, window, stride)}")
        return
    print(
        f"{args.files} files x {args.rows:,} rows, {args.series} series, C={C} float32; {args.rounds} alternating "
        f"rounds of {f'{args.windows:,} windows' if args.windows else f'{args.seconds:.0f} s'} per contender, "
        "each in its own process, torch threads "
        f"{args.torch_threads or 'default'} (of {os.cpu_count()} CPUs); "
        f"load average {' '.join(load)}"
    )
    for case, batch, window, stride in CASES:
        results: dict[str, list[dict]] = {name: [] for name in args.contenders}
        for _ in range(args.rounds):
            for name in args.contenders:
                results[name].append(
                    measure(name, root, batch, window, stride, args.seconds, args.torch_threads, args.windows)
                )
        print(f"\n{case}")
        print(f"  {'':<8}{'windows/s (median, range)':>38}{'first batch s':>24}{'CPU us/batch':>16}")
        medians = {}
        sizes = set()
        for name, runs in results.items():
            ok = [r for r in runs if "error" not in r]
            if not ok:
                print(f"  {name:<8}{runs[0]['error'][:90]}")
                continue
            rate, first = summary([r["rate"] for r in ok]), summary([r["first_s"] for r in ok])
            cpu = summary([r.get("cpu_us", 0.0) for r in ok])
            medians[name] = (rate[0], first[0])
            sizes.add((tuple(ok[0]["shape"]), ok[0].get("nbytes")))
            print(
                f"  {name:<8}{rate[0]:>14,.0f}  [{rate[1]:>10,.0f} - {rate[2]:>10,.0f}]"
                f"{first[0]:>10.2f}  [{first[1]:.2f} - {first[2]:.2f}]{cpu[0]:>10,.0f}"
                + ("" if ok[0].get("contiguous", True) else "  (batches not contiguous)")
            )
        if len(sizes) > 1:  # every contender must produce the same batches' bytes for the ratios to mean anything
            print(f"  WARNING: contenders' batches differ: {sorted(sizes)}")
        for mine in ("dw", "dw1"):
            for base in ("hand", "handc", "memcpy", "tsai"):
                if mine in medians and base in medians:
                    print(f"  {mine} / {base} windows/s {_ratios(results[mine], results[base], 'rate')}")
            if mine in medians and "hand" in medians:
                print(f"  first batch {base_first(results, mine)}")
    print(f"\nload average at the end {' '.join(_load())}")


if __name__ == "__main__":
    main()
