"""The footer-statistics check: numpy's minimum and maximum against Arrow's, and each damaged value found.

``stats_check._min_max`` reduces a column's chunks with numpy where Arrow's ``min_max`` cost a
third of a unit's decode; it must give Arrow's answer for any chunking, slice, NaN and null. Then
``outside_statistics`` on a real file's footer, with one value of a drawn row group moved outside
its footer's range, against the brute-force answer.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.sources.parquet.stats_check import _min_max, outside_statistics

_TYPES = {"int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64()}


@st.composite
def _chunked(draw) -> pa.ChunkedArray:
    """A chunked column of a drawn type: chunks (some empty), then maybe a slice; NaN and nulls drawn."""
    name = draw(st.sampled_from(sorted(_TYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    chunks = []
    for n in draw(st.lists(st.integers(0, 12), min_size=1, max_size=4)):
        values = (rng.standard_normal(n) * 1e3).astype(name) if name[0] == "f" else rng.integers(-9, 9, n, name)
        if name[0] == "f" and n and draw(st.booleans()):
            values[draw(st.integers(0, n - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        mask = (rng.random(n) < 0.2) if draw(st.booleans()) else None
        chunks.append(pa.array(values, _TYPES[name], mask=mask))
    column = pa.chunked_array(chunks, _TYPES[name])
    if len(column) and draw(st.booleans()):
        at = draw(st.integers(0, len(column) - 1))
        column = column.slice(at, draw(st.integers(0, len(column) - at)))
    return column


@settings(max_examples=100)
@given(_chunked())
def test_min_max_is_arrows_min_max(column):
    want = pc.min_max(column).as_py()
    got = _min_max(column)
    assert np.array_equal(np.array(got, float), np.array([want["min"], want["max"]], float), equal_nan=True)
    assert [type(v) for v in got] == [type(want["min"]), type(want["max"])]  # Python values, as in the message


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A file of one column per checked type, 4 row groups of 50 rows; its metadata and table."""
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "i32": pa.array(rng.integers(-100, 100, 200), pa.int32()),
            "i64": pa.array(rng.integers(-(10**12), 10**12, 200), pa.int64()),
            "f32": pa.array(rng.standard_normal(200).astype(np.float32)),
            "f64": pa.array(rng.standard_normal(200)),
        }
    )
    path = tmp_path_factory.mktemp("stats") / "d.parquet"
    pq.write_table(table, path, row_group_size=50)
    return pq.ParquetFile(path).metadata, table


@settings(max_examples=60)
@given(
    st.sampled_from(["i32", "i64", "f32", "f64"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
    st.integers(0, 49),
    st.sampled_from(["below", "above", "inside", "nan"]),
)
def test_a_value_outside_its_row_groups_footer_range_is_found(written, name, groups, row, where):
    meta, table = written
    groups = sorted(groups)
    read = pa.concat_tables([table.slice(50 * g, 50) for g in groups])  # the row groups, as read together
    column = read.column(name).to_numpy().copy()
    index = list(read.column_names).index(name)
    damaged = groups[len(groups) // 2]  # one of them
    stats = meta.row_group(damaged).column(index).statistics
    at = 50 * groups.index(damaged) + row
    if where == "nan":
        if name[0] == "i":
            return
        column[at] = np.nan  # Arrow's min_max leaves NaN out: not outside any range
    else:
        column[at] = {"below": stats.min - 1, "above": stats.max + 1, "inside": stats.min}[where]
    read = read.set_column(index, name, pa.array(column, read.schema.field(name).type))
    problem = outside_statistics(meta, groups, read)
    if where in ("inside", "nan"):
        assert problem is None
    else:
        bad = column[at].item()
        assert problem is not None and f"column {name!r} of row group {damaged} holds {bad!r}" in problem


def test_clean_numeric_columns_take_no_arrow_reduction(written, monkeypatch):
    """The check of a clean column is numpy's (Arrow's ``min_max`` cost 17-35 times as much per column)."""
    meta, table = written

    def refuse(*args, **kwargs):
        raise AssertionError("Arrow's min_max called on a clean numeric column")

    monkeypatch.setattr(pc, "min_max", refuse)
    assert outside_statistics(meta, [0, 1, 2, 3], table) is None
