"""numpy's run gather against a brute-force oracle.

``batch._run_gather`` indexes a 2-D view of every contiguous run of the buffer (``(C * rows - L + 1,
L)`` channel-major, ``(rows - L + 1, L * C)`` row-major): each batch must be the windows cut by hand,
for both layouts, windows at both ends of every channel, empty batches, int32 and int64 starts.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_frames, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.runtime import batch as batch_module
from dask_windows.runtime.batch import Gatherer, _run_gather

FEATURES = ["f0", "f1", "f2"]
WINDOW = 16


def oracle(data: np.ndarray, starts: np.ndarray, window: int, channel_major: bool) -> np.ndarray:
    """``(B, C, L)`` (or ``(B, L, C)``) cut window by window from ``(C, rows)`` (or ``(rows, C)``)."""
    rows = data.T if channel_major else data  # (rows, C)
    out = np.stack([rows[s : s + window] for s in starts]) if len(starts) else np.empty((0, window, rows.shape[1]))
    return out.transpose(0, 2, 1) if channel_major else out


@settings(max_examples=200, deadline=None)
@given(
    channels=st.integers(1, 5),
    rows=st.integers(1, 60),
    window=st.integers(1, 60),
    picks=st.lists(st.integers(0, 10**6), max_size=40),
    channel_major=st.booleans(),
    wide=st.booleans(),
)
def test_run_gather_cuts_every_window_as_the_oracle(channels, rows, window, picks, channel_major, wide):
    data = np.arange(channels * rows, dtype=np.float32).reshape((channels, rows) if channel_major else (rows, channels))
    data = data * 0.5 - 3.0  # every value distinct: a run read from the wrong place cannot match
    gather = _run_gather(data, window, channel_major)
    if rows < window:
        assert gather is None
        return
    assert gather is not None
    count = rows - window + 1
    starts = np.array([p % count for p in picks] + [0, count - 1], np.int64 if wide else np.int32)  # both ends
    got = gather(starts)
    assert got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_array_equal(got, oracle(data, starts, window, channel_major))
    assert gather(starts[:0]).shape == ((0, channels, window) if channel_major else (0, window, channels))


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_gatherer_numpy_path_equals_the_oracle_and_a_view_falls_back(layout):
    rng = np.random.default_rng(7)
    whole = rng.standard_normal((3, 400)).astype(np.float32)
    channel_major = layout == "NCL"
    for x in (whole, whole[:, 10:390]) if channel_major else (whole.T.copy(), whole.T[:, :2]):
        gatherer = Gatherer(x, None, WINDOW, 0, layout)
        starts = rng.integers(0, x.shape[1 if channel_major else 0] - WINDOW + 1, 50)
        # A buffer that is not one contiguous array keeps numpy's indexing of the window view.
        assert (gatherer._numpy == gatherer._x.__getitem__) == (not x.flags.c_contiguous)
        got = gatherer.features(starts)
        np.testing.assert_array_equal(got, oracle(x, starts, WINDOW, channel_major))
        got[...] = 0  # the batch is the caller's own: the buffer is not written through it
        np.testing.assert_array_equal(gatherer.features(starts), oracle(x, starts, WINDOW, channel_major))


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=21, num_files=3, num_series=9, min_len=30, max_len=400)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("pages")
    write_parquet(frames, str(path), row_group_size=113)
    return str(path)


@settings(max_examples=150, deadline=None)
@given(
    channels=st.integers(1, 4),
    window=st.integers(1, 12),
    size=st.integers(1, 9),
    batches=st.integers(1, 12),
    chunk=st.integers(1, 40),
    channel_major=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_run_gathered_a_chunk_of_batches_at_a_time_equals_batch_by_batch(
    channels, window, size, batches, chunk, channel_major, seed
):
    rows = window + 50
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((channels, rows) if channel_major else (rows, channels)).astype(np.float32)
    runs = _run_gather(data, window, channel_major)
    assert runs is not None
    run = rng.integers(0, rows - window + 1, size * batches).astype(np.int32)
    old = batch_module._RUN_INDEX
    batch_module._RUN_INDEX = chunk  # chunks of the index ending inside, at and past a run's end
    try:
        got = list(runs.batches(run, size))
    finally:
        batch_module._RUN_INDEX = old
    assert len(got) == batches
    for b, x in enumerate(got):
        assert x.flags.c_contiguous
        np.testing.assert_array_equal(x, oracle(data, run[b * size : (b + 1) * size], window, channel_major))


@pytest.fixture(params=["slots", "numpy"])
def path(request, monkeypatch):
    """torch's copy into pooled arrays (as into a DataLoader worker's slots) for every call, or numpy's run gather."""
    if request.param == "slots":
        monkeypatch.setattr(batch_module.OutputPool, "direct_bytes", 0, raising=False)
    monkeypatch.setattr(batch_module, "_RUN_INDEX", 100)  # several chunks of index per run
    return request.param


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("keep", ["every third", "views", "none"])
def test_features_only_batches_equal_the_indexed_ones_and_held_ones_keep_their_values(root, path, layout, keep):
    """A features-only stream (one generator per run) gives the batches of the same stream with its
    start rows; any batch held (whole or as a view) keeps its values while later ones are gathered."""
    args = dict(features=FEATURES, series="sid", window=WINDOW, batch_size=24, layout=layout, seed=9)
    indexed = [x.numpy().copy() for x, _ in dw.WindowDataset(root, return_index=True, **args)]
    kept, pointers, n = [], [], -1
    for n, x in enumerate(dw.WindowDataset(root, **args)):
        np.testing.assert_array_equal(x.numpy(), indexed[n])
        pointers.append(x.data_ptr())
        if keep == "every third" and n % 3 == 0:
            kept.append((n, x))
        elif keep == "views" and n % 4 == 1:
            kept.append((n, x[2:5]))
        del x
    assert n + 1 == len(indexed) > 30
    for m, x in kept:
        want = indexed[m] if keep == "every third" else indexed[m][2:5]
        np.testing.assert_array_equal(x.numpy(), want)
    if keep == "none" and path == "slots":  # nothing held: pooled arrays are written again and again
        assert len(pointers) - len(set(pointers)) > len(pointers) // 2
