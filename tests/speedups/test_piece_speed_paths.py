"""The fast paths of reading pieces: one decode per partition's pieces of a buffer, merged blocks,
all segments' window starts in one pass.

Each path against a brute-force reference: ``segment_starts`` against ``window_starts`` range by
range, ``merge_rows`` against the set of rows, ``decode_pieces`` against ``decode`` of the joined
rows, and the loader against the per-piece path it replaces (one read, decode and ``Part`` per
piece, as before) bit for bit - batches, indices, NaN messages, resumed tails - and against the
pandas oracle of every valid window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import collect, make_frames, oracle_starts, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.checks import FLOAT32_MAX
from dask_windows.planning.windows import window_starts
from dask_windows.planning.world import World
from dask_windows.runtime import buffer as buffer_module
from dask_windows.runtime import reading
from dask_windows.runtime.blocks import merge_rows, segment_runs, segment_starts
from dask_windows.runtime.buffer import Buffer, decode, decode_pieces, piece_units
from dask_windows.spec import WindowSpec

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, batch_size=16, return_index=True)


def per_piece_read_unit(ds, unit, reader, arena=None):
    """The path before: each piece read, decoded and held on its own (its halo included)."""
    return [reading.read_part(ds, seg, reader) for seg in unit]


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


@pytest.mark.parametrize(
    "kw",
    [
        dict(pieces_per_partition=16),  # the piece order at its former default
        dict(stride=3, pieces_per_partition=5),
        dict(series=None, pieces_per_partition=4, buffer_partitions=3),
        dict(pieces_per_partition=60, partition_bytes=1),  # windows cross the row-group cuts
        dict(nan="drop", stride=2, pieces_per_partition=16),
    ],
)
def test_starts_written_run_by_run_are_the_vectorised_starts(root, kw, monkeypatch):
    ds = dw.WindowDataset(root, **{**KW, **kw})
    plan = ds._plan(World())
    units = piece_units(plan)
    reader = ds.source.reader([u[0].partition for u in units], list(ds.spec.columns))
    arena = reading.BufferArena(ds._read_values(), plan, units)
    parts = iter([p for unit in units for p in reading.read_unit(ds._read_values(), unit, reader, arena)])
    for group in plan.buffers:
        mine = [next(parts) for _ in group]
        starts = {}
        for name, ramp in (("vectorised", 10**18), ("runs", 1)):
            monkeypatch.setattr(buffer_module, "_RAMP_WINDOWS", ramp)
            starts[name] = Buffer(mine, group, ds.grid, ds.row_offsets, ds.spec).starts
        assert starts["runs"].dtype == starts["vectorised"].dtype
        assert np.array_equal(starts["runs"], starts["vectorised"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=8))
def test_merge_rows_covers_exactly_the_union_in_disjoint_blocks(ranges):
    rows = np.array([(a, a + n) for a, n in ranges], np.int64).reshape(-1, 2)
    blocks = merge_rows(rows)
    union = sorted({r for a, b in rows for r in range(a, b)})
    assert sorted(r for a, b in blocks for r in range(a, b)) == union
    assert (blocks[:, 1] > blocks[:, 0]).all()
    assert (blocks[1:, 0] > blocks[:-1, 1]).all()  # disjoint and not touching: nothing left to merge


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
            ref = decode(4, "p", joined, spec, scale, 0, y_dtype)
        assert np.array_equal(part.x, ref.x, equal_nan=True) and part.x.dtype == ref.x.dtype
        assert part.y.dtype == ref.y.dtype
        assert np.array_equal(part.y, ref.y, equal_nan=True) or y_dtype is np.int64  # NaN cast: in no window
        assert np.array_equal(part.nan_x, ref.nan_x) and np.array_equal(part.nan_y, ref.nan_y)
        if nan == "raise":
            assert len(part.nan_x) and len(part.nan_y)
        lengths = np.array([len(p["f0"]) for p in pieces])
        assert np.array_equal(part.block_table(), np.stack([rows0, np.cumsum(lengths) - lengths], axis=1))


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("group_rows", [1, 6, 1 << 17])  # every chunk alone; a few together; a whole read
def test_decode_chunks_grouped_is_decode_pieces(layout, group_rows, monkeypatch):
    """Chunks of one read decoded together (``decode_chunks`` groups them): the values, bad rows and
    blocks ``decode_pieces`` gives the whole pieces, with reads of several pieces and pieces of several reads."""
    monkeypatch.setattr(buffer_module, "_GROUP_ROWS", group_rows)
    rng = np.random.default_rng(3)
    big = np.float64(FLOAT32_MAX) * (1 + 1e-9)
    sizes = np.array([5, 1, 9, 3, 7])
    rows0 = np.cumsum(sizes + 2) - sizes - 2  # gaps between pieces
    file_rows = int(rows0[-1] + sizes[-1])
    cols = {"f0": rng.standard_normal(file_rows), "f1": rng.standard_normal(file_rows).astype(np.float32)}
    cols["f0"][rng.random(file_rows) < 0.15] = big
    cols["f1"][rng.random(file_rows) < 0.15] = np.nan
    cols["y"] = rng.standard_normal(file_rows)
    cols["y"][rng.random(file_rows) < 0.15] = np.nan
    cuts = [0, 4, 6, 17, file_rows]  # reads of file rows [cuts[i], cuts[i+1]): each its own arrays

    def chunks():
        for lo, hi in zip(cuts, cuts[1:]):
            data = {c: v[lo:hi].copy() for c, v in cols.items()}  # one read's arrays
            for i, (r0, n) in enumerate(zip(rows0.tolist(), sizes.tolist())):
                a, b = max(r0, lo), min(r0 + n, hi)
                if b > a:
                    yield i, a - r0, {c: v[a - lo : b - lo] for c, v in data.items()}

    spec = WindowSpec(features=("f0", "f1"), targets=("y",), window=2, layout=layout, nan="raise")
    rows = int(sizes.sum())
    x = np.full((2, rows + 3) if layout == "NCL" else (rows + 3, 2), -7.0, np.float32)
    y = np.full((1, rows + 3), -7.0, np.float32)
    part = buffer_module.decode_chunks(4, "p", chunks(), rows0, sizes, spec, None, np.float32, (x, y, 3))
    pieces = [{c: v[r0 : r0 + n] for c, v in cols.items()} for r0, n in zip(rows0.tolist(), sizes.tolist())]
    with np.errstate(over="ignore", invalid="ignore"):
        ref = decode_pieces(4, "p", pieces, rows0, spec, None, np.float32)
    assert part is not None
    assert np.array_equal(part.x, ref.x, equal_nan=True) and np.array_equal(part.y, ref.y, equal_nan=True)
    assert np.array_equal(part.nan_x, ref.nan_x) and np.array_equal(part.nan_y, ref.nan_y) and len(ref.nan_x)
    assert np.array_equal(part.block_table(), ref.block_table())
    head = x[:, :3] if layout == "NCL" else x[:3]
    assert (head == -7.0).all() and (y[:, :3] == -7.0).all()  # nothing written before the arena row


# -- the loader against the per-piece path and the oracle -------------------------------------


def _flat(batches):
    return [np.concatenate([b[i] for b in batches]) for i in range(len(batches[0]))]


@pytest.mark.parametrize(
    "kw",
    [
        dict(pieces_per_partition=60),
        dict(pieces_per_partition=60, stride=3, horizon=2, buffer_partitions=2),
        dict(pieces_per_partition=7, layout="NLC", series=None, batch_size=5),
        dict(pieces_per_partition=60, partition_bytes=1),  # files cut at row groups: windows cross the cuts
    ],
)
def test_many_tiny_pieces_yield_what_the_per_piece_path_yields(frames, root, kw, monkeypatch):
    settings = {**KW, **kw}
    ds = dw.WindowDataset(root, **settings)
    ds.set_epoch(1)
    units = piece_units(ds._plan(World()))
    if "partition_bytes" not in kw:  # (cut at row groups of 7 rows, a partition is one piece)
        assert len(units) < len(ds._plan(World()).segments)  # pieces were read together
    fast = collect(ds)
    monkeypatch.setattr(reading, "read_unit", per_piece_read_unit)
    ds.set_epoch(1)  # a pass would otherwise take the next epoch
    slow = collect(ds)
    assert len(fast) == len(slow) == len(ds)
    assert all(np.array_equal(a, b) for p, q in zip(fast, slow) for a, b in zip(p, q))  # bit for bit
    x, _, idx = _flat(fast)
    expected = oracle_starts(frames, settings["series"], 8, settings.get("stride", 1), settings.get("horizon", 0))
    assert len(np.unique(idx)) == len(idx) and np.array_equal(np.sort(idx), expected)
    rows = x[:, :, 0] if settings.get("layout", "NCL") == "NLC" else x[:, 0, :]  # f0 == global row
    assert np.array_equal(rows, idx[:, None] + np.arange(8)[None, :])


def test_adjacent_pieces_of_a_buffer_are_one_block_without_a_second_halo(tmp_path):
    rows = 400
    frame = pd.DataFrame({"f0": np.arange(rows, dtype=np.float32), "f1": np.ones(rows, np.float32)})
    write_parquet([frame, frame.assign(f0=frame.f0 + rows)], str(tmp_path), row_group_size=50)
    settings = dict(features=["f0", "f1"], window=16, stride=2, batch_size=8, return_index=True)
    ds = dw.WindowDataset(str(tmp_path), **settings, buffer_partitions=2, pieces_per_partition=10)
    plan = ds._plan(World())
    assert len(plan.buffers) == 1  # one buffer holds every piece of both files: all adjacent
    reader = ds.source.reader([0, 1], list(ds.spec.columns))
    arena = reading.BufferArena(ds._read_values(), plan, piece_units(plan))
    every = []
    for unit in piece_units(plan):
        parts = reading.read_unit(ds._read_values(), unit, reader, arena)
        assert len(unit) == 10 and all(p is parts[0] for p in parts)
        assert len(parts[0].block_table()) == 1
        last = (rows - 16) // 2 * 2
        assert parts[0].x.shape == (2, last + 16)  # the rows of the windows, each once
        every += parts
    buffer = Buffer(every, plan.buffers[0], ds.grid, ds.row_offsets, ds.spec)
    assert np.shares_memory(buffer.gatherer._x, every[0].arena[0])  # decoded into the buffer's array: no join
    segs = plan.buffers[0]
    swapped = Buffer(every[10:] + every[:10], segs[10:] + segs[:10], ds.grid, ds.row_offsets, ds.spec)
    assert not np.shares_memory(swapped.gatherer._x, every[0].arena[0])  # parts out of place: joined
    assert np.array_equal(np.sort(swapped.global_rows(swapped.starts)), np.sort(buffer.global_rows(buffer.starts)))
    idx = np.concatenate([b[-1] for b in collect(ds)])
    assert np.array_equal(np.sort(idx), np.concatenate([np.arange(0, rows - 15, 2), np.arange(rows, 2 * rows - 15, 2)]))


def _raise_message(ds) -> str:
    with pytest.raises(dw.DataError) as info:
        collect(ds)
    return str(info.value)


@pytest.mark.parametrize("role,column", [("feature", "f1"), ("target", "y")])
def test_nan_raise_names_the_same_row_and_window_as_the_per_piece_path(frames, tmp_path, monkeypatch, role, column):
    frames = [f.copy() for f in frames]
    sid = frames[1]["sid"].to_numpy()
    r = next(r for r in range(len(sid) // 2, len(sid)) if (sid[r - 9 : r + 1] == sid[r]).all())  # inside windows
    frames[1].loc[r, column] = np.nan
    write_parquet(frames, str(tmp_path), row_group_size=7)
    settings = {**KW, "pieces_per_partition": 40, "stride": 2 if role == "feature" else 1}  # a target: one row
    fast = _raise_message(dw.WindowDataset(str(tmp_path), **settings))
    monkeypatch.setattr(reading, "read_unit", per_piece_read_unit)
    slow = _raise_message(dw.WindowDataset(str(tmp_path), **settings))
    assert fast == slow
    assert f"NaN in {role} column '{column}' of " in fast and "part-0001.parquet" in fast
    assert f"at row {r} of that partition" in fast
    start = int(fast.split("window starting at row ")[1].split(";")[0])
    assert start <= r < start + 8 + (1 if role == "target" else 0)
    drop = dw.WindowDataset(str(tmp_path), **settings, nan="drop")
    assert len(collect(drop)) == len(drop)


def test_resume_at_several_points_is_the_tail_of_the_whole_epoch(root):
    settings = {**KW, "pieces_per_partition": 30, "batch_size": 7, "stride": 2}
    ds = dw.WindowDataset(root, **settings)
    ds.set_epoch(3)
    full = collect(ds)
    for k in sorted({0, 1, 2, len(full) // 3, len(full) // 2, len(full) - 1, len(full)}):
        resumed = dw.WindowDataset(root, **settings)
        resumed.load_state_dict(ds.state_dict(batches=k, num_workers=0))
        rest = collect(resumed)
        assert len(rest) == len(full) - k
        assert all(np.array_equal(a, b) for p, q in zip(rest, full[k:]) for a, b in zip(p, q))


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


def _whole_reads(monkeypatch):
    """Read every unit whole (``read_ranges``), as before pieces were read a row group at a time."""
    from dask_windows.sources.parquet.rows import ParquetRows

    monkeypatch.setattr(ParquetRows, "read_ranges_chunks", lambda self, index, columns, ranges: None)


@pytest.mark.parametrize(
    "kw",
    [
        dict(pieces_per_partition=16),  # the piece order at its former default
        dict(layout="NLC", stride=3, pieces_per_partition=5),
        dict(series=None, pieces_per_partition=60, partition_bytes=1),  # partitions cut at row groups, halos
        dict(nan="drop", normalize={"mean": [1.0, -2.0], "std": [3.0, 0.5]}, pieces_per_partition=16),
    ],
)
@pytest.mark.parametrize("chunk_bytes", [1, 600])  # each row group alone; several read together
def test_reading_a_row_group_at_a_time_yields_what_whole_reads_yield(tmp_path, monkeypatch, kw, chunk_bytes):
    """Row group by row group, decoded into the buffer as they come: the same bits as one read per unit,
    also where a column converts by what a row group holds (integers with nulls in one row group only)."""
    from dask_windows.sources.parquet import rows as parquet_rows

    monkeypatch.setattr(parquet_rows, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(5)
    frames = []
    for i in range(3):
        n = 90 + 17 * i
        f1 = pd.array(rng.integers(-(2**62), 2**62, n), dtype="Int64")  # beyond float64's exact integers
        if i == 1:
            f1[40] = pd.NA  # in one row group of one file: the whole read makes it all float64
            f1[5] = 2**60 + 2**36 + 1  # to float32 through float64: a tie, rounded to even; directly: up
        y = rng.standard_normal(n)
        y[n // 2] = 3.0e39 if kw.get("nan") == "drop" else y[n // 2]  # beyond float32: a bad row
        frames.append(
            pd.DataFrame(
                {"sid": np.repeat(np.arange(3), [n // 3, n // 3, n - 2 * (n // 3)]) + 10 * i,
                 "f0": rng.standard_normal(n).astype(np.float32), "f1": f1, "y": y}
            )
        )  # fmt: skip
    write_parquet(frames, str(tmp_path), row_group_size=16)
    settings = {**KW, "nan": "drop", **kw}
    chunked = collect(dw.WindowDataset(str(tmp_path), **settings))
    _whole_reads(monkeypatch)
    whole = collect(dw.WindowDataset(str(tmp_path), **settings))
    assert len(chunked) == len(whole) > 0
    assert all(np.array_equal(a, b) for p, q in zip(chunked, whole) for a, b in zip(p, q))  # bit for bit


@pytest.mark.parametrize("chunk_bytes", [1, 200, 1 << 24])
def test_row_group_reads_are_the_rows_read_ranges_returns(root, monkeypatch, chunk_bytes):
    from dask_windows.sources.parquet import rows as parquet_rows

    monkeypatch.setattr(parquet_rows, "CHUNK_BYTES", chunk_bytes)
    ds = dw.WindowDataset(root, **KW)
    source = ds.source
    cols = list(ds.spec.columns)
    for index in range(len(source.partitions)):
        rows = source.readable_rows(index)
        for ranges in ([(0, rows)], [(1, 5), (9, 30), (31, rows)], [(rows - 3, rows)]):
            whole = source.read_ranges(index, cols, ranges)
            got: list[list[np.ndarray]] = [[] for _ in ranges]
            at = [0] * len(ranges)
            for i, row, columns in source.read_ranges_chunks(index, cols, ranges):
                assert row == at[i]  # each range's rows in order, none twice
                at[i] += len(columns["f0"])
                got[i].append(columns)
            for piece, chunks in zip(whole, got):
                for col in cols:
                    assert np.array_equal(np.concatenate([c[col] for c in chunks]), piece[col])
        assert source.read_ranges_chunks(index, cols, [(0, rows + 1)]) is None  # clipped: read whole


@pytest.mark.parametrize(
    "kw",
    [
        dict(pieces_per_partition=16),
        dict(stride=3, pieces_per_partition=5, layout="NLC"),
        dict(series=None, buffer_partitions=3, pieces_per_partition=11),
    ],
)
def test_starts_listed_before_the_reads_are_those_buffer_lists(root, kw):
    """The builder lists a buffer's starts while its pieces are read (``BufferArena.planned_starts``);
    ``Buffer`` takes them only where the parts landed where planned."""
    ds = dw.WindowDataset(root, **{**KW, **kw})
    plan = ds._plan(World())
    units = piece_units(plan)
    reader = ds.source.reader([u[0].partition for u in units], list(ds.spec.columns))
    arena = reading.BufferArena(ds._read_values(), plan, units)
    parts = iter([p for unit in units for p in reading.read_unit(ds._read_values(), unit, reader, arena)])
    for b, group in enumerate(plan.buffers):
        planned = reading.BufferArena(ds._read_values(), plan, units).planned_starts(b)  # from the plan alone
        mine = [next(parts) for _ in group]
        listed = Buffer(mine, group, ds.grid, ds.row_offsets, ds.spec)
        used = Buffer(mine, group, ds.grid, ds.row_offsets, ds.spec, planned=planned)
        assert used.starts is planned.starts
        assert used.starts.dtype == listed.starts.dtype and np.array_equal(used.starts, listed.starts)
        if len(group) > 1 and mine[0] is not mine[-1]:  # parts out of their planned places: listed again
            k = next(i for i, p in enumerate(mine) if p is not mine[0])
            swapped = Buffer(
                mine[k:] + mine[:k], group[k:] + group[:k], ds.grid, ds.row_offsets, ds.spec, None, planned
            )
            assert swapped.starts is not planned.starts
            assert np.array_equal(
                np.sort(swapped.global_rows(swapped.starts)), np.sort(listed.global_rows(listed.starts))
            )


def test_the_first_buffer_is_mapped_in_small_pages_and_the_others_by_numpy(root, monkeypatch):
    import mmap

    def mapped(a) -> bool:
        while isinstance(a, np.ndarray):
            a = a.base
        return isinstance(a.obj if isinstance(a, memoryview) else a, mmap.mmap)

    monkeypatch.setattr(
        reading,
        "small_pages",
        lambda shape, dtype: np.frombuffer(
            mmap.mmap(-1, max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)), dtype
        )[: int(np.prod(shape))].reshape(shape),
    )  # fmt: skip  (as small_pages, whatever the size)
    ds = dw.WindowDataset(root, **{**KW, "buffer_partitions": 1, "pieces_per_partition": 32})
    plan = ds._plan(World())
    units = piece_units(plan)
    assert len(plan.buffers) > 1
    arena = reading.BufferArena(ds._read_values(), plan, units)
    first, later = arena.place(arena.members[0][0]), arena.place(arena.members[1][0])
    assert mapped(first[0]) and mapped(first[1])
    assert not mapped(later[0]) and not mapped(later[1])
    assert mapped(arena.planned_starts(0).starts) and not mapped(arena.planned_starts(1).starts)
    monkeypatch.undo()
    x = reading.small_pages((3, 1 << 20), np.float32)  # 12 MiB: mapped
    assert mapped(x) and not mapped(reading.small_pages((3, 100), np.float32))
    assert x.shape == (3, 1 << 20) and x.dtype == np.float32 and x.flags.writeable and x.flags.c_contiguous
    assert reading.small_pages(7, np.int32).shape == (7,)
