"""Runs of full batches (``pipeline.stream`` with ``Gatherer.gather_for``) against the oracle.

The stream cuts a buffer's full batches as one run whose gather is chosen once (numpy's own
indexing, ``Gatherer.features`` with scaling or slots): values, order, resume and the pool's
promise (an array a caller still holds a batch of is never written again) must be those of the
oracle, on numpy's path (fresh arrays) and torch's copy into a slot pool's arrays (pooled).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows.runtime.batch import Gatherer, OutputPool
from dask_windows.runtime.normalize import standardize_windows

FEATURES = ["f0", "f1", "f2"]
TARGETS = ["y", "z"]
WINDOW, BATCH = 16, 24


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


@pytest.fixture(params=["numpy", "slots"])
def path(request, monkeypatch):
    """numpy's fresh arrays for every call, or torch's copy into pooled arrays (as into a DataLoader worker's slots)."""
    if request.param == "slots":
        monkeypatch.setattr(OutputPool, "direct_bytes", 0, raising=False)
    return request.param


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


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("horizon,targets,normalize", [(0, False, None), (0, True, "sample"), (3, True, None)])
@pytest.mark.parametrize("buffer_partitions", [1, 3])
def test_every_batch_equals_the_oracle(full, root, path, layout, horizon, targets, normalize, buffer_partitions):
    kw = dict(layout=layout, horizon=horizon, targets=TARGETS if targets else None, normalize=normalize)
    ds = make(root, buffer_partitions=buffer_partitions, **kw)  # 1: batches straddle buffers (the carry path)
    kept = list(ds)  # every batch held at once
    assert len(kept) == len(ds) > 20
    for got in kept:
        assert got[0].is_contiguous() and got[0].shape[0] <= BATCH
        rows = got[-1].numpy()
        want = expected_x(full, rows, layout)
        if normalize == "sample":  # from the pool's window table: within its tolerance (runtime.window_table)
            want = standardize_windows(np.ascontiguousarray(want), layout == "NCL", 1e-8)
            np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-4, atol=2e-4)
        else:
            np.testing.assert_array_equal(got[0].numpy(), want)
        if targets:
            np.testing.assert_array_equal(got[1].numpy(), expected_y(full, rows, horizon))
    rows = np.concatenate([b[-1].numpy() for b in kept])
    assert len(np.unique(rows)) == len(rows) == ds.num_windows


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_gather_for_gives_what_features_gives(layout):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((3, 500)).astype(np.float32)
    x = data if layout == "NCL" else np.ascontiguousarray(data.T)
    mean, std = rng.standard_normal(3).astype(np.float32), rng.uniform(1, 2, 3).astype(np.float32)
    slot_like = OutputPool()
    slot_like.direct_bytes = 0  # type: ignore[attr-defined]  # a pool of shared slots: Gatherer.features
    for scale in [(None, None), (mean, std)]:
        for pool in [OutputPool(), slot_like]:
            gatherer = Gatherer(x, None, 20, 0, layout, *scale)
            gather = gatherer.gather_for(7, pool)
            assert (gather == gatherer._numpy) == (scale[0] is None and pool is not slot_like)
            for _ in range(3):
                starts = rng.integers(0, 481, 7)
                want = data[:, starts[:, None] + np.arange(20)].transpose(1, 0, 2)  # (B, C, L)
                want = want if layout == "NCL" else want.transpose(0, 2, 1)
                if scale[0] is not None:
                    shape = (1, -1, 1) if layout == "NCL" else (1, 1, -1)
                    want = (want - mean.reshape(shape)) * (1 / std).reshape(shape)
                got = gather(starts)
                assert got.flags.c_contiguous
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
                np.testing.assert_array_equal(got, gatherer.features(starts, OutputPool()))


@pytest.mark.parametrize("keep", ["middle view", "last numpy", "every other", "none"])
def test_a_held_batch_of_a_run_is_never_overwritten(full, root, path, keep):
    ds = make(root, buffer_partitions=2)
    kept, pointers = [], []
    for n, (x, idx) in enumerate(ds):
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy()))
        pointers.append(x.data_ptr())
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
    if keep == "none" and path == "slots":
        # nothing held: the stream's pooled arrays are written again and again
        assert len(pointers) - len(set(pointers)) > len(pointers) // 2


def test_resume_in_the_middle_of_a_run_gives_the_uninterrupted_rest(root, path):
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


def test_the_gather_is_chosen_once_per_run_of_full_batches(root, path, monkeypatch):
    sizes, chosen = [], []
    original = Gatherer.gather_for

    def spy(self, size, pool):
        gather = original(self, size, pool)
        chosen.append(size)

        def counted(starts):
            sizes.append(len(starts))
            return gather(starts)

        return counted

    monkeypatch.setattr(Gatherer, "gather_for", spy)
    ds = make(root, buffer_partitions=2)
    assert len(list(ds)) == len(ds) > 30
    assert set(chosen) == {BATCH} and set(sizes) == {BATCH}
    assert len(chosen) <= 4 < len(sizes)  # a run per buffer (and the first buffer's head): not per batch
    assert len(sizes) >= len(ds) - 2 * len(chosen)  # all but a buffer's last partial batches


def test_through_dataloader_workers(full, root):
    ds = make(root, targets=TARGETS)
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    assert len(kept) == len(ds)
    for x, y, idx in kept:
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy()))
        np.testing.assert_array_equal(y.numpy(), expected_y(full, idx.numpy(), 0))
