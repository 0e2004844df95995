"""Standardisation: global statistics applied per partition, per-window statistics per batch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import collect, make_frames, write_parquet

import dask_windows as dw
from dask_windows.batch import Gatherer
from dask_windows.normalize import standardize, standardize_windows

FEATURES = ["f0", "f1", "f2"]
MEAN = np.array([1.5, -2.0, 30.0], np.float32)
STD = np.array([2.0, 0.25, 7.0], np.float32)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    frames = make_frames(seed=4, num_files=4, num_series=9, min_len=5, max_len=120)
    for frame in frames:  # offsets and scales unlike the statistics, so a wrong formula shows
        for k, name in enumerate(FEATURES):
            frame[name] = (frame[name] * (k + 1) * 3 + 10 * k).astype(np.float32)
    root = tmp_path_factory.mktemp("norm")
    write_parquet(frames, str(root), row_group_size=41)
    return frames, str(root)


def _reference_windows(frames: list[pd.DataFrame], rows: np.ndarray, window: int, layout: str) -> np.ndarray:
    """Brute force: each window's rows from the concatenated frames, standardised in float32."""
    full = pd.concat(frames, ignore_index=True)[FEATURES].to_numpy(np.float32)
    scaled = (full - MEAN) * (np.float32(1.0) / STD)  # the float32 operations the loader promises
    out = np.stack([scaled[r : r + window] for r in rows])  # (B, L, C)
    return out.transpose(0, 2, 1) if layout == "NCL" else out


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("workers", [0, 2])
def test_global_statistics_equal_the_reference(data, layout, workers):
    frames, root = data
    kw = dict(
        features=FEATURES,
        targets=["y"],
        series="sid",
        window=7,
        stride=2,
        batch_size=16,
        return_index=True,
        layout=layout,
        seed=3,
    )
    plain = collect(dw.WindowDataset(root, **kw), {"num_workers": workers} if workers else None)
    scaled = collect(
        dw.WindowDataset(root, normalize={"mean": MEAN, "std": STD}, **kw),
        {"num_workers": workers} if workers else None,
    )
    assert len(plain) == len(scaled) > 3
    for (_x0, y0, rows0), (x, y, rows) in zip(plain, scaled):
        np.testing.assert_array_equal(rows, rows0)
        np.testing.assert_array_equal(y, y0)  # targets are not standardised
        np.testing.assert_array_equal(x, _reference_windows(frames, rows, 7, layout))


def test_per_partition_equals_the_per_batch_gather_bit_for_bit():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 500)) * 5 + 2).astype(np.float32)  # (C, rows)
    starts = rng.integers(0, 500 - 16, 64)
    per_batch = Gatherer(x, None, 16, 0, "NCL", MEAN, STD).features(starts)
    once = Gatherer(standardize(x.copy(), MEAN, STD, True), None, 16, 0, "NCL").features(starts)
    np.testing.assert_array_equal(once, per_batch)
    rows_major = np.ascontiguousarray(x.T)
    per_batch = Gatherer(rows_major, None, 16, 0, "NLC", MEAN, STD).features(starts)
    once = Gatherer(standardize(rows_major.copy(), MEAN, STD, False), None, 16, 0, "NLC").features(starts)
    np.testing.assert_array_equal(once, per_batch)


def _windows_reference(x: np.ndarray, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Per window and channel, in float64, one window at a time."""
    out = np.empty_like(x)
    for b in range(len(x)):
        block = x[b].astype(np.float64) if channel_major else x[b].T.astype(np.float64)  # (C, L)
        for c in range(len(block)):
            values = block[c]
            std = max(values.std(), eps)
            scaled = (values - values.mean()) / std
            if channel_major:
                out[b, c] = scaled
            else:
                out[b, :, c] = scaled
    return out


@pytest.mark.parametrize("shape", [(5, 3, 64), (4, 2, 127), (3, 40, 33), (6, 1, 1), (2, 7, 256)])
@pytest.mark.parametrize("channel_major", [True, False])
def test_windows_standardised_like_the_reference(shape, channel_major):
    rng = np.random.default_rng(hash(shape) % 2**32)
    _batch, channels, _length = shape
    x = (rng.standard_normal(shape) * rng.uniform(0.1, 50, (1, channels, 1)) + 100).astype(np.float32)
    x[0, 0] = 4.0  # a constant window becomes zeros
    if not channel_major:
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    want = _windows_reference(x, channel_major)
    got = standardize_windows(x.copy(), channel_major)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    assert got.dtype == np.float32


def test_sample_normalisation_through_the_dataset(data):
    _frames, root = data
    kw = dict(features=FEATURES, series="sid", window=9, batch_size=8, return_index=True, layout="NLC")
    for (x, rows), (x0, rows0) in zip(
        collect(dw.WindowDataset(root, normalize="sample", **kw)), collect(dw.WindowDataset(root, **kw))
    ):
        np.testing.assert_array_equal(rows, rows0)
        np.testing.assert_allclose(x, _windows_reference(x0, False), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("channel_major", [True, False])
def test_windows_standardised_chunk_by_chunk_like_the_reference(monkeypatch, channel_major):
    """Batches longer than a chunk: every chunk, the last one short, and a chunk of huge values
    (the float64 path) between ordinary ones, each equal to the reference."""
    import dask_windows.normalize as normalize

    monkeypatch.setattr(normalize, "_CHUNK_VALUES", 3 * 2 * 50)  # three windows of (2, 50) per chunk
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((10, 2, 50)) * rng.uniform(0.5, 20, (10, 2, 1)) + 60).astype(np.float32)
    x[4, 1] *= np.float32(1e30)  # chunk 1 (windows 3-5): squares overflow float32
    x[9, 0] = -2.5  # the last, one-window chunk: constant, becomes zeros
    if not channel_major:
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    want = _windows_reference(x, channel_major)
    got = standardize_windows(x.copy(), channel_major)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    assert np.isfinite(got).all()
    assert (got[9, 0] == 0).all() if channel_major else (got[9, :, 0] == 0).all()


def _huge_windows(rng: np.random.Generator) -> np.ndarray:
    """(6, 3, 40) windows: ordinary, near float32's edge, and ones whose plain centring would overflow."""
    x = (rng.standard_normal((6, 3, 40)) * 4 + 7).astype(np.float32)
    edge = np.float32(3.0e38)
    x[1, 0] = rng.uniform(-1, 1, 40).astype(np.float32) * edge  # row sum finite, squares overflow
    x[2, 1] = edge  # the row sum overflows: float64 from the values as given
    x[3, 2, :20], x[3, 2, 20:] = edge, -edge  # mean 0, squares overflow
    x[4, 0, :30], x[4, 0, 30:] = edge, -edge  # mean 1.5e38: x - mean = -4.5e38 in float32
    x[5, 1] = np.float32(1e19) * rng.standard_normal(40).astype(np.float32)  # squares near the edge
    return x


@pytest.mark.parametrize("chunk", [None, 3 * 40])
def test_huge_values_stay_finite_and_equal_the_reference(monkeypatch, chunk):
    """Values up to +-3e38: every path (row sums or squares overflowing) gives the float64 reference."""
    import dask_windows.normalize as normalize

    if chunk is not None:  # one window per chunk: each fallback on its own chunk, ordinary ones beside it
        monkeypatch.setattr(normalize, "_CHUNK_VALUES", chunk)
    x = _huge_windows(np.random.default_rng(21))
    want = _windows_reference(x, True)
    got = standardize_windows(x.copy(), True)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    layout = np.ascontiguousarray(x.transpose(0, 2, 1))  # the same windows time-major (NLC)
    got = standardize_windows(layout.copy(), False)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, _windows_reference(layout, False), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("length", [50, 64, 97, 512])
def test_constant_windows_become_zeros_and_others_match(length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((8, 4, length)) * rng.uniform(0.01, 30, (8, 4, 1)) + rng.uniform(-50, 50, (8, 4, 1))
    x = x.astype(np.float32)
    for b, c, value in [(0, 0, 4.0), (3, 2, -2.5), (7, 1, 0.0), (5, 3, 1e30), (6, 0, -3e38)]:
        x[b, c] = value
    got = standardize_windows(x.copy(), True)
    for b, c, _value in [(0, 0, 4.0), (3, 2, -2.5), (7, 1, 0.0), (5, 3, 1e30), (6, 0, -3e38)]:
        assert (got[b, c] == 0).all()
    np.testing.assert_allclose(got, _windows_reference(x, True), rtol=1e-4, atol=2e-4)


def test_batch_of_the_benchmark_shape_equals_the_reference_and_keeps_torch_threads():
    """(256, 4, 512), several chunks; the torch thread count is what it was before."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((256, 4, 512)) * rng.uniform(0.1, 10, (256, 4, 1)) + 3).astype(np.float32)
    threads = torch.get_num_threads()
    got = standardize_windows(x.copy(), True)
    assert torch.get_num_threads() == threads
    np.testing.assert_allclose(got, _windows_reference(x, True), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("channel_major", [True, False])
@pytest.mark.parametrize("value", [0.1, 123.456, 1.2345678, -2.5e3, 3e38])
@pytest.mark.parametrize("length", [50, 97, 512])
def test_a_constant_window_becomes_zeros_whatever_its_value(channel_major, value, length):
    # The float32 mean of 512 copies of 0.1 is a rounding step off 0.1; without the check that step
    # became the std and the window came out as +-1 everywhere. Its neighbours keep mean 0, std 1.
    from dask_windows.normalize import standardize_windows

    x = np.random.default_rng(0).standard_normal((6, 3, length)).astype(np.float32)
    x[2, 1] = value
    # Nearly constant (std 1e-4 of the mean: checked, since below 2**-12 of it, and kept): a real signal.
    x[4, 2] = x[4, 2] * np.float32(abs(value) * 1e-4) + np.float32(value)
    expect = x.astype(np.float64)
    expect = (expect - expect.mean(2, keepdims=True)) / np.maximum(expect.std(2, keepdims=True), 1e-8)
    if not channel_major:
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    out = standardize_windows(x, channel_major)
    if not channel_major:
        out = out.transpose(0, 2, 1)
    assert np.all(out[2, 1] == 0)
    others = np.ones(out.shape[:2], bool)
    others[2, 1] = False
    assert np.count_nonzero(out[4, 2]) > 0 and abs(out[4, 2].std() - 1) < 1e-2
    np.testing.assert_allclose(out[4, 2], expect[4, 2], rtol=0, atol=5e-2)  # ~800 ulps of signal
    others[4, 2] = False
    np.testing.assert_allclose(out[others], expect[others], rtol=1e-4, atol=2e-4)
