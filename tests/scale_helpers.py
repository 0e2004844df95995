"""Helpers of the scale-out tests: uneven partitions, a source that logs its reads, child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dask_windows.sources import Source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale_child.py")


def make_uneven_frames(sizes: Sequence[int], seed: int = 0, max_len: int = 90) -> list[pd.DataFrame]:
    """Files of ``sizes`` rows cut from series of random lengths laid end to end (series span files).

    ``f0`` is the global row and ``y`` is ``10 * row``, so values prove which rows a window holds.
    """
    rng = np.random.default_rng(seed)
    total = int(sum(sizes))
    lengths = []
    while sum(lengths) < total:
        lengths.append(int(rng.integers(3, max_len)))
    lengths[-1] -= sum(lengths) - total
    sid = np.repeat(np.arange(len(lengths)) * 3 + 11, lengths)
    frame = pd.DataFrame({"sid": sid, "f0": np.arange(total, dtype=np.float32)})
    frame["f1"] = rng.standard_normal(total).astype(np.float32)
    frame["y"] = (np.arange(total) * 10.0).astype(np.float32)
    bounds = np.cumsum([0, *sizes])
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]


class CountingSource(Source):
    """Wraps a source and appends ``partition columns`` to ``log_path`` for every read (any process)."""

    def __init__(self, inner: Source, log_path: str) -> None:
        self.inner = inner
        self.partitions = inner.partitions
        self.description = inner.description
        self.log_path = log_path

    def column_names(self) -> list:
        return self.inner.column_names()

    def check_columns(self, columns: Sequence, what: dict) -> None:
        self.inner.check_columns(columns, what)

    def read(self, index: int, columns: Sequence) -> dict:
        with open(self.log_path, "a") as log:
            log.write(f"{index} {','.join(map(str, columns))}\n")
        return self.inner.read(index, columns)


def reads(log_path: str, column: str = "f0") -> list[int]:
    """Partitions read with ``column`` among the columns, in log order."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as log:
        return [int(line.split()[0]) for line in log if column in line.split()[1].split(",")]


def run_child(command: str, args: dict) -> subprocess.Popen:
    """Start ``scale_child.py command`` with ``args`` as JSON; the caller waits on it."""
    import forkrun

    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return forkrun.popen([sys.executable, CHILD, command, json.dumps(args)], env=env)


def wait(procs: list[subprocess.Popen], timeout: float = 120) -> None:
    """Wait for every child; fail with its output if one fails or hangs."""
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"child failed with {p.returncode}:\n{out}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def open_dataset(data: str, log_path: str | None = None, **kwargs):
    """A ``WindowDataset`` over ``data`` (read through a ``CountingSource`` when ``log_path`` is given)."""
    from dask_windows.dataset import WindowDataset
    from dask_windows.sources import ParquetSource

    source = ParquetSource(data) if log_path is None else CountingSource(ParquetSource(data), log_path)
    settings = {"features": ["f0", "f1"], "series": "sid", "return_index": True, **kwargs}
    return WindowDataset(source, **settings)


def drain(loader) -> list[tuple[np.ndarray, ...]]:
    """Every batch a loader yields, as numpy tuples."""
    return [tuple(t.numpy() for t in (b if isinstance(b, (tuple, list)) else (b,))) for b in loader]


def save_batches(path: str, batches: list[tuple[np.ndarray, ...]]) -> None:
    """Store batches (tuples of arrays) in one ``.npz``."""
    arrays = {f"b{i}_{j}": a for i, batch in enumerate(batches) for j, a in enumerate(batch)}
    np.savez(path, count=len(batches), **arrays)


def load_batches(path: str) -> list[tuple[np.ndarray, ...]]:
    """Batches stored by ``save_batches``."""
    with np.load(path) as f:
        count = int(f["count"])
        batches = []
        for i in range(count):
            keys = sorted((k for k in f.files if k.startswith(f"b{i}_")), key=lambda k: int(k.split("_")[1]))
            batches.append(tuple(f[k] for k in keys))
        return batches


def assert_same_batches(got: list, expected: list) -> None:
    """Bit-for-bit equality of two batch lists, with the first differing batch named."""
    assert len(got) == len(expected), f"{len(got)} batches, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert u.dtype == v.dtype and u.shape == v.shape, f"batch {i}: {u.dtype}{u.shape} != {v.dtype}{v.shape}"
            assert u.tobytes() == v.tobytes(), f"batch {i} differs"
