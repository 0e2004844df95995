"""Index arithmetic against brute force: runs, run splitting, window starts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.planning.index import PartitionRuns, WindowGrid
from dask_windows.planning.windows import find_runs, split_runs_at, window_starts, windows_per_run


def brute_runs(keys):
    out = []
    for r, k in enumerate(keys):
        if r == 0 or k != keys[r - 1]:
            out.append([r, 0])
        out[-1][1] += 1
    return out


@given(st.lists(st.integers(0, 3), max_size=60))
def test_find_runs_matches_brute_force(keys):
    starts, lengths = find_runs(np.array(keys, dtype=np.int64))
    assert [[int(s), int(n)] for s, n in zip(starts, lengths)] == brute_runs(keys)


def test_find_runs_strings_and_nan_keys():
    starts, lengths = find_runs(np.array(["a", "a", "b", "a"], dtype=object))
    assert starts.tolist() == [0, 2, 3] and lengths.tolist() == [2, 1, 1]
    starts, lengths = find_runs(np.array([np.nan, np.nan, 1.0]))
    assert starts.tolist() == [0, 2] and lengths.tolist() == [2, 1]


@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=8),
    st.data(),
)
def test_split_runs_at_removes_exactly_the_bad_rows(lengths, data):
    lengths = np.array(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    rows = int(lengths.sum())
    bad = np.array(sorted(data.draw(st.sets(st.integers(0, rows - 1)))), dtype=np.int64)
    pieces, piece_lengths = split_runs_at(starts, lengths, bad)
    assert np.all(piece_lengths > 0)
    covered = np.concatenate([np.arange(s, s + n) for s, n in zip(pieces, piece_lengths)] or [np.zeros(0, int)])
    assert covered.tolist() == sorted(set(range(rows)) - set(bad.tolist()))
    # No piece crosses a run boundary or a bad row.
    run_of = np.repeat(np.arange(len(lengths)), lengths)
    for s, n in zip(pieces, piece_lengths):
        assert len(set(run_of[s : s + n])) == 1


@settings(max_examples=200)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=6),
    st.integers(1, 8),
    st.integers(1, 4),
    st.data(),
)
def test_window_starts_enumerate_the_grid(lengths, span, stride, data):
    lengths = np.array(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    counts = windows_per_run(lengths, span, stride)
    expected = [s + k for s, n in zip(starts, lengths) for k in range(0, n - span + 1, stride)]
    assert counts.sum() == len(expected)
    lo = data.draw(st.integers(0, len(expected)))
    hi = data.draw(st.integers(lo, len(expected)))
    got = window_starts(starts, counts, stride, lo, hi)
    assert got.tolist() == expected[lo:hi]


def test_grid_restrict_keeps_the_start_grid():
    runs = [PartitionRuns(np.array([0, 10]), np.array([10, 20]), np.array([1, 2]))]
    grid = WindowGrid.from_runs(runs, span=4, stride=2)
    assert grid.counts[0].tolist() == [4, 9]
    sub = grid.restrict([np.array([1, 3])], [np.array([3, 100])])
    assert window_starts(sub.first[0], sub.counts[0], 2, 0, int(sub.counts[0].sum())).tolist() == [
        2,
        4,
        16,
        18,
        20,
        22,
        24,
        26,
    ]


@given(st.lists(st.integers(0, 2), min_size=1, max_size=50), st.data())
def test_join_runs_over_chunks_equals_runs_of_the_whole(keys, data):
    from dask_windows.planning.windows import join_runs

    keys = np.array(keys)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(keys) - 1)), max_size=5)))
    bounds = [0, *[c for c in cuts if c < len(keys)], len(keys)]
    pieces = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s, n = find_runs(keys[a:b])
        pieces.append((s + a, n, keys[a:b][s]))
    starts, lengths, run_keys = join_runs(pieces)
    expect_s, expect_n = find_runs(keys)
    assert starts.tolist() == expect_s.tolist() and lengths.tolist() == expect_n.tolist()
    assert run_keys.tolist() == keys[expect_s].tolist()


def _grid_starts(runs: PartitionRuns, span: int, stride: int) -> list[int]:
    grid = WindowGrid.from_runs([runs], span, stride)
    return window_starts(grid.first[0], grid.counts[0], stride, 0, int(grid.counts[0].sum())).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(1, 6), st.integers(1, 4), st.data())
def test_origin_and_owned_place_runs_on_their_series_grid(lengths, span, stride, data):
    """A run starting at row ``origin`` of its series, windows only in its first ``owned`` rows."""
    lengths = np.array(lengths, np.int64)
    starts = np.cumsum(lengths) - lengths
    origin = np.array([data.draw(st.integers(0, 20)) for _ in lengths], np.int64)
    owned = np.array([data.draw(st.integers(0, int(n))) for n in lengths], np.int64)
    runs = PartitionRuns(starts, lengths, np.arange(len(lengths)), origin=origin, owned=owned)
    want = [
        int(s) + r
        for s, n, o, w in zip(starts, lengths, origin, owned)
        for r in range(int(n))
        if (o + r) % stride == 0 and r < w and r + span <= n
    ]
    assert _grid_starts(runs, span, stride) == want
    # Without origin and owned the grid is the plain one.
    assert _grid_starts(PartitionRuns(starts, lengths, np.arange(len(lengths))), span, stride) == [
        int(s) + r for s, n in zip(starts, lengths) for r in range(0, int(n) - span + 1, stride)
    ]


def test_nan_drop_keeps_the_run_grid_issue_11_item_5():
    """NaN at row 2, window 2, stride 2: starts [0, 4, 6, 8], not a grid restarted after the NaN."""
    from dask_windows.planning.index import scan_runs

    runs = scan_runs(1, lambda i: (np.array([0]), np.array([10]), np.array(["a"])), lambda i: np.array([2]))
    assert _grid_starts(runs[0], 2, 2) == [0, 4, 6, 8]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 25), min_size=1, max_size=4), st.integers(1, 5), st.integers(1, 4), st.booleans(), st.data()
)
def test_nan_drop_drops_only_windows_holding_a_nan(lengths, span, stride, placed, data):
    """Brute force: the grid of each whole run (with its origin and owned rows), minus windows with a bad row."""
    from dask_windows.planning.index import scan_runs

    lengths = np.array(lengths, np.int64)
    starts = np.cumsum(lengths) - lengths
    total = int(lengths.sum())
    bad = np.array(sorted(data.draw(st.sets(st.integers(0, total - 1), max_size=6))), np.int64)
    origin = np.array([data.draw(st.integers(0, 9)) for _ in lengths], np.int64) if placed else None
    owned = np.array([data.draw(st.integers(0, int(n))) for n in lengths], np.int64) if placed else None
    found = (starts, lengths, np.arange(len(lengths))) + ((origin, owned) if placed else ())
    runs = scan_runs(1, lambda i: found, lambda i: bad)[0]
    o = np.zeros(len(lengths), np.int64) if origin is None else origin
    w = lengths if owned is None else owned
    want = [
        int(s) + r
        for s, n, oo, ww in zip(starts, lengths, o, w)
        for r in range(int(n))
        if (oo + r) % stride == 0 and r < ww and r + span <= n and not np.any((bad >= s + r) & (bad < s + r + span))
    ]
    assert _grid_starts(runs, span, stride) == want


@pytest.mark.parametrize("stride", [1, 2, 3, 5])
@pytest.mark.parametrize("key_kind", ["int", "str"])
def test_a_series_across_row_group_partitions_keeps_its_stride_grid(tmp_path, stride, key_kind):
    """A file cut into partitions at row groups: starts lie on each whole series' grid, none lost."""
    import pandas as pd

    from dask_windows.dataset import WindowDataset

    lengths = [23, 140, 7, 61]  # series crossing one or several row-group cuts (groups of 20 rows)
    ids = np.repeat(np.arange(len(lengths)), lengths)
    frame = pd.DataFrame(
        {
            "v": np.arange(len(ids), dtype=np.float32),
            "sid": ids if key_kind == "int" else np.array([f"s{i}" for i in ids]),
        }
    )
    frame.to_parquet(tmp_path / "one.parquet", row_group_size=20)
    span = 9
    ds = WindowDataset(
        str(tmp_path),
        features=["v"],
        series="sid",
        window=span,
        stride=stride,
        partition_bytes=1,
        return_index=True,
        batch_size=16,
    )
    assert len(ds.partitions) > 5  # really cut at row groups
    got = np.sort(np.concatenate([idx.numpy() for _, idx in ds]))
    starts, first = [], 0
    for n in lengths:
        starts.extend(range(first, first + n - span + 1, stride))
        first += n
    np.testing.assert_array_equal(got, np.array(starts))
