"""Several full batches gathered by one call (``batch.batches_per_gather``) against the oracle.

Each batch of such a gather is a view of one array: values, order, resume and the pool's promise
(an array a caller still holds a batch of is never written again) must be those of one gather per
batch, on torch's path (pooled arrays) and numpy's (fresh arrays).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows import batch as batch_module
from dask_windows.batch import PathChoice, batches_per_gather

FEATURES = ["f0", "f1", "f2"]
TARGETS = ["y", "z"]
WINDOW, BATCH = 16, 24
BATCH_BYTES = BATCH * WINDOW * len(FEATURES) * 4


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=11, num_files=4, num_series=12, min_len=20, max_len=300)


@pytest.fixture(scope="module")
def full(frames):
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("chunks")
    write_parquet(frames, str(path), row_group_size=97)
    return str(path)


@pytest.fixture(params=["torch", "numpy"])
def path(request, monkeypatch):
    """torch's pooled gather for every call, or numpy's fresh arrays for every call."""
    monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 1 << 62 if request.param == "numpy" else 0)
    monkeypatch.setattr(batch_module, "_threads", lambda: 2)
    monkeypatch.setattr(PathChoice, "torch_next", lambda self: True)
    return request.param


def per_gather(monkeypatch, batches: int) -> None:
    """Make the stream gather ``batches`` full batches per call (1: one call per batch)."""
    monkeypatch.setattr(batch_module, "GATHER_BYTES", batches * BATCH_BYTES)


def make(root, **kw):
    args = dict(features=FEATURES, series="sid", window=WINDOW, batch_size=BATCH, return_index=True, seed=3)
    args.update(kw)
    return dw.WindowDataset(root, **args)


def expected_x(full, rows, layout="NCL"):
    feats = full[FEATURES].to_numpy(np.float32)
    out = feats[np.asarray(rows)[:, None] + np.arange(WINDOW)]  # (B, L, C)
    return out.transpose(0, 2, 1) if layout == "NCL" else out


def expected_y(full, rows, horizon):
    tg = full[TARGETS].to_numpy(np.float32)
    rows = np.asarray(rows)
    if horizon:
        return tg[rows[:, None] + WINDOW + np.arange(horizon)].transpose(0, 2, 1)  # (B, T, H)
    return tg[rows + WINDOW - 1]


def copies(ds):
    return [tuple(t.numpy().copy() for t in b) for b in ds]


def test_batches_per_gather_fills_the_limit_with_whole_batches():
    assert batches_per_gather(128 << 10, 1 << 20) == 8
    assert batches_per_gather(300, 1000) == 3
    assert batches_per_gather(2 << 20, 1 << 20) == 1  # a large batch: one per call
    assert batches_per_gather(0, 1 << 20) == 1 << 20
    assert batches_per_gather(5, 0) == 1


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("horizon,targets,normalize", [(0, False, None), (0, True, "sample"), (3, True, None)])
def test_batches_gathered_together_equal_one_gather_each_and_the_oracle(
    full, root, path, monkeypatch, layout, horizon, targets, normalize
):
    kw = dict(layout=layout, horizon=horizon, targets=TARGETS if targets else None, normalize=normalize)
    kw.update(buffer_partitions=1)  # batches straddle buffers: the carry path next to the gathers of several
    per_gather(monkeypatch, 1)
    single = copies(make(root, **kw))
    for batches in (3, 1000):
        per_gather(monkeypatch, batches)
        kept = list(make(root, **kw))  # every batch held at once
        assert len(kept) == len(single) > 20
        for got, want in zip(kept, single):
            assert got[0].is_contiguous()
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a.numpy(), b)
            rows = got[-1].numpy()
            if normalize is None:
                np.testing.assert_array_equal(got[0].numpy(), expected_x(full, rows, layout))
            if targets:
                np.testing.assert_array_equal(got[1].numpy(), expected_y(full, rows, horizon))
    rows = np.concatenate([b[-1] for b in single])
    assert len(np.unique(rows)) == len(rows) == make(root, **kw).num_windows


@pytest.mark.parametrize("keep", ["middle view", "last numpy", "every other", "none"])
def test_a_held_batch_of_a_gather_is_never_overwritten(full, root, path, monkeypatch, keep):
    per_gather(monkeypatch, 3)
    ds = make(root, buffer_partitions=2)
    kept, pointers = [], set()
    for n, (x, idx) in enumerate(ds):
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy()))
        pointers.add(x.data_ptr())
        if keep == "middle view" and n % 3 == 1:
            kept.append((x[1:3], idx[1:3].clone()))
        elif keep == "last numpy" and n % 3 == 2:
            kept.append((x.numpy(), idx.clone()))
        elif keep == "every other" and n % 2 == 0:
            kept.append((x, idx))
        del x, idx
    assert n + 1 == len(ds) > 30
    for x, idx in kept:
        np.testing.assert_array_equal(np.asarray(x), expected_x(full, idx.numpy()))
    if keep == "none" and path == "torch":
        # nothing held: the stream's few pooled arrays are written again and again (3 batches each)
        assert len(pointers) <= 3 * 4


def test_resume_in_the_middle_of_a_gather_gives_the_uninterrupted_rest(root, path, monkeypatch):
    per_gather(monkeypatch, 4)
    whole = copies(make(root, targets=TARGETS))
    for taken in (1, 5, 6, len(whole) - 1):
        ds = make(root, targets=TARGETS)
        it = iter(ds)
        for _ in range(taken):
            next(it)
        state = ds.state_dict()
        del it
        again = make(root, targets=TARGETS)
        again.load_state_dict(state)
        rest = copies(again)
        assert len(rest) == len(whole) - taken
        for got, want in zip(rest, whole[taken:]):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)


def test_a_large_batch_is_gathered_alone(root, monkeypatch):
    monkeypatch.setattr(batch_module, "GATHER_BYTES", BATCH_BYTES - 1)
    sizes = []
    original = batch_module.Gatherer.features

    def spy(self, starts, pool=None, reserve=0):
        sizes.append(len(starts))
        return original(self, starts, pool, reserve)

    monkeypatch.setattr(batch_module.Gatherer, "features", spy)
    ds = make(root)
    assert len(list(ds)) == len(ds)
    assert max(sizes) == BATCH and sum(sizes) == ds.num_windows
    sizes.clear()
    monkeypatch.setattr(batch_module, "GATHER_BYTES", 4 * BATCH_BYTES)
    assert len(list(make(root))) == len(ds)
    assert max(sizes) == 4 * BATCH and sum(sizes) == ds.num_windows


def test_dataloader_workers_keep_one_gather_per_batch(full, root, monkeypatch):
    per_gather(monkeypatch, 5)
    ds = make(root, targets=TARGETS)
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    assert len(kept) == len(ds)
    for x, y, idx in kept:
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy()))
        np.testing.assert_array_equal(y.numpy(), expected_y(full, idx.numpy(), 0))
