"""Foundation-model corpora: packed tokens/s and packing efficiency beside an in-RAM baseline; open and first batch.

Part 1, throughput (one run, alternating contenders): a corpus whose series lengths and
channel counts are resampled from the real statsmodels corpus of ``examples/_real_corpus.py``
(``--series`` series, channel-independent: every channel is one univariate series), written as
list-column Parquet. Contenders, each timed for ``--seconds`` per round:

  dw        ``CorpusDataset`` from the Parquet files: an epoch order, packed by best fit into
            sequences of ``--tokens`` tokens of ``--patch`` steps (every item once per epoch);
  baseline  an in-RAM map-style sampler written to uni2ts's documented behaviour (its code is
            not used): every series decoded into memory first; each batch draws
            ``factor x B x S / mean tokens`` series uniformly with replacement (uni2ts's
            ``batch_size_factor``, scaled here so that a batch's draw can fill it), crops each to a random window of
            at most ``max_length`` steps, and packs them into ``B`` sequences first-fit
            decreasing; series that do not fit are dropped.

Printed: real tokens/s (tokens holding an observation or an item's left padding inside its
first patch), the packing efficiency (share of the batch's tokens that belong to an item),
and for the baseline its load time. Both fill the same Moirai-style arrays
(``target (B, S, P)``, ``observed_mask``, ``sample_id``).

The packing efficiency of the real corpus itself (all its data sets, one epoch) is printed too.

Part 2, opening: ``--sizes`` list-column Parquet files of that many short series (12-80 steps,
row groups of 16,384 series): seconds to open a ``CorpusDataset``, to plan an epoch (``len``),
and to its first batch, with the bytes kept per series.

    PYTHONPATH=. python benchmarks/bench_corpus.py [--series 20000] [--sizes 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import dask_windows as dw  # noqa: E402


def real_lengths() -> np.ndarray:
    """Steps of every univariate series of the real corpus (each channel one series)."""
    from _real_corpus import load_corpus

    return np.array([v.shape[-1] for rows in load_corpus().values() for _, _, v in rows for _ in np.atleast_2d(v)])


def write_resampled(path: str, lengths: np.ndarray, num_series: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    chosen = rng.choice(lengths, num_series)
    offsets = np.concatenate([[0], np.cumsum(chosen)]).astype(np.int64)
    values = rng.standard_normal(int(offsets[-1]), dtype=np.float32)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"target": column}), path, row_group_size=2048)


class Baseline:
    """In-RAM map-style sampling with first-fit-decreasing packing (uni2ts's documented behaviour)."""

    def __init__(self, path: str, max_length: int, patch: int, tokens: int, batch_size: int, factor: float = 2.0):
        table = pq.read_table(path)
        column = table.column("target").combine_chunks()
        offsets = np.asarray(column.offsets)
        flat = np.asarray(column.values.to_numpy(zero_copy_only=False), np.float32)
        self.series = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]  # the whole corpus in memory
        self.max_length, self.patch, self.tokens, self.batch_size = max_length, patch, tokens, batch_size
        mean_tokens = float(np.mean([min(-(-len(x) // patch), max_length // patch) for x in self.series]))
        self.draw = int(factor * batch_size * tokens / mean_tokens)
        self.rng = np.random.default_rng(0)

    def batch(self) -> dict:
        B, S, P = self.batch_size, self.tokens, self.patch
        picks = self.rng.integers(0, len(self.series), self.draw)  # uniform, with replacement
        samples = []
        for i in picks:
            x = self.series[i]
            if len(x) > self.max_length:  # a random crop
                a = int(self.rng.integers(0, len(x) - self.max_length + 1))
                x = x[a : a + self.max_length]
            samples.append(x)
        need = [-(-len(x) // P) for x in samples]
        target = np.zeros((B, S * P), np.float32)
        observed = np.zeros((B, S * P), bool)
        sample_id = np.zeros((B, S), np.int64)
        room = [S] * B
        count = [0] * B
        for j in np.argsort(need)[::-1]:  # first fit decreasing; what fits nowhere is dropped
            n = need[j]
            for b in range(B):
                if room[b] >= n:
                    o = S - room[b]
                    x = samples[j]
                    pad = n * P - len(x)
                    target[b, o * P + pad : (o + n) * P] = x
                    observed[b, o * P + pad : (o + n) * P] = ~np.isnan(x)
                    count[b] += 1
                    sample_id[b, o : o + n] = count[b]
                    room[b] -= n
                    break
        return {"target": target.reshape(B, S, P), "observed_mask": observed.reshape(B, S, P), "sample_id": sample_id}


def throughput(args: argparse.Namespace, folder: str) -> None:
    lengths = real_lengths()
    print(
        f"real corpus: {len(lengths)} univariate series, steps min {lengths.min()} median {int(np.median(lengths))} "
        f"max {lengths.max()}"
    )
    path = os.path.join(folder, "resampled.parquet")
    write_resampled(path, lengths, args.series)
    settings = dict(patch_size=args.patch, max_length=args.max_length, sequence_tokens=args.tokens)
    t = time.perf_counter()
    baseline = Baseline(path, args.max_length, args.patch, args.tokens, args.batch_size)
    load = time.perf_counter() - t
    ds = dw.CorpusDataset(path, batch_size=args.batch_size, min_length=1, **settings)

    def run_dw(seconds: float) -> tuple[int, int, float]:
        real = total = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for b in ds:
                real += int((b["sample_id"] > 0).sum())
                total += b["sample_id"].numel()
                if time.perf_counter() - t0 >= seconds:
                    break
        return real, total, time.perf_counter() - t0

    def run_base(seconds: float) -> tuple[int, int, float]:
        real = total = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            b = baseline.batch()
            real += int((b["sample_id"] > 0).sum())
            total += b["sample_id"].size
        return real, total, time.perf_counter() - t0

    results: dict[str, list] = {"dw": [], "baseline": []}
    for _ in range(args.rounds):
        results["dw"].append(run_dw(args.seconds))
        results["baseline"].append(run_base(args.seconds))
    print(
        f"\n{args.series:,} series resampled from the real lengths, patch {args.patch}, "
        f"{args.tokens} tokens per sequence, B={args.batch_size}, max_length {args.max_length}, "
        f"{args.rounds} rounds of {args.seconds:.0f} s"
    )
    print("| loader | real tokens/s (per round) | packing efficiency | load before the first batch |")
    print("|---|---|---|---|")
    rates = {}
    for name, rows in results.items():
        per = [r / s for r, _, s in rows]
        rates[name] = float(np.median(per))
        eff = sum(r for r, _, _ in rows) / max(sum(t for _, t, _ in rows), 1)
        extra = f"{load:.2f} s (decode all)" if name == "baseline" else "none (streams)"
        print(f"| {name} | {rates[name]:,.0f} ({', '.join(f'{p:,.0f}' for p in per)}) | {eff:.4f} | {extra} |")
    print(f"dw / baseline tokens/s: {rates['dw'] / rates['baseline']:.2f}x")

    from _real_corpus import write_corpus

    paths = write_corpus(os.path.join(folder, "real"), "parquet")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corpus = dw.mix({n: dw.CorpusDataset(p, min_length=1, **settings) for n, p in paths.items()})
    plan = corpus.plan(0)
    bound = -(-int(plan.tokens.sum()) // args.tokens)
    print(
        f"real corpus itself ({corpus.num_items} items, {int(plan.tokens.sum()):,} tokens, one epoch): packing "
        f"efficiency {corpus.packing_efficiency():.4f}, {corpus.num_sequences(0)} sequences (lower bound {bound})"
    )


def opening(sizes: list[int], folder: str) -> None:
    print("\n| series | write (s) | open (s) | plan epoch (s) | first batch (s) | bytes kept per series |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for n in sizes:
        path = os.path.join(folder, f"short-{n}.parquet")
        t = time.perf_counter()
        lengths = rng.integers(12, 81, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = rng.standard_normal(int(offsets[-1]), dtype=np.float32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(
            pa.table({"target": column, "freq": pa.array(["h"] * n).dictionary_encode()}), path, row_group_size=16384
        )
        write = time.perf_counter() - t
        tracemalloc.start()
        t = time.perf_counter()
        ds = dw.CorpusDataset(path, patch_size=16, max_length=512, batch_size=32)
        t1 = time.perf_counter()
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        len(ds)
        t2 = time.perf_counter()
        it = iter(ds)
        next(it)
        t3 = time.perf_counter()
        it.close()
        print(f"| {n:,} | {write:.2f} | {t1 - t:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} | {kept / n:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=20_000)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as folder:
        if not args.skip_throughput:
            throughput(args, folder)
        opening(args.sizes, folder)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
