"""Numpy arrays and ``.npy`` memmaps as a source: coverage, cuts without lost windows, bounded memory."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from helpers import collect, oracle_starts

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))


def _series(lengths: list[int], channels: int = 3) -> list[np.ndarray]:
    """Arrays whose column 0 is the global row and column 1 ten times it."""
    out, offset = [], 0
    for n in lengths:
        rows = np.arange(offset, offset + n, dtype=np.float32)
        columns = [rows, rows * 10] + [np.full(n, c, np.float32) for c in range(2, channels)]
        out.append(np.stack(columns, axis=1))
        offset += n
    return out


def _oracle(lengths: list[int], window: int, stride: int, horizon: int = 0) -> np.ndarray:
    return oracle_starts([pd.DataFrame(index=range(n)) for n in lengths], None, window, stride, horizon)


def _check_values(batches: list, window: int, horizon: int) -> np.ndarray:
    """Every window holds the rows its index names; returns the sorted start rows."""
    starts = np.concatenate([b[-1] for b in batches])
    x = np.concatenate([b[0] for b in batches])
    assert np.array_equal(x[:, 0, :], starts[:, None] + np.arange(window, dtype=np.float32))
    if horizon:
        y = np.concatenate([b[1] for b in batches])
        want = (starts[:, None] + window + np.arange(horizon)) * 10
        assert np.array_equal(y[:, 0, :], want.astype(np.float32))
    return np.sort(starts)


LENGTHS = [5, 40, 3, 230, 17, 64, 1, 120]


@pytest.mark.parametrize("partition_rows", [7, 50, 64, 1000])
@pytest.mark.parametrize("window,stride,horizon", [(1, 1, 0), (8, 1, 0), (8, 3, 2), (16, 5, 0)])
def test_list_of_arrays_coverage(partition_rows, window, stride, horizon):
    arrays = _series(LENGTHS)
    targets = [1] if horizon else None
    ds = WindowDataset(
        arrays,
        features=[0, 2],
        targets=targets,
        window=window,
        stride=stride,
        horizon=horizon,
        batch_size=32,
        partition_rows=partition_rows,
        return_index=True,
    )
    assert sum(p.num_rows for p in ds.partitions) == sum(LENGTHS)
    starts = _check_values(collect(ds), window, horizon)
    assert np.array_equal(starts, _oracle(LENGTHS, window, stride, horizon))
    assert ds.num_windows == len(starts)


def test_one_array_with_a_series_vector():
    lengths = [30, 12, 50, 9, 44]
    ids = np.repeat([7, 3, 7, 9, 3], lengths)  # a series id may come back: runs are what counts
    array = np.concatenate(_series(lengths))
    ds = WindowDataset(array, series=ids, window=10, stride=2, batch_size=16, partition_rows=40, return_index=True)
    starts = _check_values(collect(ds), 10, 0)
    assert np.array_equal(starts, _oracle(lengths, 10, 2))
    with pytest.raises(ConfigError, match="one series id per row"):
        WindowDataset(array, series=ids[:-1], window=10)
    with pytest.raises(ConfigError, match="only works with one 2-D numpy array"):
        WindowDataset([array, array], series=ids, window=10)
    with pytest.raises(ConfigError, match="cannot be used with a list of arrays"):
        WindowDataset([array], features=[1], series=0, window=10)


def test_memmaps_give_the_same_batches_and_pickle_by_reference(tmp_path):
    lengths = [3000, 41, 8000, 770]
    arrays = _series(lengths)
    paths = []
    for i, a in enumerate(arrays):
        paths.append(str(tmp_path / f"s{i}.npy"))
        np.save(paths[-1], a)
    mapped = [np.load(p, mmap_mode="r") for p in paths]
    kw = dict(features=[0, 1], window=12, stride=2, batch_size=256, partition_rows=1024, return_index=True)
    in_memory = collect(WindowDataset(arrays, **kw))
    ds = WindowDataset(mapped, **kw)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(in_memory, collect(ds)))
    ds.set_epoch(0)  # iterated once: its next pass (and a copy's) would be epoch 1
    blob = pickle.dumps(ds)
    assert len(blob) < sum(a.nbytes for a in arrays) // 10  # file references, not the data
    again = collect(pickle.loads(blob))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(in_memory, again))
    # One big memmap cut by a series vector, read through DataLoader worker processes.
    np.save(tmp_path / "all.npy", np.concatenate(arrays))
    big = np.load(tmp_path / "all.npy", mmap_mode="r")
    ids = np.repeat(np.arange(len(lengths)), lengths)
    ds = WindowDataset(big, series=ids, **kw)
    starts = _check_values(collect(ds, {"num_workers": 2}), 12, 0)
    assert np.array_equal(starts, _oracle(lengths, 12, 2))


def test_copy_on_write_memmap_keeps_its_edits(tmp_path):
    np.save(tmp_path / "a.npy", _series([200])[0])
    edited = np.load(tmp_path / "a.npy", mmap_mode="c")
    edited[:, 2] = -1.0
    ds = WindowDataset([edited], features=[2], window=4, batch_size=1000, partition_rows=64, shuffle=False)
    for _ in range(2):
        x = np.concatenate([b.numpy() for b in ds])
        assert (x == -1.0).all()


RSS_SCRIPT = """
import sys
import numpy as np
from dask_windows.dataset import WindowDataset

def peak_kib():
    # VmHWM: this process's peak resident set. (ru_maxrss would carry the parent's peak across exec.)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

array = np.load(sys.argv[1], mmap_mode="r")
ds = WindowDataset(array, window=32, stride=16, batch_size=1024, partition_rows=65536,
                   buffer_partitions=2, prefetch_partitions=1, buffer_bytes=8 << 20)
before, windows = peak_kib(), 0
for i, x in enumerate(ds):
    windows += len(x)
    if i == len(ds) // 4:
        quarter = peak_kib()
print(before, quarter, peak_kib(), windows, ds.num_windows)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak RSS from /proc (Linux)")
def test_streaming_a_memmap_larger_than_the_buffer_keeps_rss_bounded(tmp_path):
    rows, channels = 4 * 2**20, 4  # 64 MiB of float32; a partition is 1 MiB, the buffer 2 MiB
    path = tmp_path / "big.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, channels)})
        for lo in range(0, rows, 2**18):
            f.write(np.full((2**18, channels), lo, np.float32).tobytes())
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RSS_SCRIPT), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    before, quarter, after, windows, num_windows = (int(v) for v in out.split())
    assert windows == num_windows
    file_kib = rows * channels * 4 // 1024
    # Peak RSS stops growing once the buffer is warm: the last three quarters of the file (48 MiB)
    # stream through without raising it. Keeping the pages mapped would add them all (about 70 MiB).
    assert after - quarter < file_kib // 8, (before, quarter, after)
    # Warming up (about 36 MiB here: the buffer being drawn, the next one built ahead on the builder
    # thread, the reader threads' allocations, torch's first tensors) stays well under the file's 64 MiB.
    assert after - before < file_kib * 5 // 8, (before, quarter, after)
