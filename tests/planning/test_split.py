"""Temporal splits per series against a pandas oracle."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from helpers import collect, make_frames, oracle_starts, write_parquet
from scale_helpers import CountingSource, reads

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError, DataError
from dask_windows.sources import ArraySource, ParquetSource


def oracle_split(frames, series, window, horizon=0, stride=1, embargo=0, valid=None, at=None, time=None, bad_rows=()):
    """``(train, valid)`` global start rows by brute force: positions from a pandas groupby."""
    full = pd.concat(frames, ignore_index=True)
    keys = full[series] if series else pd.Series(np.zeros(len(full)))
    position = keys.groupby(keys).cumcount().to_numpy()
    n = keys.groupby(keys).transform("size").to_numpy()
    if valid is not None:
        cut = np.floor(n * (1 - valid)).astype(np.int64)
    else:
        reached = np.where(full[time] >= at, position, n)  # first position with time >= at, per series
        cut = pd.Series(reached).groupby(keys).transform("min").to_numpy()
    starts = oracle_starts(frames, series, window, stride, horizon)
    span = window + horizon
    bad = np.zeros(len(full) + 1, np.int64)
    bad[1:] = np.cumsum(np.isin(np.arange(len(full)), bad_rows))
    clean = starts[bad[starts + span] == bad[starts]]  # no NaN row among the window's rows
    return clean[position[clean] + span <= cut[clean]], clean[position[clean] >= cut[clean] + embargo]


def yielded(ds, **loader) -> np.ndarray:
    return np.sort(np.concatenate([b[-1] for b in collect(ds, loader)]))


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=5, num_series=11, min_len=3, max_len=90)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("split")
    write_parquet(frames, str(path))
    return str(path)


def dataset(root, **kwargs):
    settings = {"features": ["f0", "f1"], "series": "sid", "batch_size": 16, "return_index": True, **kwargs}
    return WindowDataset(root, **settings)


@pytest.mark.parametrize(
    "window,horizon,stride,valid,embargo",
    [
        (5, 0, 1, 0.2, 0),
        (8, 0, 1, 0.3, 8),
        (6, 2, 1, 0.25, 3),
        (4, 0, 3, 0.5, 2),
        (7, 0, 1, 0.8, 60),  # embargo longer than many series: they have no valid windows
        (3, 1, 2, 0.1, 0),
    ],
)
def test_fraction_split_matches_the_oracle(frames, root, window, horizon, stride, valid, embargo):
    targets = ["y"] if horizon else None
    ds = dataset(root, window=window, horizon=horizon, stride=stride, targets=targets)
    train, held_out = ds.split(valid=valid, embargo=embargo)
    expected = oracle_split(frames, "sid", window, horizon, stride, embargo, valid=valid)
    np.testing.assert_array_equal(yielded(train), expected[0])
    np.testing.assert_array_equal(yielded(held_out), expected[1])
    assert train.num_windows == len(expected[0]) and held_out.num_windows == len(expected[1])
    # Series span files, and the largest embargo leaves some series without valid windows.
    assert any(f["sid"].iloc[-1] == g["sid"].iloc[0] for f, g in zip(frames, frames[1:]))
    sid = pd.concat(frames, ignore_index=True)["sid"].to_numpy()
    with_valid = len(set(sid[expected[1]]))
    assert 0 < with_valid <= len(set(sid)) and (embargo < 50 or with_valid < len(set(sid)) // 2)


def test_split_by_time_matches_the_oracle(frames, tmp_path):
    # A per-series clock: the cut falls at a different position in each series.
    rng = np.random.default_rng(0)
    full = pd.concat(frames, ignore_index=True)
    offset = full.groupby("sid")["sid"].transform(lambda s: rng.integers(0, 40)).to_numpy()
    full["t"] = (full.groupby("sid").cumcount().to_numpy() + offset) * 10
    bounds = np.cumsum([0, *[len(f) for f in frames]])
    timed = [full.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]
    write_parquet(timed, str(tmp_path))
    log = str(tmp_path / "reads.log")
    source = CountingSource(ParquetSource(str(tmp_path)), log)
    ds = WindowDataset(source, ["f0"], series="sid", window=6, return_index=True)
    train, held_out = ds.split(at=400, time="t", embargo=4)
    expected = oracle_split(timed, "sid", 6, embargo=4, at=400, time="t")
    np.testing.assert_array_equal(yielded(train), expected[0])
    np.testing.assert_array_equal(yielded(held_out), expected[1])
    assert sorted(reads(log, "t")) == list(range(len(timed)))  # the time column, once per partition


def test_split_by_datetime_column(frames, tmp_path):
    timed = []
    for f in frames:
        f = f.copy()
        f["when"] = pd.Timestamp("2024-01-01") + pd.to_timedelta(f["ts"] % 97, unit="h")
        timed.append(f)
    write_parquet(timed, str(tmp_path))
    ds = dataset(str(tmp_path), window=5)
    train, held_out = ds.split(at="2024-01-03 06:00", time="when", embargo=2)
    expected = oracle_split(timed, "sid", 5, embargo=2, at=pd.Timestamp("2024-01-03 06:00"), time="when")
    np.testing.assert_array_equal(yielded(train), expected[0])
    np.testing.assert_array_equal(yielded(held_out), expected[1])


def test_positions_count_nan_rows_with_nan_drop(frames, tmp_path):
    bad_rows = [7, 8, 60, 133, 134, 135, 240]
    full = pd.concat(frames, ignore_index=True)
    full.loc[bad_rows, "f1"] = np.nan
    bounds = np.cumsum([0, *[len(f) for f in frames]])
    holed = [full.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]
    write_parquet(holed, str(tmp_path))
    train, held_out = dataset(str(tmp_path), window=5, nan="drop").split(valid=0.4, embargo=3)
    expected = oracle_split(holed, "sid", 5, embargo=3, valid=0.4, bad_rows=bad_rows)
    np.testing.assert_array_equal(yielded(train), expected[0])
    np.testing.assert_array_equal(yielded(held_out), expected[1])


def test_without_a_series_column_the_data_is_one_series(frames, root):
    train, held_out = dataset(root, series=None, window=10).split(valid=0.2, embargo=5)
    expected = oracle_split(frames, None, 10, embargo=5, valid=0.2)
    np.testing.assert_array_equal(yielded(train), expected[0])
    np.testing.assert_array_equal(yielded(held_out), expected[1])
    # Arrays: each array is one series.
    arrays = [np.arange(n, dtype=np.float32)[:, None] for n in (30, 50, 12)]
    a_train, a_valid = WindowDataset(arrays, window=4, return_index=True, partition_rows=60).split(valid=0.5)
    assert isinstance(a_train.source, ArraySource)
    layout = ((0, 30), (30, 50), (80, 12))  # (first row, rows) of each array
    expected_train = [s for off, n in layout for s in range(off, off + n - 3) if s - off + 4 <= n // 2]
    np.testing.assert_array_equal(yielded(a_train), expected_train)
    assert yielded(a_valid).min() == 15


def test_split_reads_nothing_and_reuses_the_series_table(frames, tmp_path):
    write_parquet(frames, str(tmp_path))
    log = str(tmp_path / "reads.log")
    ds = WindowDataset(CountingSource(ParquetSource(str(tmp_path)), log), ["f0"], series="sid", window=6)
    scanned = len(open(log).readlines())
    first = ds.split(valid=0.2)
    table = ds._series
    second = ds.split(valid=0.3, embargo=6)
    assert len(open(log).readlines()) == scanned and ds._series is table
    assert first[0].num_windows > second[0].num_windows
    assert first[0].runs is ds.runs  # the same scan, shared


def test_split_parts_pickle_and_stream_through_workers(root):
    train, held_out = dataset(root, window=6).split(valid=0.3, embargo=6)
    copy = pickle.loads(pickle.dumps(train))
    np.testing.assert_array_equal(yielded(copy, num_workers=2), yielded(train))
    assert len(copy) == len(train) == -(-train.num_windows // 16)


def test_splitting_a_split_intersects(frames, root):
    train, _ = dataset(root, window=5).split(valid=0.4)
    inner_train, inner_valid = train.split(valid=0.7)
    outer = oracle_split(frames, "sid", 5, valid=0.4)[0]
    inner = oracle_split(frames, "sid", 5, valid=0.7)
    np.testing.assert_array_equal(yielded(inner_train), np.intersect1d(outer, inner[0]))
    np.testing.assert_array_equal(yielded(inner_valid), np.intersect1d(outer, inner[1]))


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({}, ConfigError, "exactly one of valid"),
        ({"valid": 0.2, "at": 5, "time": "ts"}, ConfigError, "exactly one of valid"),
        ({"valid": 1.2}, ConfigError, "strictly between 0 and 1"),
        ({"valid": 0.2, "embargo": -1}, ConfigError, "embargo=-1"),
        ({"at": 5}, ConfigError, "needs time="),
        ({"valid": 0.2, "time": "ts"}, ConfigError, "only used with at="),
        ({"at": 5, "time": "nope"}, KeyError, "time column 'nope'"),
        ({"at": "soon", "time": "ts"}, ConfigError, "cannot be compared"),
        ({"valid": 0.2, "embargo": 10_000}, DataError, "valid part of the split"),
    ],
)
def test_bad_split_arguments(root, kwargs, error, message):
    with pytest.raises(error, match=message):
        dataset(root, window=5).split(**kwargs)


def test_split_of_long_arrays_cut_into_overlapping_partitions():
    """Array partitions overlap by a window's span; the overlap must not count twice in positions."""
    a = np.arange(1000, dtype=np.float32)[:, None]
    b = np.arange(1000, 1300, dtype=np.float32)[:, None]
    ds = WindowDataset([a, b], window=10, batch_size=64, partition_rows=128, return_index=True)
    assert len(ds.partitions) > 2
    train, valid = ds.split(valid=0.2, embargo=5)
    got_t = np.sort(np.concatenate([i.numpy() for _, i in train]))
    got_v = np.sort(np.concatenate([i.numpy() for _, i in valid]))
    # a: n=1000, cut=800; b: n=300, cut=240 (rows 1000.. globally).
    want_t = np.r_[np.arange(0, 791), 1000 + np.arange(0, 231)]
    want_v = np.r_[np.arange(805, 991), 1000 + np.arange(245, 291)]
    assert np.array_equal(got_t, want_t) and np.array_equal(got_v, want_v)
