"""ReadPool: results in key order from real worker processes, errors as themselves, nothing left behind."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from dask_windows.buffer import Part
from dask_windows.errors import SourceReadError
from dask_windows.readpool import ReadPool

ROWS = 50_000  # (4, ROWS) float32 = 800 kB: travels through shared memory


def read(i: int) -> Part:
    if i < 0:
        raise SourceReadError(f"s3://bucket/part-{-i}.parquet is unreadable: boom; check the object")
    x = np.arange(4 * ROWS, dtype=np.float32).reshape(4, ROWS) + i
    y = np.full((1, 10), i, np.int64)  # small: pickled inline
    return Part(i, f"part-{i}", x, y, np.zeros(0, np.int64), np.array([i], np.int64))


def kill_self(i: int) -> Part:
    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return read(i)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("workers,depth", [(1, 1), (2, 2), (2, 5), (3, 1)])
def test_results_arrive_in_key_order_with_equal_values(workers, depth):
    keys = [5, 0, 3, 3, 9, 1, 2]
    got = list(ReadPool(read, keys, workers, depth=depth, multiprocessing_context="fork"))
    assert [p.index for p in got] == keys
    for key, part in zip(keys, got):
        expect = read(key)
        np.testing.assert_array_equal(part.x, expect.x)
        np.testing.assert_array_equal(part.y, expect.y)
        np.testing.assert_array_equal(part.nan_y, expect.nan_y)
        assert part.name == expect.name and part.x.dtype == np.float32 and part.x.shape == (4, ROWS)


def test_an_error_in_a_worker_is_raised_as_itself_and_stops_the_pool():
    pool = ReadPool(read, [0, 1, -7, 3], 2, multiprocessing_context="fork")
    taken = []
    with pytest.raises(SourceReadError, match=r"s3://bucket/part-7\.parquet is unreadable"):
        for part in pool:
            taken.append(part.index)
    assert taken == [0, 1] and not pool.alive


def test_a_killed_worker_is_an_error_not_a_hang_and_leaves_no_shared_memory():
    before = shm_entries()
    pool = ReadPool(kill_self, [0, 1, 2, 3, 4], 2, multiprocessing_context="fork", timeout=120)
    with pytest.raises(RuntimeError, match="worker"):
        list(pool)
    assert not pool.alive
    assert shm_entries() - before == set()


def test_early_close_stops_workers():
    pool = ReadPool(read, list(range(20)), 2, multiprocessing_context="fork")
    assert next(pool).index == 0
    pool.close()
    assert not pool.alive
    with pytest.raises(StopIteration):
        next(pool)


def test_forkserver_workers_start_and_no_keys_means_no_workers():
    assert [p.index for p in ReadPool(read, [1, 2], 1)] == [1, 2]
    empty = ReadPool(read, [], 2)
    assert list(empty) == [] and not empty.alive
    with pytest.raises(ValueError, match="num_workers=0"):
        ReadPool(read, [1], 0)


def test_read_workers_yield_exactly_what_the_thread_yields(tmp_path):
    import pandas as pd

    from dask_windows.dataset import WindowDataset

    rng = np.random.default_rng(3)
    for f in range(3):
        n = 3_000
        frame = pd.DataFrame(
            {
                "a": rng.standard_normal(n).astype(np.float32),
                "b": np.arange(n, dtype=np.float32),
                "sid": np.repeat([f * 2, f * 2 + 1], n // 2),
            }
        )
        frame.to_parquet(tmp_path / f"p{f}.parquet", row_group_size=700)
    kw = dict(features=["a", "b"], series="sid", window=16, stride=3, batch_size=64, return_index=True, seed=5)
    plain = [tuple(t.clone() for t in b) for b in WindowDataset(str(tmp_path), **kw)]
    pooled = WindowDataset(str(tmp_path), read_workers=2, **kw)
    assert pooled.read_workers == 2
    got = list(pooled)
    assert len(got) == len(plain)
    for (x0, i0), (x1, i1) in zip(plain, got):
        assert (i0 == i1).all() and (x0 == x1).all()
    with pytest.raises(ValueError, match="read_workers"):
        WindowDataset(str(tmp_path), read_workers=-1, **kw)
