"""``Ragged`` (per-partition arrays as one) and the columnar grid over it, against a list of arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dask_windows.planning.index import FileRuns, PartitionRuns, WindowGrid, runs_of_files
from dask_windows.planning.ragged import Ragged

_ARRAYS = st.lists(st.lists(st.integers(-50, 50), max_size=6), max_size=12)


@given(_ARRAYS, st.data())
def test_ragged_items_equal_the_arrays(arrays, data):
    ragged = Ragged.of([np.array(a, np.int64) for a in arrays])
    assert len(ragged) == len(arrays)
    assert [r.tolist() for r in ragged] == arrays
    assert [ragged[p].tolist() for p in range(-len(arrays), 0)] == arrays  # negative items too
    assert ragged.sizes().tolist() == [len(a) for a in arrays]
    assert ragged.sums().tolist() == [sum(a) for a in arrays] and ragged.sums().dtype == np.int64
    lo = data.draw(st.integers(0, len(arrays)))
    hi = data.draw(st.integers(lo, len(arrays)))
    assert [r.tolist() for r in ragged[lo:hi]] == arrays[lo:hi]
    assert Ragged.of(ragged) is ragged


def _file_runs(files):
    """``FileRuns`` and the ``PartitionRuns`` list it stands for, from per-file run lengths."""
    listed = []
    for i, lengths in enumerate(files):
        lengths = np.array(lengths, np.int64)
        listed.append(PartitionRuns(np.cumsum(lengths) - lengths, lengths, np.arange(len(lengths)) + 100 * i))
    flat = Ragged.of([r.lengths for r in listed])
    columns = [Ragged.of([getattr(r, name) for r in listed]).values for name in ("starts", "lengths", "keys")]
    return runs_of_files(*columns, flat.offsets), listed


@given(st.lists(st.lists(st.integers(1, 30), max_size=4), max_size=10), st.integers(1, 8), st.integers(1, 3))
def test_grid_of_file_runs_equals_the_grid_of_each_partition(files, span, stride):
    runs, listed = _file_runs(files)
    assert isinstance(runs, FileRuns) and len(runs) == len(listed)
    for got, want in zip(runs, listed):
        assert all(np.array_equal(getattr(got, n), getattr(want, n)) for n in ("starts", "lengths", "keys"))
    grid = WindowGrid.from_runs(runs, span, stride)
    assert grid.first is runs.starts  # the runs' starts are the grid's first rows: no copy
    for by in (grid, WindowGrid.from_runs(listed, span, stride)):
        for p, r in enumerate(listed):  # brute force: every window start of each run
            starts = [[s + k for k in range(0, n - span + 1, stride)] for s, n in zip(r.starts, r.lengths)]
            assert by.counts[p].tolist() == [len(w) for w in starts]
            assert [f for f, w in zip(by.first[p].tolist(), starts) if w] == [w[0] for w in starts if w]
        assert by.windows_per_partition.tolist() == [int(c.sum()) for c in by.counts]


def test_grid_of_many_partitions_holds_a_few_arrays_not_one_per_partition():
    runs, _ = _file_runs([[9, 7]] * 10_000)  # 6 and 4 windows
    grid = WindowGrid.from_runs(runs, span=4, stride=1)
    for ragged in (grid.first, grid.counts, runs.starts, runs.lengths, runs.keys):
        assert isinstance(ragged, Ragged) and ragged.values.shape == (20_000,)
        assert ragged.offsets is runs.starts.offsets  # one offsets array shared by all of them
    split = grid.restrict([np.ones(2, np.int64)] * 10_000, [np.full(2, 3, np.int64)] * 10_000)
    assert isinstance(split.counts, Ragged) and split.counts.values.tolist() == [2] * 20_000


@given(st.lists(st.lists(st.integers(1, 30), max_size=4), max_size=8), st.integers(1, 3), st.data())
def test_restrict_equals_clipping_each_run(files, stride, data):
    runs, listed = _file_runs(files)
    grid = WindowGrid.from_runs(runs, 2, stride)
    bounds = [st.lists(st.integers(-3, 20), min_size=len(r.lengths), max_size=len(r.lengths)) for r in listed]
    keep_lo = [np.array(data.draw(b), np.int64) for b in bounds]
    keep_hi = [np.array(data.draw(b), np.int64) for b in bounds]
    sub = grid.restrict(keep_lo, keep_hi)
    for p in range(len(listed)):
        for r in range(len(listed[p].lengths)):
            f, c = int(grid.first[p][r]), int(grid.counts[p][r])
            kept = [f + k * stride for k in range(c) if keep_lo[p][r] <= k < keep_hi[p][r]]
            assert (int(sub.counts[p][r]), int(sub.first[p][r]) if kept else None) == (
                len(kept),
                kept[0] if kept else None,
            )
