"""Mixing and speed of the default loader on converted data: spread layout vs the old contiguous one.

Builds three layouts of the same size (one long non-stationary series; many series with random
ids; many series whose ids are ordered by behaviour), converts each with ``layout="spread"``
(the default) and ``layout="contiguous"`` (0.1's layout), reads them with the default loader
settings (``buffer_partitions=2``) and prints, beside a global permutation of the same windows:
distinct row blocks (of 100) per batch, the TV distance of a batch's block histogram from the
dataset's, the lag-1 correlation of consecutive batches' mean regime, the effective batch size
(variance of one window's regime over the variance of a batch's mean regime), windows/s (best
epoch, the two layouts' epochs alternating in one process) and the peak RSS of the reading process, as ratios measured in the same run.

    PYTHONPATH=. python benchmarks/bench_converted.py [--rows 1000000] [--files 16]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import tempfile
import time

import numpy as np
import pandas as pd

BLOCKS = 100


def make_layout(kind: str, rows: int, seed: int = 0) -> pd.DataFrame:
    """Rows of one layout, shuffled; ``regime`` is each row's slowly varying behaviour."""
    rng = np.random.default_rng(seed)
    if kind == "one long series":
        sid = np.zeros(rows, np.int64)
        pos = np.arange(rows)
        regime = np.sin(pos / rows * 6 * np.pi) + pos / rows  # drifts and cycles over the whole history
    else:
        num_series = 500
        sid = np.repeat(np.arange(num_series), rows // num_series)
        pos = np.tile(np.arange(rows // num_series), num_series)
        level = np.linspace(-1, 1, num_series) if kind == "ids ordered by behaviour" else rng.uniform(-1, 1, num_series)
        regime = level[sid]
    x = regime + 0.1 * rng.standard_normal(len(sid))
    frame = pd.DataFrame({"sid": sid, "ts": pos, "x": x.astype(np.float32), "regime": regime})
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def figures(batches: list[np.ndarray], canonical: np.ndarray, regime: np.ndarray, total: int) -> dict:
    """The issue's four statistics of batches of canonical window rows."""
    every = np.minimum(canonical * BLOCKS // total, BLOCKS - 1)
    reference = np.bincount(every, minlength=BLOCKS) / len(every)
    distinct, tv, means = [], [], []
    for rows in batches:
        b = np.minimum(rows * BLOCKS // total, BLOCKS - 1)
        distinct.append(len(np.unique(b)))
        tv.append(0.5 * np.abs(np.bincount(b, minlength=BLOCKS) / len(b) - reference).sum())
        means.append(regime[rows].mean())
    means = np.asarray(means)
    return {
        "distinct": float(np.mean(distinct)),
        "tv": float(np.mean(tv)),
        "lag1": float(np.corrcoef(means[:-1], means[1:])[0, 1]),
        "ess": float(regime[canonical].var() / means.var()),
    }


def read_epochs(path: str, stride: int, batch: int, window: int, epochs: int, out: multiprocessing.Queue) -> None:
    """Child process: windows/s of full epochs, canonical start rows of every batch, peak RSS."""
    import dask_windows as dw
    from dask_windows.cli.layout import canonical_rows
    from dask_windows.sources.manifest import MANIFEST_NAME

    with open(os.path.join(path, MANIFEST_NAME)) as src:
        manifest = json.load(src)
    ds = dw.WindowDataset(
        path,
        ["x"],
        series="sid",
        window=window,
        stride=stride,
        batch_size=batch,
        drop_last=True,
        return_index=True,
        seed=1,
    )
    batches, seconds = [], []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        started = time.perf_counter()
        for _, rows in ds:
            batches.append(rows.numpy())
        seconds.append(time.perf_counter() - started)
    out.put(
        {
            "windows_per_s": len(ds) * batch / float(np.median(seconds)),
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "batches": [canonical_rows(manifest, b) for b in batches],
            "per_epoch": len(ds),
        }
    )


def time_both(paths: list[str], stride: int, batch: int, window: int, rounds: int, out: multiprocessing.Queue) -> None:
    """Child process: best epoch time of each dataset, epochs alternating (fair under a shared machine's load)."""
    import dask_windows as dw

    sets = [
        dw.WindowDataset(p, ["x"], series="sid", window=window, stride=stride, batch_size=batch, seed=1) for p in paths
    ]
    best = [float("inf")] * len(sets)
    for r in range(rounds):
        for i, ds in enumerate(sets):
            ds.set_epoch(r)
            started = time.perf_counter()
            for _ in ds:
                pass
            best[i] = min(best[i], time.perf_counter() - started)
    out.put([ds.num_windows / t for ds, t in zip(sets, best)])


def in_child(target, *args, **kw):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=args, kwargs={**kw, "out": queue})
    child.start()
    result = queue.get()
    child.join()
    return result


def measure(path: str, **kw) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=read_epochs, args=(path,), kwargs={**kw, "out": queue})
    child.start()
    result = queue.get()
    child.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--stride", type=int, default=16)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    import dask

    from dask_windows.cli.convert import convert

    with open("/proc/loadavg") as src:
        load = src.read().split()[:3]
    print(
        f"load average {load}; {args.rows:,} rows, ~{args.files} files, "
        f"window {args.window}, stride {args.stride}, B={args.batch_size}, default loader (buffer_partitions=2)"
    )
    head = f"{'layout':26} {'order':22} {'blocks':>7} {'TV':>6} {'lag-1':>6} {'ESS':>6} {'windows/s':>10} {'RSS MB':>7}"
    print(head)
    with tempfile.TemporaryDirectory() as tmp, dask.config.set(scheduler="threads", num_workers=2):
        for kind in ("one long series", "random ids", "ids ordered by behaviour"):
            frame = make_layout(kind, args.rows)
            src = os.path.join(tmp, kind.replace(" ", "_"))
            os.makedirs(src)
            frame.drop(columns="regime").to_parquet(os.path.join(src, "in.parquet"), index=False)
            canonical_regime = frame.sort_values(["sid", "ts"])["regime"].to_numpy()
            bytes_per_row = 12  # about what the output holds per row after compression
            size = max(args.rows * bytes_per_row // args.files, 1 << 16)
            results = {}
            for layout in ("contiguous", "spread"):
                dst = os.path.join(tmp, f"{kind}-{layout}".replace(" ", "_"))
                report = convert(
                    [src], dst, series="sid", time="ts", partition_size=size, layout=layout, window=args.window
                )
                results[layout] = (
                    report,
                    measure(dst, stride=args.stride, batch=args.batch_size, window=args.window, epochs=args.epochs),
                )
            speed = in_child(
                time_both,
                [os.path.join(tmp, f"{kind}-{layout}".replace(" ", "_")) for layout in ("contiguous", "spread")],
                stride=args.stride,
                batch=args.batch_size,
                window=args.window,
                rounds=args.epochs,
            )
            for (_, got), windows_per_s in zip(results.values(), speed):
                got["windows_per_s"] = windows_per_s
            old = results["contiguous"][1]
            every = np.concatenate(old["batches"][: old["per_epoch"]])
            rng = np.random.default_rng(0)
            glob = [
                rng.permutation(every)[: len(every) // args.batch_size * args.batch_size].reshape(-1, args.batch_size)
                for _ in range(args.epochs)
            ]
            rows = [
                ("global permutation", figures([b for g in glob for b in g], every, canonical_regime, len(frame)), None)
            ]
            for layout, (report, got) in results.items():
                name = f"{layout} ({report.files} files)"
                rows.append((name, figures(got["batches"], every, canonical_regime, len(frame)), got))
            for name, f, got in rows:
                speed = "" if got is None else f"{got['windows_per_s']:10,.0f} {got['rss'] / 2**20:7.0f}"
                print(
                    f"{kind:26} {name:22} {f['distinct']:7.1f} {f['tv']:6.3f} {f['lag1']:6.2f} {f['ess']:6.1f} {speed}"
                )
            new = results["spread"][1]
            print(
                f"{'':26} spread / contiguous: windows/s x{new['windows_per_s'] / old['windows_per_s']:.2f}, "
                f"peak RSS x{new['rss'] / old['rss']:.2f}, bytes on disk "
                f"x{results['spread'][0].bytes_out / results['contiguous'][0].bytes_out:.2f}"
            )


if __name__ == "__main__":
    main()
