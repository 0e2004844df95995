"""The telemetry's overhead: passes with the counters on and off, interleaved, the gather path forced alike.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_telemetry.py            # ~30-60 s
    PYTHONPATH=. python benchmarks/bench_telemetry.py --pairs 30 --passes 2
    PYTHONPATH=. python benchmarks/bench_telemetry.py --shape 64,64,4 --shape 256,512,4   # cheapest and typical
    PYTHONPATH=. python benchmarks/bench_telemetry.py --verdict   # wait share and verdict, ~40 s

``--verdict`` runs real loops instead: an input-bound one (``--read-ms`` injected into each read of
the source, nothing done with the batches) and a compute-bound one (``--step-ms`` of sleep per batch,
reads as they are), with no worker in the default pool order and the buffer order of whole partitions,
with a DataLoader of two worker processes (the loop's wait measured in this process by ``ds.watch``; the
stages run in the workers, unseen here) and on two ranks of a gloo group (two processes, each its share,
``stats(all_ranks=True)``), and prints each loop's wait share beside its verdict: the verdict must say
input-bound exactly when the share reaches ``tuning.INPUT_BOUND_SHARE``, and the input-bound loop must be
judged input-bound, the compute-bound one not. With workers each batch crosses a process (1-3 ms on this
busy machine), so the compute-bound loop's step is 50 ms by default.

What is compared: whole passes over in-memory arrays, features only, small
batches (B=64, L=64, C=4), iterated in this process: the loader's cheapest
batches (a few microseconds each), where the counters' share is the largest it
gets. "off" is ``telemetry.set_enabled(False)``: no wrapper around ``next``,
no clock reads around reads and waits (the runtime receives no telemetry).

Both arms take the same gather path: the adaptive choice that picks a copy
by timing the running stream (``lanes``: one or two copying threads) is
forced to numpy on one thread, since on a busy machine they may pick differently between passes,
and a profile of the earlier, unforced run showed that choice, not the
counters, taking the extra time.

Rounds are interleaved: pair ``i`` runs on-then-off for even ``i`` and
off-then-on for odd ``i``; each arm's figure is the process CPU time of
``--passes`` passes (less moved by other processes than wall time). The ratio
of each pair is printed as its median with the quartiles and extremes, and the
per-batch cost of the wrapper alone (the clock reads around ``next``). The
machine is shared: only the ratios of one run count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from dask_windows.dataset import WindowDataset
from dask_windows.runtime import telemetry as telemetry_module
from dask_windows.speedups import lanes


def passes(ds: WindowDataset, count: int) -> tuple[float, int]:
    """CPU seconds of this process (all its threads) for ``count`` passes, and batches per pass."""
    started, batches = time.process_time(), 0
    for _ in range(count):
        batches = sum(1 for _ in ds)
    return time.process_time() - started, batches


def _seconds(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def force_one_gather_path() -> None:
    """numpy's copy on this thread in both arms (no second lane)."""
    lanes.worth = lambda *args, **kwargs: False  # type: ignore[assignment]


class _SlowReads:
    """A source read method that sleeps first: the injected read latency."""

    def __init__(self, read, seconds: float) -> None:
        self.read, self.seconds = read, seconds

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.read(*args, **kwargs)


#: The settings a verdict is checked in: the loop iterating the dataset in this process, a DataLoader of two
#: worker processes (the loop measured with ``ds.watch(loader)``: the stages run where it cannot see them),
#: and two ranks of a gloo group (each iterating its share, ``stats(all_ranks=True)``).
SETTINGS = ("0 workers", "2 workers", "2 ranks")
LOOPS = ("input-bound", "compute-bound")


def verdict_dataset(series: int, rows: int, order: str = "pool") -> WindowDataset:
    """Arrays of 4 channels; the pool order's budget holds a few units, so reads go on through the pass."""
    import warnings

    arrays = [np.random.default_rng(i).standard_normal((rows, 4)).astype(np.float32) for i in range(series)]
    settings = {
        "pool": dict(buffer_bytes=4 * rows * 4 * 3),  # three units
        "buffer": dict(pieces_per_partition=1, buffer_partitions=1, partition_rows=rows),
    }[order]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PoolWarning: the small budget is on purpose
        return WindowDataset(arrays, window=64, stride=16, batch_size=64, next_pass_seconds=0, **settings)


def slow_reads(ds: WindowDataset, read_ms: float) -> None:
    """``read_ms`` injected into every read of ``ds``'s source (kept by a DataLoader worker's copy)."""
    for name in ("read_rows", "read_ranges", "read"):
        setattr(ds.source, name, _SlowReads(getattr(ds.source, name), read_ms / 1e3))


def verdict_loop(setting: str, loop: str, read_ms: float, step_ms: float, series: int, rows: int, order: str = "pool"):
    """``ds.stats()`` of one loop in this process: ``setting`` "0 workers" or "2 workers"; ``loop``
    "input-bound" (``read_ms`` in each read, no step) or "compute-bound" (``step_ms`` of sleep a batch)."""
    import torch

    ds = verdict_dataset(series, rows, order)
    if loop == "input-bound":
        slow_reads(ds, read_ms)
    workers = {"0 workers": 0, "2 workers": 2}[setting]
    batches = ds if workers == 0 else ds.watch(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers))
    for _ in batches:
        if loop == "compute-bound":
            time.sleep(step_ms / 1e3)
    return ds.stats()


def rank_loops(read_ms: float, step_ms: float, series: int, rows: int, popen=None, timeout: float = 120) -> dict:
    """Both loops on two ranks of a gloo group (processes started by ``popen``, ``subprocess.Popen`` by
    default): ``{loop: [rank 0's figures, rank 1's]}``, each ``{"wait_share", "input_bound", "verdict"}``."""
    import json
    import subprocess
    import tempfile

    popen = popen or (
        lambda argv, env: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )
    with tempfile.TemporaryDirectory() as work:
        args = dict(init=f"file://{work}/rendezvous", read_ms=read_ms, step_ms=step_ms, series=series, rows=rows)
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        procs = [
            popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--rank",
                    json.dumps({**args, "rank": r, "out": f"{work}/{r}.json"}),
                ],
                env,
            )
            for r in range(2)
        ]
        try:
            for p in procs:
                out, _ = p.communicate(timeout=timeout)
                if p.returncode != 0:
                    raise RuntimeError(f"a rank failed with {p.returncode}:\n{out}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        ranks = []
        for r in range(2):
            with open(f"{work}/{r}.json") as f:
                ranks.append(json.load(f))
    return {loop: [rank[loop] for rank in ranks] for loop in LOOPS}


def _rank(args: dict) -> None:
    """One rank of ``rank_loops``: each loop over its share, then every rank's figures gathered."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args["init"], rank=args["rank"], world_size=2)
    out = {}
    for loop in LOOPS:
        ds = verdict_dataset(args["series"], args["rows"])
        if loop == "input-bound":
            slow_reads(ds, args["read_ms"])
        for _ in ds:
            if loop == "compute-bound":
                time.sleep(args["step_ms"] / 1e3)
        stats = ds.stats(all_ranks=True)  # a collective: both ranks
        out[loop] = {
            "wait_share": stats.verdict.wait_share,
            "input_bound": stats.verdict.input_bound,
            "verdict": str(stats.verdict),
            "batches": stats.batches,
            "slowest_rank": stats.slowest_rank,
        }
        dist.barrier()
    with open(args["out"], "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


def _line(setting: str, loop: str, share: float, input_bound: bool, text: str) -> str:
    from dask_windows.settings.tuning import INPUT_BOUND_SHARE

    agrees = input_bound == (share >= INPUT_BOUND_SHARE) and input_bound == (loop == "input-bound")
    return f"{setting:17} {loop:13} | wait share {share:6.1%} | {'agrees' if agrees else 'CONTRADICTS'} | {text}"


def verdicts(read_ms: float, step_ms: float, series: int = 24, rows: int = 2_000) -> None:
    """Wait share and verdict of an input-bound and a compute-bound loop: in both orders with no worker,
    with two DataLoader workers and on two ranks (the pool order)."""
    from dask_windows.settings.tuning import INPUT_BOUND_SHARE

    print(f"threshold: input-bound from a wait share of {INPUT_BOUND_SHARE:.0%} after the first batch")
    print(
        f"{series} arrays of {rows:,} rows x 4, window 64, stride 16, B=64; {read_ms:g} ms a read / {step_ms:g} ms a step"
    )
    for setting, order in (("0 workers", "pool"), ("0 workers", "buffer"), ("2 workers", "pool")):
        for loop in LOOPS:
            stats = verdict_loop(setting, loop, read_ms, step_ms, series, rows, order)
            seen = (
                f"reads {stats.reads:3} fetch {stats.fetch_seconds:6.3f} s"
                if stats.stages_seen
                else "stages in the workers: not seen"
            )
            text = f"{seen}; {stats.verdict}"
            print(_line(f"{setting} ({order})", loop, stats.verdict.wait_share, stats.verdict.input_bound, text))
    for loop, ranks in rank_loops(read_ms, step_ms, series, rows).items():
        for r, figures in enumerate(ranks):
            print(_line(f"2 ranks: rank {r}", loop, figures["wait_share"], figures["input_bound"], figures["verdict"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--passes", type=int, default=2, help="passes per arm of a pair")
    parser.add_argument(
        "--shape",
        action="append",
        help="batch size, window, channels (B,L,C); repeat it to measure several shapes in one run (default: 64,64,4)",
    )
    parser.add_argument("--verdict", action="store_true", help="wait share and verdict of real loops instead")
    parser.add_argument("--read-ms", type=float, default=40.0, help="--verdict: latency injected into each read")
    parser.add_argument("--step-ms", type=float, default=50.0, help="--verdict: the compute-bound loop's step")
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # one rank of --verdict's two (JSON arguments)
    args = parser.parse_args()
    if args.rank:
        import json

        _rank(json.loads(args.rank))
        return
    if args.verdict:
        verdicts(args.read_ms, args.step_ms)
        return
    force_one_gather_path()
    items = list(range(200_000))
    bare = min(_seconds(lambda: sum(1 for _ in items)) for _ in range(5))
    timed = min(_seconds(lambda: sum(1 for _ in telemetry_module.Telemetry().watch(items))) for _ in range(5))
    wrapper = (timed - bare) / len(items)
    print("gather path forced in both arms: numpy, one thread (lanes off)")
    print(f"the per-batch wrapper alone: {wrapper * 1e9:.0f} ns a batch")
    for shape in args.shape or ["64,64,4"]:
        overhead(shape, args.pairs, args.passes, wrapper)


def overhead(shape: str, pairs: int, count: int, wrapper: float) -> None:
    """Passes with the counters on and off, interleaved, over batches of ``shape`` ("B,L,C")."""
    size, window, channels = (int(v) for v in shape.split(","))
    series = [np.random.default_rng(i).standard_normal((50_000, channels)).astype(np.float32) for i in range(8)]
    ds = WindowDataset(series, window=window, stride=4, batch_size=size, next_pass_seconds=0)
    passes(ds, 2)  # warm-up
    on, off = [], []
    for i in range(pairs):
        for enabled in (True, False) if i % 2 == 0 else (False, True):
            telemetry_module.set_enabled(enabled)
            seconds, batches = passes(ds, count)
            (on if enabled else off).append(seconds)
    telemetry_module.set_enabled(True)
    ratios = sorted(a / b for a, b in zip(on, off))
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    per_batch_off = statistics.median(off) / (batches * count)
    print(
        f"batches of B={size}, L={window}, C={channels}: {batches:,} per pass, {per_batch_off * 1e6:.1f} us CPU a "
        f"batch with telemetry off (the wrapper alone: {wrapper / per_batch_off:.2%} of a batch)"
    )
    print(
        f"  on / off over {pairs} interleaved pairs of {count} passes: median {median:.4f} "
        f"(overhead {median - 1:+.2%}), quartiles {q1:.4f}-{q3:.4f}, range {ratios[0]:.4f}-{ratios[-1]:.4f}; "
        f"fastest on / fastest off {min(on) / min(off):.4f}"
    )


if __name__ == "__main__":
    main()
