"""Per-buffer window statistics for ``normalize="sample"``: the float64 reference, hostile values, the stream."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import write_parquet

import dask_windows as dw
import dask_windows.runtime.window_table as window_table
from dask_windows.runtime.normalize import standardize_windows
from dask_windows.runtime.window_table import apply_table, build_table, worth_building

_U32 = float(np.finfo(np.float32).eps)


def _reference(buffer: np.ndarray, starts: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(B, C, L)`` windows of a ``(C, rows)`` buffer, and each standardised in float64, one at a time."""
    x = np.stack([buffer[:, s : s + window] for s in starts])
    values = x.astype(np.float64)
    with np.errstate(invalid="ignore"):  # windows holding inf or NaN: not compared
        std = np.maximum(values.std(axis=2, keepdims=True), 1e-8)
        return x, (values - values.mean(axis=2, keepdims=True)) / std


def _tolerance(x: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The documented tolerance: 2e-4 + 1e-4 of the value + 16 float32 ulps of the window's mean over its std."""
    values = x.astype(np.float64)
    level = np.abs(values.mean(axis=2, keepdims=True)) / np.maximum(values.std(axis=2, keepdims=True), 1e-8)
    return 2e-4 + 1e-4 * np.abs(want) + 16 * _U32 * level


def _hostile_buffer(rows: int, seed: int) -> np.ndarray:
    """``(7, rows)`` float32: every kind of value the table must vouch for or leave to the per-batch code."""
    rng = np.random.default_rng(seed)
    steps = np.repeat(rng.standard_normal(rows // 50 + 1), 50)[:rows]
    channels = [
        rng.standard_normal(rows),  # ordinary
        np.float32(1e6) + rng.standard_normal(rows) * 1e-3 + 0.0625 * (rng.random(rows) < 0.05),  # 1e6, ulp steps
        1e4 + steps,  # runs of one value at an offset: constant windows between the steps
        rng.standard_normal(rows) * 1e30,  # squares beyond float32
        np.cumsum(rng.standard_normal(rows)) + 1e3,  # a random walk: the block's spread dwarfs a window's std
        np.where(np.arange(rows) % 97 < 60, 1e-3, 1e8) * rng.standard_normal(rows),  # 1e11 between regimes
        np.where(np.arange(rows) % 2, 3e38, -3e38),  # centring would overflow float32
    ]
    return np.stack(channels).astype(np.float32)


@pytest.mark.parametrize("window", [1, 2, 17, 64, 200])
@pytest.mark.parametrize("channel_major", [True, False])
def test_table_and_batches_equal_the_float64_reference_on_hostile_values(monkeypatch, window, channel_major):
    monkeypatch.setattr(window_table, "_BLOCK", 100)  # several blocks, the last one short
    buffer = _hostile_buffer(1_000, window)
    x_buffer = buffer if channel_major else np.ascontiguousarray(buffer.T)
    table = build_table(x_buffer, window, channel_major)
    assert table.shape == (1_000 - window + 1, 14) and table.dtype == np.float32
    starts = np.random.default_rng(window).permutation(len(table))[:300]
    x, want = _reference(buffer, starts, window)
    batch = x if channel_major else np.ascontiguousarray(x.transpose(0, 2, 1))
    got = apply_table(batch.copy(), starts, table, channel_major)
    got = got if channel_major else got.transpose(0, 2, 1)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert (np.abs(got - want) <= _tolerance(x, want)).all()
    constant = (x == x[:, :, :1]).all(axis=2)
    assert (got[constant] == 0).all()
    # What the table does not vouch for is what the per-batch code gives, bit for bit.
    marked = np.isnan(table[starts, 7:])
    assert marked[:, 6].all() and marked[constant].all()  # +-3e38, and every constant window
    if window >= 17:
        assert not marked[:, 0].any() and not marked[:, 3].any()  # ordinary values and 1e30 are vouched for
    own = standardize_windows(batch.copy(), channel_major)
    own = own if channel_major else own.transpose(0, 2, 1)
    redo = marked.any(axis=1)
    np.testing.assert_array_equal(got[redo], own[redo])


def test_non_finite_values_mark_their_block_only(monkeypatch):
    monkeypatch.setattr(window_table, "_BLOCK", 64)
    buffer = np.random.default_rng(2).standard_normal((2, 640)).astype(np.float32)
    buffer[1, 300] = np.inf
    buffer[0, 400] = np.nan
    table = build_table(buffer, 16, True)
    marked = np.isnan(table[:, 2:])
    blocks = np.arange(len(table)) // 64
    assert marked[blocks == 4, 1].all() and marked[blocks == 6, 0].all()  # the blocks holding them
    assert not marked[(blocks != 4), 1].any() and not marked[(blocks != 6), 0].any()
    clean = np.flatnonzero((blocks != 4) & (blocks != 6))[::7]  # windows of other blocks: the reference
    x, want = _reference(buffer, clean, 16)
    got = apply_table(x.copy(), clean, table, True)
    assert (np.abs(got - want) <= _tolerance(x, want)).all()
    inside = np.array([290, 393])  # windows of those blocks without the values: per-batch, exact
    x, want = _reference(buffer, inside, 16)
    np.testing.assert_array_equal(apply_table(x.copy(), inside, table, True), standardize_windows(x.copy(), True))


def test_worth_building_only_where_windows_overlap():
    assert worth_building(10_000 - 63, 10_000, 64)  # stride 1
    assert worth_building(10_000 // 16, 10_000, 64)  # stride 16: 4 values per row
    assert not worth_building(10_000 // 32, 10_000, 64)  # stride 32
    assert not worth_building(10_000 // 64, 10_000, 64)  # stride = window
    assert not worth_building(0, 0, 64)
    assert build_table(np.zeros((3, 50), np.float32), 64, True).shape == (0, 6)  # shorter than a window


def _series_root(tmp_path, rows: int = 1_500) -> str:
    rng = np.random.default_rng(9)
    frames = []
    for sid in range(3):
        frame = pd.DataFrame(
            {
                "sid": sid,
                "a": (np.cumsum(rng.standard_normal(rows)) + 5e3).astype(np.float32),
                "b": (np.repeat(rng.standard_normal(rows // 30 + 1), 30)[:rows] + 1e4).astype(np.float32),
                "c": rng.standard_normal(rows).astype(np.float32),
            }
        )
        frames.append(frame)
    root = str(tmp_path / "walk")
    write_parquet(frames, root, row_group_size=500)
    return root


def _batches(ds) -> list[tuple[np.ndarray, ...]]:
    return [tuple(t.numpy().copy() for t in b) for b in ds]


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_stream_from_the_tables_is_deterministic_and_resumes_bit_for_bit(tmp_path, monkeypatch, layout):
    """Every window from its unit's table (built as the unit lands in the pool): with and without the
    builder thread, and resumed mid-step, the same bits; every batch within the tolerance of the
    float64 reference."""
    root = _series_root(tmp_path)
    kw = dict(features=["a", "b", "c"], series="sid", window=24, batch_size=50, return_index=True, layout=layout)
    kw.update(buffer_partitions=1, seed=5)
    ds = dw.WindowDataset(root, normalize="sample", **kw)
    full = _batches(ds)
    assert len(full) > 60
    np.testing.assert_equal(_batches(dw.WindowDataset(root, normalize="sample", prefetch_partitions=0, **kw)), full)
    for taken in (12, 37):
        partial = dw.WindowDataset(root, normalize="sample", **kw)
        it = iter(partial)
        for _ in range(taken):
            next(it)
        state = partial.state_dict()
        it.close()
        again = dw.WindowDataset(root, normalize="sample", **kw)
        again.load_state_dict(state)
        np.testing.assert_equal(_batches(again), full[taken:])
    plain = _batches(dw.WindowDataset(root, **kw))
    for (x, rows), (x0, rows0) in zip(full, plain):
        np.testing.assert_array_equal(rows, rows0)
        x, x0 = (x, x0) if layout == "NCL" else (x.transpose(0, 2, 1), x0.transpose(0, 2, 1))
        want = (x0 - x0.astype(np.float64).mean(axis=2, keepdims=True)) / np.maximum(
            x0.astype(np.float64).std(axis=2, keepdims=True), 1e-8
        )
        assert (np.abs(x - want) <= _tolerance(x0, want)).all()
        constant = (x0 == x0[:, :, :1]).all(axis=2)
        assert (x[constant] == 0).all()


def test_batches_gathered_into_worker_slots_are_standardised_from_the_tables(tmp_path, monkeypatch):
    """Batches of 288 KiB (DataLoader workers gather them straight into shared slots) standardised
    from the tables in the workers: the float64 reference."""
    root = _series_root(tmp_path, rows=4_000)
    kw = dict(features=["a", "b", "c"], series="sid", window=128, batch_size=192, return_index=True, seed=3)
    kw.update(buffer_partitions=1)
    workers = _batches_of(dw.WindowDataset(root, normalize="sample", **kw), {"num_workers": 2})
    plain = _batches_of(dw.WindowDataset(root, **kw), {"num_workers": 2})
    assert len(workers) == len(plain) > 60
    for (x, rows), (x0, rows0) in zip(workers, plain):
        np.testing.assert_array_equal(rows, rows0)
        values = x0.astype(np.float64)
        want = (values - values.mean(axis=2, keepdims=True)) / np.maximum(values.std(axis=2, keepdims=True), 1e-8)
        assert (np.abs(x - want) <= _tolerance(x0, want)).all()


def _batches_of(ds, loader_kwargs: dict) -> list[tuple[np.ndarray, ...]]:
    from helpers import collect

    return collect(ds, loader_kwargs)


def test_the_window_table_is_counted_in_the_pool_budget(tmp_path, monkeypatch):
    """normalize="sample" keeps a mean and an inverse std per feature for every pool row: the pool's
    arrays, table included, stay within ``buffer_bytes`` (the table used to come on top: 3x the budget)."""
    import dask_windows.runtime.pool as pool_module

    root = _series_root(tmp_path, rows=4_000)
    held = []
    init = pool_module._Pool.__init__

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        held.append(sum(a.nbytes for a in (self.x, self.y, self.table) if a is not None))

    monkeypatch.setattr(pool_module._Pool, "__init__", counted)
    budget = 256 << 10
    kw = dict(features=["a", "b", "c"], series="sid", window=24, batch_size=16, buffer_bytes=budget, seed=1)
    for normalize in (None, "sample"):
        held.clear()
        assert sum(len(b) for b in dw.WindowDataset(root, normalize=normalize, **kw)) > 0
        assert held and max(held) <= budget, (normalize, held)
