"""Dropped buffers' memory reused by the next buffers (``spares``).

The pool hands memory out again only when no array, view or tensor of it is left: checked directly
(weak references and ``np.shares_memory``), and through whole passes whose batches are all kept and
compared with the brute-force oracle (a batch overwritten by a later buffer would differ) and with
the same pass without reuse, bit for bit.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import collect, make_frames, oracle_starts, write_parquet

import dask_windows as dw
from dask_windows.runtime import reading
from dask_windows.speedups import spares
from dask_windows.speedups.spares import Spares

SHAPE = (4, 1 << 18)  # 4 MiB of float32: above MIN_BYTES


def test_memory_is_reused_only_once_every_view_and_tensor_is_dropped():
    pool = Spares()
    a = pool.empty(SHAPE, np.float32)
    a[:] = 1
    first = a.ctypes.data  # where the first array's memory begins
    view = a[1:3, 5:]
    tensor = torch.from_numpy(a)[2:]
    back = tensor.numpy()
    del a
    fresh = []  # kept: they never go back to the pool
    for holder in ("view", "tensor", "back"):
        assert pool.waiting == 0, f"given back while {holder} is alive"
        fresh.append(pool.empty(SHAPE, np.float32))  # fresh memory while the first array is held
        assert pool.reused == 0
        assert abs(fresh[-1].ctypes.data - first) >= fresh[-1].nbytes  # not the held memory
        if holder == "view":
            del view
        elif holder == "tensor":
            del tensor
        else:
            del back
    assert pool.waiting == 1
    c = pool.empty(SHAPE, np.float32)
    assert pool.reused == 1 and pool.waiting == 0 and c.ctypes.data == first
    assert c.shape == SHAPE and c.dtype == np.float32 and c.flags.c_contiguous and c.flags.writeable


def test_a_reused_array_is_like_np_empty_of_its_shape_and_dtype():
    pool = Spares()
    first = pool.empty((3, 1 << 18), np.float32)
    del first
    for shape, dtype in [((1 << 17, 6), np.float64), ((2, 1 << 18), np.int64)]:
        out = pool.empty(shape, dtype)
        assert out.shape == shape and out.dtype == dtype and out.flags.c_contiguous
        out[...] = np.arange(out.size, dtype=dtype).reshape(shape)
        assert np.array_equal(out.ravel(), np.arange(out.size, dtype=dtype))
        del out


def test_keep_bounds_the_pool_and_a_much_larger_block_is_not_pinned_to_a_small_array():
    pool = Spares(keep=2)
    arrays = [pool.empty(SHAPE, np.float32) for _ in range(3)]
    del arrays
    assert pool.waiting == 2
    small = pool.empty((SHAPE[0], SHAPE[1] // 4), np.float32)  # 1 MiB: the 4 MiB blocks are too large
    assert pool.reused == 0 and pool.waiting == 2
    del small
    large = pool.empty((SHAPE[0], SHAPE[1] * 2), np.float32)  # larger than every block: fresh
    assert pool.reused == 0
    del large
    assert pool.empty(SHAPE, np.float32) is not None and pool.reused == 1


def test_small_arrays_are_plain_np_empty():
    pool = Spares()
    a = pool.empty((10, 10), np.float32)
    assert a.base is None and a.shape == (10, 10)
    del a
    assert pool.waiting == 0


def test_arrays_dropped_on_other_threads_come_back():
    pool = Spares(keep=4)
    arrays = [pool.empty(SHAPE, np.float32) for _ in range(4)]
    threads = [threading.Thread(target=lambda k=k: arrays.__setitem__(k, None)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert pool.waiting == 4


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=10, num_series=12, min_len=300, max_len=900)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("spares")
    write_parquet(frames, str(path), row_group_size=150)
    return str(path)


class _Counted(Spares):
    made: ClassVar[list[Spares]] = []

    def __init__(self, keep: int = 2, slack: float = 1.25) -> None:
        super().__init__(keep, slack=1e9)  # any larger block serves: the files have random sizes
        _Counted.made.append(self)


def _pass(root, monkeypatch, reuse: bool, **kw):
    monkeypatch.setattr(spares, "MIN_BYTES", 0 if reuse else 1 << 62)  # every buffer's arrays, or none
    monkeypatch.setattr(reading, "Spares", _Counted)
    _Counted.made = []
    args = dict(features=["f0", "f1", "f2"], series="sid", window=16, batch_size=8, return_index=True)
    args.update(dict(pieces_per_partition=1, buffer_partitions=1, prefetch_partitions=1, seed=3), **kw)
    return collect(dw.WindowDataset(root, **args)), sum(p.reused for p in _Counted.made)


@pytest.mark.parametrize(
    "kw",
    [
        dict(stride=16),
        dict(stride=3, layout="NLC", targets=["y", "z"]),
        dict(stride=16, pieces_per_partition=8, buffer_partitions=2),  # the piece order (its former default)
        dict(stride=5, prefetch_partitions=2, targets=["y"], horizon=2),
    ],
)
def test_passes_reusing_buffers_memory_yield_the_oracles_windows(frames, root, monkeypatch, kw):
    batches, reused = _pass(root, monkeypatch, True, **kw)
    assert reused > 0  # later buffers were decoded into earlier buffers' memory
    window, stride, horizon = 16, kw["stride"], kw.get("horizon", 0)
    full = pd.concat(frames, ignore_index=True)
    feats = full[["f0", "f1", "f2"]].to_numpy(np.float32)
    targets = kw.get("targets", [])
    for b in batches:  # every batch kept until now: none was overwritten by a later buffer
        x, idx = b[0], b[-1]
        expect = feats[idx[:, None] + np.arange(window)]  # (B, L, C)
        assert np.array_equal(x, expect if kw.get("layout") == "NLC" else expect.transpose(0, 2, 1))
        if targets:
            tg = full[targets].to_numpy(np.float32)
            if horizon:
                assert np.array_equal(b[1], tg[idx[:, None] + window + np.arange(horizon)].transpose(0, 2, 1))
            else:
                assert np.array_equal(b[1], tg[idx + window - 1])
    idx = np.sort(np.concatenate([b[-1] for b in batches]))
    assert np.array_equal(idx, oracle_starts(frames, "sid", window, stride, horizon))
    plain, none = _pass(root, monkeypatch, False, **kw)
    assert none == 0 and len(plain) == len(batches)
    for a, b in zip(plain, batches):  # the same batches, in the same order, bit for bit
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_an_array_dropped_while_its_thread_holds_the_pools_lock_comes_back_without_a_deadlock():
    # As when a garbage collection, started by an allocation inside ``_take``, frees a buffer.
    pool = Spares()
    arrays = [pool.empty(SHAPE, np.float32)]

    def drop_under_lock():
        with pool._lock:
            arrays.clear()  # the last reference: the finalizer runs here, in this thread

    thread = threading.Thread(target=drop_under_lock, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the finalizer waited for the lock its own thread holds"
    assert pool.waiting == 1
