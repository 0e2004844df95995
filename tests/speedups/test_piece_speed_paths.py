"""The fast paths of decoding a unit's rows: one decode for several row blocks, all segments' window
starts in one pass, one coalesced read for several row ranges.

Each path against a brute-force reference: ``segment_starts`` against ``window_starts`` range by
range, ``decode_pieces`` of several blocks against the decode of the joined rows, and a source's
``read_ranges`` against one ``read_rows`` per range.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_frames, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.opening.checks import FLOAT32_MAX
from dask_windows.planning.windows import window_starts
from dask_windows.runtime.blocks import segment_runs, segment_starts
from dask_windows.runtime.buffer import decode_pieces
from dask_windows.settings.spec import WindowSpec

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, batch_size=16, return_index=True)


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=3, num_files=3, num_series=8, min_len=5, max_len=120)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("speed")
    write_parquet(frames, str(path), row_group_size=7)  # many row groups: pieces span their cuts
    return str(path)


# -- pure paths against brute force ----------------------------------------------------------


def _runs_and_ranges(counts, data):
    """``(counts, first, ranges, lo, hi)``: runs at any increasing rows and a few window ranges of them; ``None``: none."""
    counts = np.array(counts, np.int64)
    first = np.cumsum(np.full(len(counts), 40)) + data.draw(st.integers(0, 5))  # (R,) any increasing rows
    total = int(counts.sum())
    if total == 0:
        return None
    n = data.draw(st.integers(1, 5))
    bounds = [sorted(data.draw(st.tuples(st.integers(0, total - 1), st.integers(1, total)))) for _ in range(n)]
    ranges = [(a, b) for a, b in bounds if b > a]
    if not ranges:
        return None
    return counts, first, ranges, np.array([a for a, _ in ranges]), np.array([b for _, b in ranges])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=6),
    st.integers(1, 4),
    st.data(),
)
def test_segment_starts_is_window_starts_range_by_range(counts, stride, data):
    drawn = _runs_and_ranges(counts, data)
    if drawn is None:
        return
    counts, first, ranges, lo, hi = drawn
    expected = np.concatenate([window_starts(first, counts, stride, a, b) for a, b in ranges])
    assert np.array_equal(segment_starts(first, counts, stride, lo, hi), expected)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=6),
    st.integers(1, 4),
    st.data(),
)
def test_segment_runs_expand_to_segment_starts(counts, stride, data):
    drawn = _runs_and_ranges(counts, data)
    if drawn is None:
        return
    counts, first, ranges, lo, hi = drawn
    row, take, which = segment_runs(first, counts, stride, lo, hi)
    assert (take > 0).all() and (np.diff(which) >= 0).all()
    expanded = np.concatenate([r + stride * np.arange(t) for r, t in zip(row, take)])
    assert np.array_equal(expanded, segment_starts(first, counts, stride, lo, hi))
    assert np.array_equal(np.bincount(which, take, len(ranges)), hi - lo)  # each range's windows, in its runs


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("nan", ["raise", "drop"])
def test_decode_pieces_is_decode_of_the_joined_rows(layout, nan):
    rng = np.random.default_rng(0)
    big = np.float64(FLOAT32_MAX) * (1 + 1e-9)  # beyond float32, yet rounds to its max: still a bad value
    pieces, rows0, at = [], [], 0
    for n in (5, 1, 9, 3):
        f0 = rng.standard_normal(n)  # float64
        f1 = rng.standard_normal(n).astype(np.float32)
        y = rng.integers(0, 9, n).astype(np.float64)  # an int target read with nulls as float
        f0[rng.random(n) < 0.2] = big
        f1[rng.random(n) < 0.2] = np.nan
        y[rng.random(n) < 0.2] = np.nan
        pieces.append({"f0": f0, "f1": f1, "y": y})
        rows0.append(at)
        at += n + 4  # gaps between blocks
    spec = WindowSpec(features=("f0", "f1"), targets=("y",), window=2, layout=layout, nan=nan)
    scale = (np.array([0.5, -1.0], np.float32), np.array([2.0, 0.5], np.float32))
    for y_dtype in (np.int64, np.float32, None):
        part = decode_pieces(4, "p", pieces, rows0, spec, scale, y_dtype)
        joined = {c: np.concatenate([p[c] for p in pieces]) for c in ("f0", "f1", "y")}
        with np.errstate(over="ignore", invalid="ignore"):
            ref = decode_pieces(4, "p", [joined], [0], spec, scale, y_dtype)
        assert np.array_equal(part.x, ref.x, equal_nan=True) and part.x.dtype == ref.x.dtype
        assert part.y.dtype == ref.y.dtype
        assert np.array_equal(part.y, ref.y, equal_nan=True) or y_dtype is np.int64  # NaN cast: in no window
        assert np.array_equal(part.nan_x, ref.nan_x) and np.array_equal(part.nan_y, ref.nan_y)
        if nan == "raise":
            assert len(part.nan_x) and len(part.nan_y)
        lengths = np.array([len(p["f0"]) for p in pieces])
        assert np.array_equal(part.block_table(), np.stack([rows0, np.cumsum(lengths) - lengths], axis=1))


# -- the source's coalesced reads ---------------------------------------------------------------


def test_parquet_read_ranges_is_read_rows_range_by_range(root):
    """The vectorised range arithmetic of one coalesced read, against one read per range."""
    ds = dw.WindowDataset(root, **KW)
    rng = np.random.default_rng(5)
    for index in range(len(ds.partitions)):
        readable = ds.source.readable_rows(index)
        for _ in range(20):
            starts = rng.integers(0, readable, rng.integers(1, 6))
            ranges = [(int(a), int(min(a + rng.integers(0, 30), readable))) for a in starts]
            got = ds.source.read_ranges(index, ["f0", "y"], ranges)
            for (a, b), columns in zip(ranges, got):
                want = ds.source.read_rows(index, ["f0", "y"], a, b)
                assert all(np.array_equal(columns[c], want[c]) for c in ("f0", "y"))
