"""Pieces along the source's decode units (Parquet row groups), against brute force.

The arithmetic (``plan.unit_pieces``, ``plan.piece_table`` with cells, ``reading.unit_windows``)
by hypothesis; the plan over ranks and workers (every window once, equal batches); the loader on
Parquet files of small row groups against the pandas oracle: coverage with the windows crossing
row-group cuts, pieces that follow row groups, determinism, resume at every batch, and a state
of the earlier piece plan refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import collect, make_frames, oracle_starts, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.planning.plan import PIECE_ORDER, batches_per_rank, piece_table, plan_reader, unit_pieces
from dask_windows.planning.windows import window_starts
from dask_windows.planning.world import World
from dask_windows.runtime.reading import piece_cells, unit_windows

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, batch_size=16, return_index=True)
KW["pieces_per_partition"] = 16  # the piece order these tests are about, at its former default
ROW_GROUP = 23


# -- arithmetic ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=9), st.integers(1, 30), st.integers(1, 6))
def test_unit_pieces_tile_the_windows_along_units(cells, n, min_windows):
    cells = np.array(cells, np.int64)
    cuts = unit_pieces(cells, n, min_windows)
    total = int(cells.sum())
    assert cuts[0] == 0 and cuts[-1] == total and (total == 0 or (np.diff(cuts) > 0).all())
    if total == 0:
        return
    unit = np.repeat(np.arange(len(cells)), cells)  # (total,) unit of each window (brute force)
    full = int((cells > 0).sum())
    bounds = set(np.cumsum(cells).tolist())
    pieces = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    if n <= full:  # runs of whole units: every cut is a unit boundary, n pieces
        assert len(pieces) == n and all(c in bounds for c in cuts[1:].tolist())
    else:  # each piece inside one unit, every unit cut into pieces of its own
        assert all(len(set(unit[a:b].tolist())) == 1 for a, b in pieces)
        assert full <= len(pieces) <= n + full
        sizes = cells[cells > 0]
        if (sizes == sizes[0]).all() and n % full == 0 and sizes[0] // min_windows >= n // full:
            assert len(pieces) == n  # equal units: equal shares, n pieces in all
        for a, b in pieces:
            size = int(cells[unit[a]])
            assert b - a >= min(min_windows, size) or size // min_windows <= 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=5),
    st.integers(1, 12),
    st.integers(1, 4),
    st.data(),
)
def test_piece_table_with_cells_covers_every_window_once(counts, k, min_windows, data):
    counts = np.array(counts, np.int64)
    cells = []
    for c in counts.tolist():
        if data.draw(st.booleans()):
            cells.append(None)
            continue
        cuts = sorted(data.draw(st.lists(st.integers(0, c), max_size=6)))
        cells.append(np.diff(np.array([0, *cuts, c], np.int64)))
    partition, lo, hi = piece_table(counts, k, min_windows, cells)
    for p, c in enumerate(counts.tolist()):
        mine = partition == p
        assert np.array_equal(np.sort(lo[mine]), lo[mine])  # canonical order: partition, then row
        seen = np.zeros(c, np.int64)
        for a, b in zip(lo[mine].tolist(), hi[mine].tolist()):
            assert b > a
            seen[a:b] += 1
        assert (seen == 1).all()
        if cells[p] is None:  # no units: the equal pieces of before
            want = piece_table(counts[p : p + 1], k, min_windows)
            assert np.array_equal(want[1], lo[mine]) and np.array_equal(want[2], hi[mine])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7)), min_size=0, max_size=5),
    st.integers(1, 4),
    st.lists(st.integers(0, 80), max_size=5),
)
def test_unit_windows_counts_the_starts_in_each_unit(runs, stride, cuts):
    first, counts, row = [], [], 0
    for gap, count in runs:  # runs in row order, each ``count`` starts ``stride`` apart
        row += gap
        first.append(row)
        counts.append(count)
        row += max(count, 1) * stride
    first_a, counts_a = np.array(first, np.int64), np.array(counts, np.int64)
    rows = max(row, 1)
    bounds = np.array([0, *sorted(min(c, rows) for c in cuts), rows], np.int64)
    got = unit_windows(first_a, counts_a, stride, bounds)
    starts = window_starts(first_a, counts_a, stride, 0, int(counts_a.sum())) if len(first) else np.zeros(0)
    want = [int(((starts >= a) & (starts < b)).sum()) for a, b in zip(bounds[:-1], bounds[1:])]
    assert got.tolist() == want


@pytest.mark.parametrize("world_size,num_workers,k", [(1, 1, 3), (2, 2, 5), (3, 1, 40)])
def test_ranks_and_workers_share_unit_pieces_exactly(world_size, num_workers, k):
    rng = np.random.default_rng(k)
    counts = rng.integers(0, 90, 7)
    cells = [np.diff(np.r_[0, np.sort(rng.integers(0, c + 1, 4)), c]) for c in counts.tolist()]
    total = int(counts.sum())
    seen, batches = [], []
    for rank in range(world_size):
        mine = 0
        for worker in range(num_workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            plan = plan_reader(
                counts, world, seed=4, epoch=1, shuffle=True, batch_size=6, drop_last=False,
                buffer_partitions=2, pieces_per_partition=k, cells=cells,
            )  # fmt: skip
            seen += [(s.partition, w) for s in plan.segments for w in range(s.lo, s.hi)]
            mine += plan.num_batches
        batches.append(mine)
    assert len(set(batches)) == 1 and batches[0] == batches_per_rank(total, world_size, 6, False)
    assert len(seen) == len(set(seen)) == total - total % world_size


# -- the loader on Parquet row groups -----------------------------------------------------------


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=3, num_series=6, min_len=20, max_len=150)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("unit_pieces")
    write_parquet(frames, str(path), row_group_size=ROW_GROUP)
    return str(path)


def _indices(batches: list) -> np.ndarray:
    for x, y, idx in batches:  # values are the rows the index names (see helpers.make_frames)
        assert np.array_equal(x[:, 0, :], idx[:, None] + np.arange(8))
    return np.concatenate([b[-1] for b in batches])


@pytest.mark.parametrize("pieces", [16, 2, 3, 40])
def test_pieces_follow_row_groups_and_keep_every_window(frames, root, pieces):
    ds = dw.WindowDataset(root, **{**KW, "pieces_per_partition": pieces})
    ds.set_epoch(2)
    first = collect(ds)
    idx = _indices(first)
    expected = oracle_starts(frames, "sid", 8)
    assert len(idx) == len(np.unique(idx)) and np.array_equal(np.sort(idx), expected)
    offsets = np.cumsum([0] + [len(f) for f in frames])
    local = idx - offsets[np.searchsorted(offsets, idx, side="right") - 1]  # file row of each start
    assert ((local // ROW_GROUP) != ((local + 7) // ROW_GROUP)).any()  # windows crossing row-group cuts
    k = ds.spec.pieces_per_partition
    cells = piece_cells(ds._read_values())
    assert cells is not None
    for seg in ds._plan(World()).segments:  # a piece holds whole row groups or lies inside one
        unit = np.repeat(np.arange(len(cells[seg.partition])), cells[seg.partition])[seg.lo : seg.hi]
        units = cells[seg.partition]
        if k < (units > 0).sum():
            ends = set(np.cumsum(units).tolist()) | {0}
            assert seg.lo in ends or seg.hi in ends
        else:
            assert len(set(unit.tolist())) == 1
    again = dw.WindowDataset(root, **{**KW, "pieces_per_partition": pieces})
    again.set_epoch(2)
    assert all(all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(first, collect(again)))


@pytest.mark.parametrize("pieces", [16, 3])
def test_resume_at_every_batch_with_unit_pieces(root, pieces):
    settings = dict(KW, batch_size=12, pieces_per_partition=pieces)
    ds = dw.WindowDataset(root, **settings)
    ds.set_epoch(1)
    full = collect(ds)
    for k in range(len(full) + 1):
        state = ds.state_dict(batches=k, num_workers=0)
        resumed = dw.WindowDataset(root, **settings)
        resumed.load_state_dict(state)
        rest = collect(resumed)
        assert len(rest) == len(full) - k
        assert all(np.array_equal(p[-1], q[-1]) and np.array_equal(p[0], q[0]) for p, q in zip(rest, full[k:]))


def test_dataloader_workers_share_unit_pieces_exactly(frames, root):
    ds = dw.WindowDataset(root, **{**KW, "pieces_per_partition": 3})
    batches = collect(ds, dict(num_workers=2))
    assert len(batches) == len(ds) and np.array_equal(np.sort(_indices(batches)), oracle_starts(frames, "sid", 8))


def test_a_state_of_the_earlier_piece_plan_is_refused(root):
    ds = dw.WindowDataset(root, **KW)
    state = ds.state_dict(batches=1, num_workers=0)
    assert state["dataset"]["piece_order"] == PIECE_ORDER == "stratified-units"
    state["dataset"]["piece_order"] = "stratified"  # as saved before pieces followed row groups
    with pytest.raises(ConfigError, match="piece_order: 'stratified' in the state, 'stratified-units' here"):
        dw.WindowDataset(root, **KW).load_state_dict(state)


def test_sources_without_units_keep_equal_pieces(frames):
    arrays = [f[["f0", "f1", "y"]].to_numpy(np.float32) for f in frames]
    ds = dw.WindowDataset(arrays, features=[0, 1], window=8, batch_size=16, pieces_per_partition=4)
    assert piece_cells(ds._read_values()) is None
    plan = ds._plan(World())
    counts = ds.grid.windows_per_partition
    partition, lo, hi = piece_table(counts, 4, -(-ds.spec.span // ds.spec.stride))
    assert sorted((s.partition, s.lo, s.hi) for s in plan.segments) == sorted(
        zip(partition.tolist(), lo.tolist(), hi.tolist())
    )


# -- halos from row-group heads (sources/parquet_heads) ------------------------------------------


def _decoded(source, monkeypatch) -> list:
    """Row groups each whole read of ``source`` decodes, recorded."""
    seen: list = []
    original = type(source)._read_groups

    def record(self, index, row_groups, columns):
        seen.extend((index, g) for g in row_groups)
        return original(self, index, row_groups, columns)

    monkeypatch.setattr(type(source), "_read_groups", record)
    return seen


def test_a_halo_reads_the_next_row_groups_head_not_the_row_group(root, monkeypatch):
    from dask_windows.sources.parquet import heads as parquet_heads

    ds = dw.WindowDataset(root, **KW)
    source, cols, halo = ds.source, list(ds.spec.columns), ds.spec.span - 1
    heads = []
    original = parquet_heads.read_head
    monkeypatch.setattr(parquet_heads, "read_head", lambda *a: heads.append(a[2]) or original(*a))
    seen = _decoded(source, monkeypatch)
    for halo_rows in (halo, 1, 3):
        ranges = [(2, ROW_GROUP + halo_rows), (2 * ROW_GROUP + 1, 3 * ROW_GROUP + halo_rows)]
        whole = source.read_ranges(0, cols, ranges)
        seen.clear()
        got: list[list[dict]] = [[], []]
        for i, row, columns in source.read_ranges_chunks(0, cols, ranges):
            assert row == sum(len(c["f0"]) for c in got[i])
            got[i].append(columns)
        for piece, chunks in zip(whole, got):
            for col in cols:
                assert np.array_equal(np.concatenate([c[col] for c in chunks]), piece[col])  # bit for bit
        assert sorted(g for _, g in seen) == [0, 2]  # row groups 1 and 3: their heads only
    assert heads == [1, 3]  # one first-batch read of each, then kept


def test_head_cache_is_bounded_and_starts_empty_in_another_process():
    import pickle

    from dask_windows.sources.parquet.heads import HeadCache

    cache = HeadCache(limit=3 * 80)
    for g in range(5):
        cache.put(("f", g, ("a",)), {"a": np.arange(100, dtype=np.float64) + g}, 10)  # 80 bytes each
    assert [cache.get(("f", g, ("a",)), 10) is None for g in range(5)] == [True, True, False, False, False]
    assert np.array_equal(cache.get(("f", 4, ("a",)), 4)["a"], np.arange(4) + 4.0)
    assert cache.get(("f", 4, ("a",)), 11) is None  # more rows than kept
    assert pickle.loads(pickle.dumps(cache)).get(("f", 4, ("a",)), 1) is None


def test_a_row_group_with_nulls_is_decoded_whole_for_its_halo(tmp_path, monkeypatch):
    import pandas as pd

    n = 4 * ROW_GROUP
    ints = pd.array(np.arange(n) * 7, dtype="Int64")
    ints[ROW_GROUP + 10] = pd.NA  # row group 1 converts to float64 in a whole read: no head for it
    frame = pd.DataFrame({"f0": ints, "f1": np.arange(n, dtype=np.float32)})
    write_parquet([frame], str(tmp_path), row_group_size=ROW_GROUP)
    ds = dw.WindowDataset(str(tmp_path), features=["f0", "f1"], window=8, batch_size=4, nan="drop")
    seen = _decoded(ds.source, monkeypatch)
    cols = list(ds.spec.columns)
    list(ds.source.read_ranges_chunks(0, cols, [(0, ROW_GROUP + 7), (2 * ROW_GROUP, 2 * ROW_GROUP + 30)]))
    assert sorted(g for _, g in seen) == [0, 1, 2]  # row group 1 whole, row group 3's head alone


# -- two buffers' pieces from one read (reading.PairedReads) --------------------------------------


@pytest.fixture(scope="module")
def many():
    return make_frames(seed=6, num_files=4, num_series=16, min_len=60, max_len=400)


@pytest.fixture(scope="module")
def many_root(many, tmp_path_factory):
    path = tmp_path_factory.mktemp("paired")
    write_parquet(many, str(path), row_group_size=ROW_GROUP)
    return str(path)


@pytest.mark.parametrize(
    "kw,fewer",
    [
        (dict(pieces_per_partition=32), True),  # the former default at buffer_partitions=1
        (dict(pieces_per_partition=3, stride=3), False),  # whole row groups: two buffers share none
        (dict(layout="NLC", normalize={"mean": [1.0, -2.0], "std": [3.0, 0.5]}, pieces_per_partition=120), True),
        (
            dict(series=None, partition_bytes=1, buffer_partitions=2, pieces_per_partition=16),
            True,
        ),  # partitions cut at row groups
    ],
)
def test_paired_reads_yield_the_bits_of_reads_apart_with_fewer_decodes(many, many_root, monkeypatch, kw, fewer):
    from dask_windows.runtime import reading
    from dask_windows.speedups import pairs

    settings = {**KW, "buffer_partitions": 1, "next_pass_seconds": 0, **kw}  # decodes of one pass (no read-ahead)
    ds = dw.WindowDataset(many_root, **settings)
    ds.set_epoch(4)
    units = reading.piece_units(ds._plan(World()))
    assert pairs.pairs_allowed(ds._read_values(), units)
    seen = _decoded(ds.source, monkeypatch)
    paired = collect(ds)
    decoded_paired = len(seen)
    seen.clear()
    monkeypatch.setattr(pairs, "pairs_allowed", lambda ds, units: False)
    ds.set_epoch(4)
    apart = collect(ds)
    assert len(paired) == len(apart) == len(ds)
    assert all(all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(paired, apart))  # bit for bit
    assert decoded_paired < len(seen) if fewer else decoded_paired <= len(seen), (decoded_paired, len(seen))
    idx = np.concatenate([b[-1] for b in paired])
    assert np.array_equal(np.sort(idx), oracle_starts(many, settings["series"], 8, settings.get("stride", 1)))


def test_paired_reads_are_off_where_they_could_change_values_or_memory(tmp_path, root):
    import pandas as pd

    from dask_windows.runtime import reading
    from dask_windows.speedups import pairs

    def allowed(path, **kw):
        ds = dw.WindowDataset(path, **{**KW, **kw})
        return pairs.pairs_allowed(ds._read_values(), reading.piece_units(ds._plan(World())))

    assert allowed(root) and not allowed(root, prefetch_partitions=0) and not allowed(root, pieces_per_partition=1)
    n = 4 * ROW_GROUP
    ints = pd.array(np.arange(n), dtype="Int64")
    ints[3] = pd.NA  # integers with nulls: a read's dtype depends on its row groups
    frame = pd.DataFrame({"sid": np.zeros(n, np.int64), "f0": ints, "f1": np.ones(n), "y": np.ones(n)})
    write_parquet([frame, frame], str(tmp_path), row_group_size=ROW_GROUP)
    assert not allowed(str(tmp_path), nan="drop")


def test_paired_reads_skip_an_unreadable_partition_like_reads_apart(many_root, monkeypatch):
    from dask_windows.errors import SourceReadError
    from dask_windows.speedups import pairs

    datasets = [dw.WindowDataset(many_root, **KW, on_error="skip", buffer_partitions=1) for _ in range(2)]
    original = type(datasets[0].source)._read_groups

    def broken(self, index, row_groups, columns):  # the file breaks after the dataset was opened
        if index == 1:
            raise SourceReadError("partition 1 is unreadable")
        return original(self, index, row_groups, columns)

    monkeypatch.setattr(type(datasets[0].source), "_read_groups", broken)
    with pytest.warns(Warning, match="unreadable"):
        paired = collect(datasets[0])
    monkeypatch.setattr(pairs, "pairs_allowed", lambda ds, units: False)
    with pytest.warns(Warning, match="unreadable"):
        apart = collect(datasets[1])
    assert len(paired) == len(apart) == len(datasets[0])
    assert all(all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(paired, apart))
    assert [s.name for s in datasets[0].skipped] == [s.name for s in datasets[1].skipped] != []
