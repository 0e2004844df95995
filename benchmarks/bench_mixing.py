"""How batches mix on raw layouts: the 0.1 order, the new default and a global shuffle.

Builds three raw Parquet layouts (files of ``--row-groups`` row groups, in row order):

  long    one long non-stationary series (its regime drifts with time) in time order;
  random  many series, each its own regime, ids unrelated to the regime;
  sorted  the same series with ids ordered by regime;

and prints, per layout, the mixing statistics of ``dask_windows.planning.mixing`` (distinct row blocks
per batch of 100, TV distance of a batch's block histogram from the dataset's, lag-1
correlation of consecutive batches' mean block, effective batch size) for
``pieces_per_partition=1`` (the 0.1 order: buffers of ``buffer_partitions`` whole partitions),
the new default and a global permutation, with windows/s and peak RSS of one epoch through the
loader (a child process each). Then a training comparison: a small MLP forecasting the next value
from a window, the same steps, fed the loader's batches in each order (their rows gathered from
memory, so only the order differs) and held-out MSE on a fresh realisation of the layout at
several checkpoints, as a ratio to the global shuffle's. Seeds are paired: seed ``s`` fixes the
model's initialisation, the loader's ``seed=`` and the global permutation, and the mean per-seed
ratio is printed with its standard error (``global'``, another permutation, is the noise floor).
``--loader`` runs bench_loader's configuration (B=256, L=512, C=4, 1M-row partitions) for both
orders in alternation: windows/s and peak RSS ratios. ``--frontier`` prints the knob's frontier
on the issue's layout (4M rows of one series in 32 files of 8 row groups): for each
``pieces_per_partition`` the mixing statistics beside the object GETs and bytes of one epoch read
from S3 (moto's server on 127.0.0.1, through s3fs and a counting proxy), relative to K=1, and the
plain (unstratified) piece order for comparison.

Converted data (``dask-windows convert``) is in bench_converted.py.

    python benchmarks/bench_mixing.py [--rows 1000000] [--steps 1500] [--seeds 3] [--loader]
    python benchmarks/bench_mixing.py --train-only --seeds 30 --orders default "global'" [--pieces K]
    python benchmarks/bench_mixing.py --seeds 0 --frontier
    python benchmarks/bench_mixing.py --pool [--pool-rows 4000] [--pool-windows 200000]

``--pool`` prints the default pool order on the mixing issue's layouts (one long series in 128 and
1,024 files of one row group and in 512 files of 8): its mixing statistics beside a global
permutation's, row groups decoded per row group in one epoch, windows/s at stride 16 (a whole
epoch) and stride 1 (after the first batch), wall clock and per CPU second, as ratios to whole
partitions in a random order (``pieces_per_partition=1``) measured in the same run, and peak RSS;
at the default budget and at one holding about ``--pool-units`` x B units.
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
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dask_windows as dw
import dask_windows.planning.plan as plan_module
from dask_windows.planning.mixing import block_histogram, global_shuffle_statistics, mixing_report, plan_batches

LAYOUTS = ("long", "random", "sorted")


def make_layout(kind: str, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, series id)`` of ``rows`` rows laid out as ``kind``."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows, dtype=np.float64)
    if kind == "long":
        drift = np.cumsum(rng.standard_normal(rows // 1000 + 2))[t.astype(np.int64) // 1000]  # slow regime
        level = 2.0 * np.tanh(drift / 8)
        period = 12 + 10 * (1 + np.sin(2 * np.pi * t / rows * 3))  # the oscillation changes over time
        x = level + np.sin(np.cumsum(2 * np.pi / period)) + 0.2 * rng.standard_normal(rows)
        return x.astype(np.float32), np.zeros(rows, np.int64)
    num = 200
    lengths = np.full(num, rows // num)
    lengths[-1] += rows - lengths.sum()
    regime = rng.uniform(-1, 1, num)  # each series' behaviour
    ids = rng.permutation(num) if kind == "random" else np.argsort(np.argsort(regime))
    order = np.argsort(ids)  # files hold series in id order
    parts = []
    for s in order:
        n = lengths[s]
        tt = np.arange(n)
        period = 16 + 12 * regime[s]
        parts.append(2 * regime[s] + np.sin(2 * np.pi * tt / period + rng.uniform(0, 6)) + 0.2 * rng.standard_normal(n))
    sid = np.repeat(ids[order], lengths[order])
    return np.concatenate(parts).astype(np.float32), sid


def write_layout(root: str, x: np.ndarray, sid: np.ndarray, files: int, row_groups: int) -> None:
    os.makedirs(root, exist_ok=True)
    per = len(x) // files
    for f in range(files):
        a, b = f * per, len(x) if f == files - 1 else (f + 1) * per
        table = pa.table({"sid": sid[a:b], "x": x[a:b]})
        pq.write_table(table, os.path.join(root, f"part-{f:03d}.parquet"), row_group_size=-(-(b - a) // row_groups))


def open_ds(root: str, args: argparse.Namespace, pieces: int | None, seed: int = 0) -> dw.WindowDataset:
    return dw.WindowDataset(
        root,
        features=["x"],
        targets=["x"],
        series="sid",
        window=args.window,
        horizon=1,
        stride=args.stride,
        batch_size=args.batch_size,
        pieces_per_partition=pieces,
        return_index=True,
        seed=seed,
    )


def epoch_child(root: str, args: argparse.Namespace, pieces: int | None) -> dict:
    """Windows/s and peak RSS of one epoch through the loader, in a fresh process."""
    code = (
        "import sys, time, json; sys.path.insert(0, sys.argv[1]); import torch; torch.set_num_threads(1)\n"
        "import dask_windows as dw\n"
        "a = json.loads(sys.argv[2])\n"
        "ds = dw.WindowDataset(a['root'], features=['x'], targets=['x'], series='sid', window=a['window'], horizon=1,\n"
        "    stride=a['stride'], batch_size=a['batch_size'], pieces_per_partition=a['pieces'], **a.get('extra', {}))\n"
        "t0 = time.perf_counter(); n = sum(len(b[0]) for b in ds); dt = time.perf_counter() - t0\n"
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "print(json.dumps({'rate': n / dt, 'rss_mib': hwm / 1024}))\n"
    )
    spec = {"root": root, "window": args.window, "stride": args.stride, "batch_size": args.batch_size, "pieces": pieces}
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = subprocess.run(
        [sys.executable, "-c", code, repo, json.dumps(spec)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def order_rows(ds: dw.WindowDataset, kind: str, epochs: int, seed: int) -> list[np.ndarray]:
    """Batches (global start rows) of ``epochs`` epochs in the loader's order or a global permutation."""
    out = []
    for epoch in range(epochs):
        batches = list(plan_batches(ds, epoch=epoch))
        if kind == "global":
            rows = np.concatenate(batches)
            rows = rows[np.random.default_rng([seed, epoch]).permutation(len(rows))]
            b = ds.spec.batch_size
            batches = [rows[i : i + b] for i in range(0, len(rows), b)]
        out += [b for b in batches if len(b) == ds.spec.batch_size]
    return out


def train(
    x: np.ndarray, batches: list[np.ndarray], held: tuple, args: argparse.Namespace, seed: int, checkpoints: list[int]
) -> list[float]:
    """Held-out MSE of a small MLP after each checkpoint's steps on ``batches`` (cycled)."""
    import torch

    torch.manual_seed(seed)
    window = args.window
    model = torch.nn.Sequential(torch.nn.Linear(window, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xt = torch.from_numpy(x)
    offsets = torch.arange(window)
    hx, hy = held
    losses = []
    for step in range(1, checkpoints[-1] + 1):
        rows = torch.from_numpy(batches[(step - 1) % len(batches)])
        inputs = xt[rows[:, None] + offsets]
        target = xt[rows + window][:, None]
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in checkpoints:
            with torch.no_grad():
                losses.append(float(torch.nn.functional.mse_loss(model(hx), hy)))
    return losses


def held_out(kind: str, args: argparse.Namespace) -> tuple:
    """4096 random windows of a fresh realisation of the layout (another seed), same series rule."""
    import torch

    x, sid = make_layout(kind, args.rows // 4, seed=10_000 + LAYOUTS.index(kind))
    rng = np.random.default_rng(1)
    starts = rng.integers(0, len(x) - args.window - 1, 20_000)
    ok = sid[starts] == sid[starts + args.window]  # inside one series
    starts = starts[ok][:4096]
    xt = torch.from_numpy(x)
    return xt[torch.from_numpy(starts)[:, None] + torch.arange(args.window)], xt[
        torch.from_numpy(starts) + args.window
    ][:, None]


def fmt(name: str, s: dict, extra: str = "") -> str:
    return (
        f"  {name:<28}{s['distinct_blocks']:>9.1f}{s['tv_distance']:>8.3f}{s['lag1']:>8.2f}"
        f"{s['effective_batch_size']:>9.1f}{extra}"
    )


def loader_check(args: argparse.Namespace) -> None:
    """bench_loader's configuration, both orders in alternation: windows/s and peak RSS."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_loader as bl

    root = os.path.join(args.dir, "loader")
    bl.write_dataset(root, args.loader_partitions)
    code = (
        "import sys, time, json; sys.path.insert(0, sys.argv[1]); import torch; torch.set_num_threads(1)\n"
        "import dask_windows as dw\n"
        "k = json.loads(sys.argv[3])\n"
        "ds = dw.WindowDataset(sys.argv[2], features=['f0','f1','f2','f3'], series='sid', window=512, batch_size=256,\n"
        "    pieces_per_partition=k)\n"
        "c0 = time.process_time(); it = iter(ds); next(it); t0 = time.perf_counter(); n = 0\n"
        "for b in it: n += len(b)\n"
        "dt = time.perf_counter() - t0; cpu = time.process_time() - c0\n"
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "print(json.dumps({'rate': n / dt, 'cpu': cpu, 'rss_mib': hwm / 1024, 'k': ds.spec.pieces_per_partition}))\n"
    )
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    results: dict = {"1": [], "null": []}
    for _ in range(args.loader_repeats):
        for k in ("1", "null"):
            out = subprocess.run(
                [sys.executable, "-c", code, repo, root, k], capture_output=True, text=True, check=True
            )
            results[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
    old, new = results["1"], results["null"]
    rate = np.median([r["rate"] for r in new]) / np.median([r["rate"] for r in old])
    rss = max(r["rss_mib"] for r in new) / max(r["rss_mib"] for r in old)
    print(
        f"\nbench_loader configuration (B=256 L=512 C=4 stride 1, {args.loader_partitions} x 1M-row partitions, "
        f"one full epoch each, {args.loader_repeats} alternating runs):"
    )
    print(
        f"  pieces_per_partition=1     {np.median([r['rate'] for r in old]):>12,.0f} windows/s  "
        f"peak RSS {max(r['rss_mib'] for r in old):6.0f} MiB"
    )
    print(
        f"  default (k={new[0]['k']:<4})           {np.median([r['rate'] for r in new]):>12,.0f} windows/s  "
        f"peak RSS {max(r['rss_mib'] for r in new):6.0f} MiB"
    )
    cpu = np.median([r["cpu"] for r in new]) / np.median([r["cpu"] for r in old])
    print(
        f"  ratios new/old: throughput {rate:.2f}x (goal >= 0.8), CPU seconds per epoch {cpu:.2f}x "
        f"(less sensitive to a loaded machine), peak RSS {rss:.2f}x (goal <= 1.0)"
    )


def training_comparison(kind: str, root: str, x: np.ndarray, args: argparse.Namespace, checkpoints: list[int]) -> None:
    """Held-out MSE of each order over the global shuffle's, paired by seed.

    Seed ``s`` fixes the model's initialisation, the loader's seed (``seed=s``: its piece order and
    buffer shuffles) and the global permutation's, so the orders of one seed differ only in the
    loader. Printed: the ratio of the seeds' mean MSEs, and the mean and standard error of the
    per-seed ratios (``global'``, another permutation per seed, is the noise floor).
    """
    held = held_out(kind, args)
    ratios: dict = {"0.1": [], "default": [], "global'": []}
    means: dict = {name: [] for name in ("0.1", "default", "global", "global'")}
    for seed in range(args.seeds):
        old, new = open_ds(root, args, 1, seed), open_ds(root, args, args.pieces, seed)
        epochs = -(-args.steps // max(len(new), 1))
        runs = {}
        for name, d, how, perm in (
            ("0.1", old, "loader", seed),
            ("default", new, "loader", seed),
            ("global", new, "global", seed),
            ("global'", new, "global", seed + 1000),
        ):
            if name in args.orders or name == "global":
                runs[name] = np.array(train(x, order_rows(d, how, epochs, perm), held, args, seed, checkpoints))
                means[name].append(runs[name])
        for name in runs:
            if name != "global":
                ratios[name].append(runs[name] / runs["global"])
    k = new.spec.pieces_per_partition
    print(f"  held-out MSE / global shuffle's ({args.seeds} seeds, paired; k={k}), at steps {checkpoints}:")
    glob = np.mean(means["global"], axis=0)
    for name in ratios:
        if not ratios[name]:
            continue
        r = np.array(ratios[name])  # (seeds, checkpoints)
        pooled = "  ".join(f"{v:6.3f}" for v in np.mean(means[name], axis=0) / glob)
        paired = "  ".join(
            f"{m:6.3f}+-{e:.3f}"
            for m, e in zip(r.mean(0), r.std(0, ddof=1) / np.sqrt(len(r)) if len(r) > 1 else 0 * r[0])
        )
        print(f"    {name:<10} mean MSE ratio {pooled}   per-seed ratio {paired}")
    print(f"    (global MSE: {'  '.join(f'{v:.4f}' for v in glob)}; global': another permutation, the noise)")


def _get_bytes(request: object, sizes: dict) -> int:
    """Bytes one GET asks for: its ``Range`` (``bytes=a-b`` or a suffix ``bytes=-n``), else the object."""
    value = getattr(request, "range", None)
    size = sizes.get(request.path.lstrip("/"), 0)
    if not value:
        return size
    first, _, last = value.replace("bytes=", "").partition("-")
    if not first:
        return min(int(last), size)
    return min(int(last), size - 1) - int(first) + 1


def frontier(args: argparse.Namespace) -> None:
    """The knob's frontier on the issue's layout: mixing beside S3 requests and bytes per epoch, per K."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import s3fs
    from s3proxy import S3Endpoint

    rows, files, groups = args.frontier_rows, args.frontier_files, args.row_groups
    root = os.path.join(args.dir, f"frontier-{rows}-{files}-{groups}")
    if not os.path.exists(root):
        x, sid = make_layout("long", rows, seed=0)
        write_layout(root, x, sid, files, groups)
    common = dict(features=["x"], window=64, stride=16, batch_size=128)
    print(
        f"\nfrontier: one long series, {rows:,} rows in {files} Parquet files of {groups} row groups, window 64, "
        f"stride 16, B=128, buffer_partitions=2; one epoch read from S3 (moto on 127.0.0.1 through s3fs, GETs and "
        f"bytes counted by a proxy, open excluded); load {load()}"
    )
    endpoint = S3Endpoint()
    try:
        endpoint.make_bucket("bench")
        fs = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
        sizes = {}
        for name in sorted(os.listdir(root)):
            fs.put_file(os.path.join(root, name), f"bench/data/{name}")
            sizes[f"bench/data/{name}"] = os.path.getsize(os.path.join(root, name))
        dataset_bytes = sum(sizes.values())
        print(
            f"  {'pieces_per_partition':<22}{'eff. B':>8}{'blocks':>8}{'TV':>7}{'lag-1':>7}"
            f"{'GETs':>7}{'x K=1':>7}{'MiB read':>10}{'x K=1':>7}{'x data':>8}"
        )
        base = None
        stratified = plan_module.piece_order
        for k, plain in (*((k, False) for k in args.frontier_k), (None, False), (16, True), (None, True)):
            # plain: the same pieces in a plain random order (before stratification), for comparison
            plan_module.piece_order = (  # type: ignore[assignment]
                (lambda n, seed, epoch, shuffle, m=None: stratified(n, seed, epoch, shuffle)) if plain else stratified
            )
            local = dw.WindowDataset(root, **common, pieces_per_partition=k)
            mix = mixing_report(local)["loader"]
            remote = dw.WindowDataset(
                "s3://bench/data/", storage_options=endpoint.storage_options(), **common, pieces_per_partition=k
            )
            endpoint.reset()
            windows = sum(len(b[0] if isinstance(b, (tuple, list)) else b) for b in remote)
            assert windows == local.num_windows, (windows, local.num_windows)
            gets = [r for r in endpoint.log.requests if r.kind == "get"]
            got = sum(_get_bytes(r, sizes) for r in gets)
            base = base or (len(gets), got)
            label = (
                f"{remote.spec.pieces_per_partition}"
                + (" (default)" if k is None else "")
                + (", plain" if plain else "")
            )
            print(
                f"  {label:<22}{mix['effective_batch_size']:>8.1f}{mix['distinct_blocks']:>8.1f}{mix['tv_distance']:>7.3f}"
                f"{mix['lag1']:>7.2f}{len(gets):>7}{len(gets) / base[0]:>7.1f}{got / 2**20:>10.1f}"
                f"{got / base[1]:>7.2f}{got / dataset_bytes:>8.2f}",
                flush=True,
            )
        ref = mixing_report(local)["global"]
        print(
            f"  {'global permutation':<22}{ref['effective_batch_size']:>8.1f}{ref['distinct_blocks']:>8.1f}"
            f"{ref['tv_distance']:>7.3f}{ref['lag1']:>7.2f}"
        )
    finally:
        plan_module.piece_order = stratified  # type: ignore[assignment]
        endpoint.close()


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--row-groups", type=int, default=8)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--stride", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--pieces", type=int, default=None, help="pieces_per_partition of 'default' (None: the default)"
    )
    parser.add_argument(
        "--orders", nargs="+", default=["0.1", "default", "global'"], help="orders trained beside the global shuffle"
    )
    parser.add_argument("--frontier", action="store_true", help="the knob's frontier: mixing, S3 GETs and bytes per K")
    parser.add_argument("--frontier-rows", type=int, default=4_000_000)
    parser.add_argument("--frontier-files", type=int, default=32)
    parser.add_argument("--frontier-k", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--pool", action="store_true", help="the pool order on the issue's layouts, alone")
    parser.add_argument("--pool-rows", type=int, default=4_000, help="rows per file of the --pool layouts")
    parser.add_argument("--pool-window", type=int, default=96)
    parser.add_argument("--pool-windows", type=int, default=200_000, help="most windows timed per run")
    parser.add_argument("--pool-units", type=float, default=3.0, help="the small budget, in B units")
    parser.add_argument("--train-only", action="store_true", help="skip the mixing table and the epoch timings")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--loader", action="store_true", help="also the bench_loader configuration")
    parser.add_argument("--loader-partitions", type=int, default=2)
    parser.add_argument("--loader-repeats", type=int, default=2)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dask_windows_bench_mixing"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    checkpoints = sorted({max(1, args.steps * f // 6) for f in (1, 2, 4, 6)})
    started = time.perf_counter()
    if args.pool:
        print(f"load {load()}")
        pool_layouts(args)
        print(f"\n{time.perf_counter() - started:.0f} s; load {load()}")
        return
    print(
        f"{args.rows:,} rows in {args.files} raw Parquet files of {args.row_groups} row groups; window {args.window}, "
        f"horizon 1, stride {args.stride}, B={args.batch_size}, buffer_partitions=2; load {load()}"
    )
    for kind in args.layouts if args.seeds else ():
        root = os.path.join(args.dir, f"{kind}-{args.rows}-{args.files}-{args.row_groups}")
        x, sid = make_layout(kind, args.rows, seed=LAYOUTS.index(kind))
        if not os.path.exists(root):
            write_layout(root, x, sid, args.files, args.row_groups)
        print(
            f"\n{kind}: {'one long series' if kind == 'long' else '200 series, ids ' + ('random' if kind == 'random' else 'ordered by behaviour')}"
        )
        if not args.train_only:
            mixing_table(root, args)
        training_comparison(kind, root, x, args, checkpoints)
    if args.loader:
        loader_check(args)
    if args.frontier:
        frontier(args)
    print(f"\n{time.perf_counter() - started:.0f} s; load {load()}")


def mixing_table(root: str, args: argparse.Namespace) -> None:
    """The mixing statistics of the 0.1 order, the default and a global permutation, with speed and memory."""
    print(f"  {'order':<28}{'blocks':>9}{'TV':>8}{'lag-1':>8}{'eff. B':>9}{'windows/s':>13}{'peak RSS':>10}")
    datasets = {"pieces_per_partition=1 (0.1)": open_ds(root, args, 1), "default": open_ds(root, args, args.pieces)}
    reports = {}
    for name, ds in datasets.items():
        r = mixing_report(ds)
        perf = epoch_child(root, args, None if name == "default" else ds.spec.pieces_per_partition)
        reports[name] = r
        label = name if name != "default" else "default (pool order)"
        print(fmt(label, r["loader"], f"{perf['rate']:>13,.0f}{perf['rss_mib']:>7.0f} MiB"))
    ds = datasets["default"]
    ref = global_shuffle_statistics(block_histogram(ds), args.batch_size, reports["default"]["loader"]["batches"], 0)
    print(fmt("global permutation", ref.__dict__))


POOL_LAYOUTS = (("128 files x 1", 128, 1), ("1,024 files x 1", 1024, 1), ("512 files x 8", 512, 8))

POOL_CHILD = """
import sys, time, json, collections; sys.path.insert(0, sys.argv[1]); import torch; torch.set_num_threads(1)
import dask_windows as dw
a = json.loads(sys.argv[2])
ds = dw.WindowDataset(a['root'], features=['x'], targets=['x'], series=None, window=a['window'],
    horizon=a['horizon'], stride=a['stride'], batch_size=a['batch_size'], **a['order'])
decoded = collections.Counter()
read = ds.source._read_table
def counted(path, groups, columns):
    decoded.update((path, g) for g in groups)
    return read(path, groups, columns)
ds.source._read_table = counted
n, limit, first = 0, a['max_windows'], None
t0, c0 = time.perf_counter(), time.process_time()
for x, y in ds:
    if first is None and limit:  # a part of an epoch: timed from its first batch on
        first = (time.perf_counter() - t0, len(x))
        t0, c0 = time.perf_counter(), time.process_time()
    n += len(x)
    if limit and n >= limit:
        break
dt, dc = time.perf_counter() - t0, time.process_time() - c0
n -= first[1] if first else 0
hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))
groups = sum(len(f.rows) for f in ds.source._footers.values())
print(json.dumps({'rate': n / dt, 'cpu_rate': n / dc, 'rss_mib': hwm / 1024, 'decodes': sum(decoded.values()) / groups,
                  'full': n >= ds.num_windows}))
"""


def pool_child(root: str, args: argparse.Namespace, stride: int, order: dict, max_windows: int) -> dict:
    """Windows/s (wall and per CPU second), peak RSS and row groups decoded per row group, in a fresh process."""
    spec = {
        "root": root, "window": args.pool_window, "horizon": 16, "stride": stride, "batch_size": args.batch_size,
        "order": order, "max_windows": max_windows,
    }  # fmt: skip
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = subprocess.run(
        [sys.executable, "-c", POOL_CHILD, repo, json.dumps(spec)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def pool_layouts(args: argparse.Namespace) -> None:
    """The pool order on the issue's layouts: one long series in files of ``--pool-rows`` rows."""
    b, window = args.batch_size, args.pool_window
    print(
        f"\npool order: one long series, {args.pool_rows:,} rows per file, window {window}, horizon 16, B={b}; "
        f"windows/s of one whole epoch at stride 16 (decodes counted over it), at stride 1 over "
        f"{args.pool_windows:,} windows after the first batch; "
        "ratios to whole partitions in a random order (pieces_per_partition=1) measured in the same run"
    )
    print(
        f"  {'layout':<16}{'order':<22}{'S':>6}{'eff. B':>8}{'blocks':>8}{'lag-1':>7}"
        f"{'dec./RG':>8}{'w/s s=16':>10}{'x':>6}{'CPU x':>7}{'w/s s=1':>10}{'x':>6}{'CPU x':>7}{'RSS MiB':>9}"
    )
    for name, files, groups in POOL_LAYOUTS:
        rows = files * args.pool_rows
        root = os.path.join(args.dir, f"pool-{files}x{groups}-{args.pool_rows}")
        if not os.path.exists(root):
            x, sid = make_layout("long", rows, seed=0)
            write_layout(root, x, sid, files, groups)
        unit = args.pool_rows // groups + window + 16
        small = int(args.pool_units * b * unit * (8 + 8 / 16))  # about pool_units x B units resident
        orders = {
            "whole partitions": {"pieces_per_partition": 1},
            "pool, 1 GiB": {},
            f"pool, {small / 2**20:.1f} MiB": {"buffer_bytes": small},
        }
        base: dict = {}
        for label, order in orders.items():
            ds = dw.WindowDataset(
                root, features=["x"], targets=["x"], series=None, window=window, horizon=16, stride=16,
                batch_size=b, return_index=True, **order,
            )  # fmt: skip
            report = mixing_report(ds, max_batches=2000)
            loader = report["loader"]
            spread = report.get("pool", {}).get("resident_units", "-")
            perf = {16: pool_child(root, args, 16, order, 0), 1: pool_child(root, args, 1, order, args.pool_windows)}
            if not base:
                base = perf
                ref = report["global"]
            ratios = [
                f"{perf[s]['rate']:>10,.0f}{perf[s]['rate'] / base[s]['rate']:>6.2f}"
                f"{perf[s]['cpu_rate'] / base[s]['cpu_rate']:>7.2f}"
                for s in (16, 1)
            ]
            print(
                f"  {name:<16}{label:<22}{spread!s:>6}{loader['effective_batch_size']:>8.1f}"
                f"{loader['distinct_blocks']:>8.1f}{loader['lag1']:>7.2f}{perf[16]['decodes']:>8.2f}"
                + "".join(ratios)
                + f"{max(perf[16]['rss_mib'], perf[1]['rss_mib']):>9.0f}"
            )
        print(
            f"  {name:<16}{'global permutation':<22}{'-':>6}{ref['effective_batch_size']:>8.1f}"
            f"{ref['distinct_blocks']:>8.1f}{ref['lag1']:>7.2f}"
        )


if __name__ == "__main__":
    main()
