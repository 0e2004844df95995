"""Halos from row-group heads: a row range whose halo reaches into the next row group reads that row
group's first rows, not the whole row group (``sources/parquet/heads.py``).

The buffer order reads a partition cut from a file at row groups (``partition_bytes``) with its
halo; these tests check ``read_ranges_chunks`` against ``read_ranges`` bit for bit and count the
row groups decoded. (The piece order's tests - pieces along row groups, paired reads - went with
it: the pool order serves ``pieces_per_partition > 1``, tests/test_pieces_retired.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_frames, write_parquet

import dask_windows as dw

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, batch_size=16, return_index=True)
ROW_GROUP = 23


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=3, num_series=6, min_len=20, max_len=150)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("unit_pieces")
    write_parquet(frames, str(path), row_group_size=ROW_GROUP)
    return str(path)


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
