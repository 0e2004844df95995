"""The background pipeline (reader thread, builder thread) of whole partitions and the default order against
brute force."""

from __future__ import annotations

import gc
import os
import traceback

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_frames, oracle_starts, threads_started_here, write_parquet

import dask_windows as dw
from dask_windows.errors import DataError
from dask_windows.planning.mixing import plan_batches


def loader_threads() -> list[str]:
    return [t.name for t in threads_started_here("dask-windows-")]


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=3, num_files=4, num_series=6, min_len=1500, max_len=3000)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("pipeline")
    write_parquet(frames, str(path), row_group_size=700)
    return str(path)


def make(root, **kw):
    args = dict(features=["f0", "f1"], targets=["y"], series="sid", window=6, batch_size=64, return_index=True)
    args["pieces_per_partition"] = (
        1  # whole partitions (a pool of buffer_partitions of them; the default: test_pool_plan)
    )
    args.update(kw)
    return dw.WindowDataset(root, **args)


def epoch(ds) -> list[tuple[np.ndarray, ...]]:
    return [tuple(t.numpy() for t in batch) for batch in ds]


@pytest.mark.parametrize("buffer_partitions", [1, 2])
@pytest.mark.parametrize("pieces", [1, None])
def test_every_window_once_values_and_order_are_the_same_with_or_without_threads(
    frames, root, buffer_partitions, pieces
):
    full = np.concatenate(frames)  # columns: sid, ts, f0, f1, f2, y, z
    f0, y = full[:, 2].astype(np.float32), full[:, 5].astype(np.float32)
    runs = {}
    for prefetch in (0, 1, 2):
        ds = make(root, buffer_partitions=buffer_partitions, prefetch_partitions=prefetch, pieces_per_partition=pieces)
        runs[prefetch] = epoch(ds)
        assert len(runs[prefetch]) == len(ds)
    for prefetch in (1, 2):  # bit for bit the same batches, in the same order
        assert len(runs[prefetch]) == len(runs[0])
        for a, b in zip(runs[0], runs[prefetch]):
            assert all(np.array_equal(p, q) for p, q in zip(a, b))
    rows = np.concatenate([b[-1] for b in runs[1]])
    assert np.array_equal(np.sort(rows), oracle_starts(frames, "sid", 6))  # every window exactly once
    x = np.concatenate([b[0] for b in runs[1]])
    assert np.array_equal(x[:, 0], f0[rows[:, None] + np.arange(6)])  # the rows each window claims
    assert np.array_equal(np.concatenate([b[1] for b in runs[1]])[:, 0], y[rows + 5])
    ds = make(root, buffer_partitions=buffer_partitions, pieces_per_partition=pieces)
    planned = list(plan_batches(ds))  # the order computed from the plan and the seed alone
    assert all(np.array_equal(p, b[-1]) for p, b in zip(planned, runs[1])) and len(planned) == len(runs[1])


def test_same_seed_and_epoch_same_batches_other_epoch_other_order(root):
    a, b = epoch(make(root, seed=5)), epoch(make(root, seed=5))
    assert all(np.array_equal(p[-1], q[-1]) for p, q in zip(a, b))
    other = make(root, seed=5)
    other.set_epoch(1)
    assert not np.array_equal(np.concatenate([p[-1] for p in a]), np.concatenate([p[-1] for p in epoch(other)]))


@pytest.mark.parametrize("stop", [1, 3, 70])  # in the first step, past it, a later one
def test_resume_yields_exactly_the_rest(root, stop):
    kw = dict(buffer_partitions=2, pieces_per_partition=1, batch_size=32)
    full = epoch(make(root, **kw))
    ds = make(root, **kw)
    it = iter(ds)
    for _ in range(stop):
        next(it)
    state = ds.state_dict()
    it.close()
    again = make(root, **kw)
    again.load_state_dict(state)
    rest = epoch(again)
    assert len(rest) == len(full) - stop
    assert all(np.array_equal(p[-1], q[-1]) and np.array_equal(p[0], q[0]) for p, q in zip(rest, full[stop:]))


def test_an_error_in_the_builder_thread_surfaces_in_the_consumer(tmp_path):
    values = np.arange(4000, dtype=np.float32)
    values[3333] = np.nan
    for i, part in enumerate(np.array_split(values, 4)):
        pq.write_table(pa.table({"f0": part}), tmp_path / f"p{i}.parquet")
    ds = dw.WindowDataset(
        str(tmp_path), features=["f0"], series=None, window=8, batch_size=16, shuffle=False, pieces_per_partition=1
    )
    with pytest.raises(DataError, match="NaN") as info:
        for _ in ds:
            pass
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_check_nan" in frames  # raised where the step was built, traceback kept
    assert not loader_threads()


def test_no_thread_left_after_break_exhaustion_or_garbage_collection(root):
    ds = make(root, prefetch_partitions=2, pieces_per_partition=1, buffer_partitions=1)
    it = iter(ds)
    next(it)
    assert "dask-windows-build" in loader_threads() and "dask-windows-pool" in loader_threads()
    it.close()
    assert not loader_threads()
    list(ds)  # exhausted: only the next pass's read-ahead is left (nextpass), until close()
    left = {"dask-windows-pool", "dask-windows-next-pass"}
    assert set(loader_threads()) <= left
    ds.close()
    assert not loader_threads()
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    assert not loader_threads()
    for _ in ds:  # a break in a for loop
        break
    gc.collect()
    assert not loader_threads()


def test_an_iterator_left_open_at_exit_ends_quietly(root):
    """``next(iter(ds))`` at the end of a script: the pass is closed while the interpreter exits."""
    import subprocess
    import sys

    code = (
        "import dask_windows as dw\n"
        f"ds = dw.WindowDataset({root!r}, features=['f0', 'f1'], series='sid', window=6, batch_size=64, pieces_per_partition=1)\n"
        "it = iter(ds)\n"
        "x = next(it)\n"
        "print(tuple(x.shape))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__)))))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "(64, 2, 6)", out.stderr[-2000:]
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
