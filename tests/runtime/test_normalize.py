"""Standardisation: global statistics applied per partition, per-window statistics per batch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import collect, make_frames, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.runtime.batch import Gatherer
from dask_windows.runtime.normalize import standardize, standardize_windows

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
    import dask_windows.runtime.normalize as normalize

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
    import dask_windows.runtime.normalize as normalize

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
    from dask_windows.runtime.normalize import standardize_windows

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


_U32 = float(np.finfo(np.float32).eps)  # 2**-23


def _quantisation_bound(x: np.ndarray, channel_major: bool) -> np.ndarray:
    """Per window and channel, the error float32 alone allows: a few ulps of the mean over the std.

    A window's values are float32, so its mean can be represented only to about ``eps * |mean|``;
    centred values are off by that much, and standardised ones by that over the std. Broadcast
    to ``x``'s shape.
    """
    axis = 2 if channel_major else 1
    values = x.astype(np.float64)
    mean = np.abs(values.mean(axis=axis, keepdims=True))
    std = np.maximum(values.std(axis=axis, keepdims=True), 1e-8)
    return np.broadcast_to(16 * _U32 * mean / std, x.shape)


@st.composite
def _batches(draw: st.DrawFn) -> tuple[np.ndarray, list[tuple[int, int]], int]:
    """A float32 batch ``(B, C, L)`` of offset, scaled noise with some constant windows, and a chunk size."""
    batch = draw(st.integers(1, 6))
    channels = draw(st.integers(1, 5))
    length = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    offset = draw(st.sampled_from([0.0, 1.0, -3.5, 100.0, 1e4, -1e4, 123.456]))
    scale = draw(st.sampled_from([0.05, 0.3, 1.0, 7.0, 1e3]))
    scales = scale * rng.uniform(0.5, 2.0, (batch, channels, 1))
    x = (rng.standard_normal((batch, channels, length)) * scales + offset).astype(np.float32)
    constant = draw(st.lists(st.tuples(st.integers(0, batch - 1), st.integers(0, channels - 1)), max_size=4))
    value = draw(st.sampled_from([0.0, 0.1, 123.456, -2.5, 1.2345678, 1e4 + 0.5]))
    for b, c in constant:  # one distinct value: zeros out
        x[b, c] = value
    chunk = draw(st.integers(1, 4)) * channels * length  # 1-4 windows per chunk: several chunks, reversed
    return x, constant, chunk


@settings(max_examples=150, deadline=None)
@given(case=_batches(), channel_major=st.booleans())
def test_windows_equal_the_float64_oracle_to_float32_precision(monkeypatch_module, case, channel_major):
    """Any batch, chunked any way: the float64 reference within what float32 input allows, constant
    windows exactly zero; large offsets (1e4 with noise of 0.05) included."""
    import dask_windows.runtime.normalize as normalize

    x, constant, chunk = case
    monkeypatch_module.setattr(normalize, "_CHUNK_VALUES", chunk)
    if not channel_major:
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    want = _windows_reference(x, channel_major)
    got = standardize_windows(x.copy(), channel_major)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    excess = np.abs(got - want) - (2e-4 + 1e-4 * np.abs(want) + _quantisation_bound(x, channel_major))
    assert excess.max() <= 0, f"worst excess {excess.max()} at {np.unravel_index(excess.argmax(), x.shape)}"
    for b, c in constant:
        assert (got[b, c] == 0).all() if channel_major else (got[b, :, c] == 0).all()


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A monkeypatch that hypothesis examples can share (function-scoped fixtures are not reset between them)."""
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()


@pytest.mark.parametrize("channel_major", [True, False])
def test_a_window_standardised_alone_equals_it_in_a_batch_bit_for_bit(monkeypatch, channel_major):
    """Chunks (processed last first) share nothing: each window's values depend on that window only."""
    import dask_windows.runtime.normalize as normalize

    monkeypatch.setattr(normalize, "_CHUNK_VALUES", 3 * 4 * 96)  # three windows per chunk, the last chunk short
    rng = np.random.default_rng(8)
    x = (
        rng.standard_normal((10, 4, 96)) * rng.uniform(0.1, 9, (10, 4, 1)) + rng.uniform(-1e3, 1e3, (10, 4, 1))
    ).astype(np.float32)
    x[6, 2] = 0.1
    if not channel_major:
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    together = standardize_windows(x.copy(), channel_major)
    alone = np.concatenate([standardize_windows(x[b : b + 1].copy(), channel_major) for b in range(len(x))])
    np.testing.assert_array_equal(together, alone)


@pytest.mark.parametrize("stride", [1, 16])
def test_sample_normalisation_through_the_dataset_channel_major(data, stride):
    """NCL (the default layout), stride 1 and stride = window: every batch equals the oracle."""
    _frames, root = data
    kw = dict(features=FEATURES, series="sid", window=16, stride=stride, batch_size=8, return_index=True, seed=2)
    pairs = list(zip(collect(dw.WindowDataset(root, normalize="sample", **kw)), collect(dw.WindowDataset(root, **kw))))
    assert len(pairs) > 3
    for (x, rows), (x0, rows0) in pairs:
        np.testing.assert_array_equal(rows, rows0)
        assert x.shape == x0.shape and x.shape[1:] == (3, 16)
        np.testing.assert_allclose(x, _windows_reference(x0, True), rtol=1e-4, atol=2e-4)


def _hostile_frame(rows: int, seed: int) -> pd.DataFrame:
    """Values a per-window standardisation must survive, one series per frame.

    ``f0``: a level of 1e6 with noise of 1e-3 and steps of one float32 ulp (0.0625): mostly windows
    that float32 holds as constant, some with a few ulps of spread; ``f1``: runs of one value (of
    an offset of 1e4) with a change every 40 rows; ``f2``: values of order 1e30; ``f3``: few
    distinct levels (0.5 apart) around 123.456, so that three values of a window often agree.
    """
    rng = np.random.default_rng(seed)
    f0 = np.float32(1e6) + rng.standard_normal(rows) * 1e-3 + 0.0625 * (rng.random(rows) < 0.02)
    f1 = 1e4 + np.repeat(rng.standard_normal(rows // 40 + 1), 40)[:rows]
    f2 = rng.standard_normal(rows) * 1e30
    f3 = 123.456 + 0.5 * rng.integers(-2, 3, rows)
    cols = {"f0": f0, "f1": f1, "f2": f2, "f3": f3}
    frame = pd.DataFrame({k: v.astype(np.float32) for k, v in cols.items()})
    frame.insert(0, "sid", seed)
    return frame


def _hostile_bound(x0: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The documented tolerance: 2e-4 + 1e-4 * |reference| + 16 float32 ulps of the mean over the std."""
    return 2e-4 + 1e-4 * np.abs(want) + _quantisation_bound(x0, True)


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("table", [False, True])
def test_hostile_values_equal_the_float64_reference_in_worker_processes(tmp_path, monkeypatch, layout, table):
    """Through DataLoader workers (where torch runs one thread) and in the process, from each window's
    values (no table) and from the units' tables: within the documented tolerance of the float64
    reference; constant windows exactly zero."""
    import dask_windows.runtime.pool as pool_module

    if not table:  # every unit standardised window by window
        monkeypatch.setattr(pool_module, "worth_building", lambda windows, rows, window: False)
    frames = [_hostile_frame(700, seed) for seed in range(3)]
    root = str(tmp_path / "hostile")
    write_parquet(frames, root, row_group_size=256)
    kw = dict(
        features=["f0", "f1", "f2", "f3"],
        series="sid",
        window=32,
        batch_size=64,
        return_index=True,
        layout=layout,
        seed=1,
    )
    plain = collect(dw.WindowDataset(root, **kw))
    alone = collect(dw.WindowDataset(root, normalize="sample", **kw))
    workers = collect(dw.WindowDataset(root, normalize="sample", **kw), {"num_workers": 2})
    in_workers = collect(dw.WindowDataset(root, **kw), {"num_workers": 2})  # the same windows, unnormalised
    assert len(workers) == len(in_workers) and len(alone) == len(plain) > 20
    zeros = 0
    for (x, rows), (x0, rows0) in [*zip(alone, plain), *zip(workers, in_workers)]:
        np.testing.assert_array_equal(rows, rows0)
        if layout == "NLC":
            x, x0 = x.transpose(0, 2, 1), x0.transpose(0, 2, 1)
        assert np.isfinite(x).all()
        want = _windows_reference(np.ascontiguousarray(x0), True)
        assert (np.abs(x - want) <= _hostile_bound(x0, want)).all()
        constant = (x0 == x0[:, :, :1]).all(axis=2)
        assert (x[constant] == 0).all() and (x[~constant] != 0).any(axis=1).all()
        zeros += int(constant.sum())
    assert zeros > 100  # f0 and f1 hold constant windows, and they came out as zeros


@pytest.mark.parametrize("channel_major", [True, False])
def test_windows_whose_first_middle_and_last_values_agree_are_not_taken_for_constant(channel_major):
    """The constant-window check reads three values per window first: windows of a large offset
    whose three values agree but whose other values differ keep their standardised values."""
    rng = np.random.default_rng(3)
    x = (1e4 + 0.25 * rng.integers(-3, 4, (40, 3, 64))).astype(np.float32)  # std ~0.5: below 2**-12 of 1e4
    x[:, :, 32] = x[:, :, 0]
    x[:, :, 63] = x[:, :, 0]  # first, middle and last agree in every window
    x[5, 1] = x[5, 1, 0]  # and one window is constant
    want = _windows_reference(x, True)
    layout = x if channel_major else np.ascontiguousarray(x.transpose(0, 2, 1))
    got = standardize_windows(layout.copy(), channel_major)
    got = got if channel_major else got.transpose(0, 2, 1)
    assert (got[5, 1] == 0).all()
    others = np.ones((40, 3), bool)
    others[5, 1] = False
    assert (np.abs(got[others]).max(axis=1) > 0.5).all()
    assert (np.abs(got - want) <= _hostile_bound(x, want)).all()
