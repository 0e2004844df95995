"""The gather (numpy's, and torch's into a slot) and its reused output arrays against a brute-force oracle.

Every batch a caller still holds - whole, as a view, as ``.numpy()``, modified in place, through
a DataLoader with pinned memory or worker processes - must keep the values it was yielded with,
however many batches come after it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows.runtime.batch import Gatherer, OutputPool

FEATURES = ["f0", "f1", "f2"]
TARGETS = ["y", "z"]


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=4, num_series=12, min_len=20, max_len=260)


@pytest.fixture(scope="module")
def full(frames):
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("gather")
    write_parquet(frames, str(path), row_group_size=101)
    return str(path)


@pytest.fixture(params=["numpy", "slots"])
def path(request, monkeypatch):
    """numpy's fresh arrays for every call, or torch's copy into pooled arrays (as into a DataLoader worker's slots)."""
    if request.param == "slots":
        monkeypatch.setattr(OutputPool, "direct_bytes", 0, raising=False)
    return request.param


def make(root, **kw):
    args = dict(features=FEATURES, series="sid", window=16, batch_size=24, return_index=True, seed=2)
    args.update(kw)
    return dw.WindowDataset(root, **args)


def expected_x(full, rows, window, layout="NCL"):
    """``(B, C, L)`` or ``(B, L, C)`` features of the windows starting at global ``rows``."""
    feats = full[FEATURES].to_numpy(np.float32)
    out = feats[np.asarray(rows)[:, None] + np.arange(window)]  # (B, L, C)
    return out.transpose(0, 2, 1) if layout == "NCL" else out


def expected_y(full, rows, window, horizon):
    tg = full[TARGETS].to_numpy(np.float32)
    rows = np.asarray(rows)
    if horizon:
        return tg[rows[:, None] + window + np.arange(horizon)].transpose(0, 2, 1)  # (B, T, H)
    return tg[rows + window - 1]


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("stride,horizon,targets", [(1, 0, False), (1, 0, True), (3, 4, True), (1, 5, True)])
def test_kept_batches_equal_the_oracle(full, root, path, layout, stride, horizon, targets):
    ds = make(root, window=16, stride=stride, horizon=horizon, layout=layout, targets=TARGETS if targets else None)
    kept = list(ds)  # every batch held at once: no array may be reused under them
    assert len(kept) == len(ds) > 10
    rows = np.concatenate([b[-1].numpy() for b in kept])
    assert len(np.unique(rows)) == len(rows) == ds.num_windows
    for batch in kept:
        x, idx = batch[0], batch[-1].numpy()
        assert x.is_contiguous() and x.dtype == torch.float32
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx, 16, layout))
        if targets:
            np.testing.assert_array_equal(batch[1].numpy(), expected_y(full, idx, 16, horizon))


@pytest.mark.parametrize("keep", ["view", "numpy", "inplace", "storage", "none"])
def test_what_the_caller_keeps_is_never_overwritten(full, root, path, keep):
    ds = make(root, window=16, buffer_partitions=1)  # batches straddle buffers: the carry path too
    kept = []
    checked = 0
    for x, idx in ds:
        # every batch is right when it arrives, whatever was reused for it
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy(), 16))
        if keep == "view":
            kept.append((x[0:1], idx[0:1].clone()))
        elif keep == "numpy":
            kept.append((x.numpy(), idx.clone()))
        elif keep == "inplace":
            x.mul_(2)
            kept.append((x, idx.clone()))
        elif keep == "storage":
            kept.append((x.untyped_storage(), x.shape, idx.clone()))
        checked += 1
    assert checked == len(ds) > 10
    for item in kept:
        idx = item[-1].numpy()
        if keep == "storage":
            storage, shape = item[0], item[1]
            x = torch.empty(0).set_(storage).view(shape).numpy()
        else:
            x = np.asarray(item[0])
        scale = 2 if keep == "inplace" else 1
        np.testing.assert_array_equal(x, scale * expected_x(full, idx, 16))


@pytest.mark.filterwarnings("ignore:.*pin_memory:UserWarning")  # pinning needs an accelerator
@pytest.mark.parametrize("loader", [dict(pin_memory=True), dict(num_workers=2), dict(num_workers=1, prefetch_factor=4)])
def test_through_a_dataloader_every_kept_batch_equals_the_oracle(full, root, path, loader):
    ds = make(root, window=16, targets=TARGETS, horizon=3, layout="NLC")
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, **loader))
    assert len(kept) == len(ds)
    rows = np.concatenate([b[-1].numpy() for b in kept])
    assert len(np.unique(rows)) == ds.num_windows
    for x, y, idx in kept:
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy(), 16, "NLC"))
        np.testing.assert_array_equal(y.numpy(), expected_y(full, idx.numpy(), 16, 3))


def test_integer_targets_and_arrays_source():
    rows = 3_000
    frame = pd.DataFrame(
        {"a": np.arange(rows, dtype=np.float32), "b": -np.arange(rows, dtype=np.float32), "label": np.arange(rows) % 5}
    )
    ds = dw.WindowDataset(frame, features=["a", "b"], targets=["label"], window=40, batch_size=64, return_index=True)
    kept = list(ds)
    assert sum(len(b[0]) for b in kept) == ds.num_windows == rows - 39
    for x, y, idx in kept:
        idx = idx.numpy()
        assert y.dtype == torch.int64
        np.testing.assert_array_equal(x[:, 0].numpy(), idx[:, None] + np.arange(40, dtype=np.float32))
        np.testing.assert_array_equal(x[:, 1].numpy(), -(idx[:, None] + np.arange(40, dtype=np.float32)))
        np.testing.assert_array_equal(y[:, 0].numpy(), (idx + 39) % 5)


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_gatherer_torch_path_equals_fancy_indexing(layout):
    rng = np.random.default_rng(0)
    channels, rows, window = 5, 3_000, 33
    data = rng.standard_normal((channels, rows)).astype(np.float32)
    x = data if layout == "NCL" else np.ascontiguousarray(data.T)
    mean, std = rng.standard_normal(channels).astype(np.float32), rng.uniform(1, 3, channels).astype(np.float32)
    pool = OutputPool()
    pool.direct_bytes = 0  # type: ignore[attr-defined]  # a pool of shared slots: torch gathers into its arrays
    for starts in [rng.integers(0, rows - window + 1, 100), np.array([0, rows - window]), np.zeros(0, np.int64)]:
        for scale in [(None, None), (mean, std)]:
            got = Gatherer(x, None, window, 0, layout, *scale).features(starts.astype(np.int32), pool)
            want = Gatherer(x, None, window, 0, layout, *scale).features(starts)
            assert got.flags.c_contiguous and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_pool_reuses_only_arrays_nobody_references():
    pool = OutputPool(capacity=2)
    a = pool.take((4, 3), np.float32)
    a_id = id(a)
    del a
    assert id(pool.take((4, 3), np.float32)) == a_id  # free again: reused
    assert pool.take((4, 2), np.float32).shape == (4, 2)  # another shape: its own arrays
    holders = {
        "array": lambda arr: arr,
        "tensor": torch.from_numpy,
        "tensor view": lambda arr: torch.from_numpy(arr)[1:2],
        "tensor .numpy()": lambda arr: torch.from_numpy(arr).numpy(),
        "numpy view": lambda arr: arr[0],
        "storage": lambda arr: torch.from_numpy(arr).untyped_storage(),
    }
    for name, hold in holders.items():
        first = pool.take((4, 3), np.float32)
        held = hold(first)
        first_id = id(first)
        del first
        other = pool.take((4, 3), np.float32)
        assert id(other) != first_id, name
        del other
        del held
        assert id(pool.take((4, 3), np.float32)) == first_id, name  # released: reused


def test_pool_hands_out_fresh_arrays_when_all_are_held():
    pool = OutputPool(capacity=2)
    held = [pool.take((8,), np.float32) for _ in range(5)]
    assert len({id(a) for a in held}) == 5
    assert len(pool._arrays[((8,), np.dtype(np.float32).str)]) == 2  # only `capacity` are kept


def test_only_a_slot_pool_gets_torch_s_copy_into_its_array():
    x = np.arange(4 * 400, dtype=np.float32).reshape(4, 400)
    for direct in [None, 0]:
        pool = OutputPool()
        if direct is not None:
            pool.direct_bytes = direct  # type: ignore[attr-defined]
        out = Gatherer(x, None, 10, 0, "NCL").features(np.array([0, 5, 390]), pool)
        assert any(a is out for arrays in pool._arrays.values() for a in arrays) == (direct is not None)
        np.testing.assert_array_equal(out[2, 3], x[3, 390:400])
