"""Share of random byte flips that change batches silently, with and without page CRCs.

    PYTHONPATH=. python benchmarks/bench_byte_flips.py [--trials 150] [--cost-only]

The battery of ``tests/opening/test_checks.py`` (``_flip_trials``): three Parquet files (row groups of
100 rows, pyarrow's default statistics), and per seeded trial 1-8 random bytes of one file
XORed with a random byte; each trial's batches are compared with the undamaged ones. A trial is
Run twice: flips anywhere in the file (the test's battery), and flips drawn inside the
column chunks only (data pages: where a flip can change a value). A trial is
*silent* when the batches differ and nothing raised, *raised* when the read failed (every batch
before the error is checked), *unchanged* when the flips hit bytes that change nothing. Printed
for files without page CRCs with the footer min/max check (``sources.parquet.stats_check``) off (the
baseline, measured in the same run) and on, and for files with page CRCs. First it prints the
check's cost: its time over the time of the partition read it follows (1M rows of 4 float32
columns, medians of alternating rounds).
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # helpers
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "opening"))  # test_checks, the battery


def page_flip_trials(root: pathlib.Path, crc: bool, trials: int, random_values: bool = False) -> tuple[int, int, int]:
    """As ``_flip_trials``, with the 1-8 flipped bytes drawn inside the files' column chunks (data pages).

    ``random_values``: ``f0`` and ``y`` hold random normal values instead of the row number (and ten
    times it), so every row group's values fill its min/max range, as most real data do.
    """
    import shutil
    import warnings

    import numpy as np
    import pyarrow.parquet as pq
    import test_checks
    from helpers import make_frames

    from dask_windows.dataset import WindowDataset

    src = str(root / "src")
    frames = make_frames(seed=1, num_files=3, num_series=6, max_len=200)
    if random_values:
        values = np.random.default_rng(5)
        for frame in frames:
            for column in ("f0", "y"):
                frame[column] = values.standard_normal(len(frame)).astype(np.float32)
    test_checks._write(frames, src, crc=crc, row_group_size=100)
    kw = dict(test_checks.KW, series="sid", batch_size=64)
    want = test_checks._batches(WindowDataset(src, **kw))
    rng = np.random.default_rng(12)
    silent = raised = unchanged = 0
    for _ in range(trials):
        work = str(root / "work")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        victim = os.path.join(work, f"part-{int(rng.integers(3)):04d}.parquet")
        meta = pq.ParquetFile(victim).metadata
        chunks = [  # (start, bytes) of every column chunk
            ((c.dictionary_page_offset or c.data_page_offset), c.total_compressed_size)
            for g in range(meta.num_row_groups)
            for c in (meta.row_group(g).column(i) for i in range(meta.num_columns))
        ]
        with open(victim, "rb") as f:
            data = bytearray(f.read())
        for _ in range(int(rng.integers(1, 9))):
            start, size = chunks[int(rng.integers(len(chunks)))]
            data[start + int(rng.integers(size))] ^= int(rng.integers(1, 256))
        with open(victim, "wb") as f:
            f.write(bytes(data))
        got = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = test_checks._batches(WindowDataset(work, **kw))
        except Exception:
            raised += 1
            continue
        if test_checks._same(got, want):
            unchanged += 1
        else:
            silent += 1
    return silent, raised, unchanged


def check_cost(root: pathlib.Path, rows: int = 1_000_000, rounds: int = 7) -> float:
    """Median time of the min/max check over the median time of the read it follows (one partition)."""
    import time

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_windows.sources.parquet.stats_check import outside_statistics

    rng = np.random.default_rng(0)
    path = str(root / "cost.parquet")
    pq.write_table(pa.table({f"f{i}": rng.standard_normal(rows).astype(np.float32) for i in range(4)}), path,
                   row_group_size=rows // 4)  # fmt: skip
    file = pq.ParquetFile(path)
    groups = list(range(file.metadata.num_row_groups))
    reads, checks = [], []
    for _ in range(rounds):  # alternating, so load changes hit both alike
        started = time.perf_counter()
        table = file.read_row_groups(groups, use_threads=False)
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert outside_statistics(file.metadata, groups, table) is None
        checks.append(time.perf_counter() - started)
    return float(np.median(checks) / np.median(reads))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--cost-only", action="store_true", help="only the check's time against the read's")
    parser.add_argument(
        "--random-values",
        action="store_true",
        help="only flips inside data pages, on files whose values fill their row groups' ranges (random normals)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        ratio = check_cost(pathlib.Path(root))
    print(f"min/max check: {ratio:.1%} of the time of the partition read it follows (1M rows x 4 float32)")
    if args.cost_only:
        return
    import test_checks  # the battery itself, so the figure is the test's

    from dask_windows.sources import parquet

    check = parquet.outside_statistics
    runs = [("no page CRCs, min/max check off", False, False), ("no page CRCs, min/max check on", False, True),
            ("page CRCs, min/max check on", True, True)]  # fmt: skip
    places = (("anywhere in the file", test_checks._flip_trials), ("inside data pages", page_flip_trials))
    if args.random_values:
        places = (("in pages, random values", functools.partial(page_flip_trials, random_values=True)),)
    for where, trial in places:
        for label, crc, stats in runs:
            parquet.outside_statistics = check if stats else (lambda *a: None)  # type: ignore[assignment]
            with tempfile.TemporaryDirectory() as root:
                silent, raised, unchanged = trial(pathlib.Path(root), crc=crc, trials=args.trials)
            print(
                f"flips {where:>20}, {label:>32}: {silent / args.trials:6.1%} silent ({silent}), {raised} raised, "
                f"{unchanged} unchanged of {args.trials} trials",
                flush=True,
            )
    parquet.outside_statistics = check


if __name__ == "__main__":
    main()
