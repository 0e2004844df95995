"""Every partition's decode units and pool units at once equal the per-partition computation (the oracle)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dask_windows.planning.pool import merge_bounds
from dask_windows.sources import ParquetSource
from dask_windows.sources.parquet.index_writer import write_index

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # budgets too small to mix: on purpose


def old_unit_bounds(source, target: int, size: int) -> list[np.ndarray]:
    """``planning.budget.unit_bounds`` before it was vectorised: a decode and a merge per partition."""
    out = []
    for p, part in enumerate(source.partitions):
        decoded = source.decode_units(p)
        if decoded is None:
            decoded = np.array([*range(0, part.num_rows, size), part.num_rows], np.int64)
        out.append(merge_bounds(np.asarray(decoded, np.int64), target))
    return out


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(3)
    for i in range(7):  # files of 1-6 row groups of uneven rows, out of the listing's name order
        rows = int(rng.integers(5, 90))
        table = pa.table({"sid": np.repeat([i], rows), "f0": rng.standard_normal(rows).astype(np.float32)})
        pq.write_table(table, tmp_path / f"part-{(i * 5) % 7}.parquet", row_group_size=int(rng.integers(4, 40)))
    return tmp_path


@pytest.mark.parametrize("index", [False, True])
@pytest.mark.parametrize("partition_bytes", [1, 300, 10**9])  # a row group, a few, a whole file per partition
def test_decode_units_all_equals_decode_units_per_partition(folder, index: bool, partition_bytes: int) -> None:
    if index:
        write_index(str(folder), series="sid")
    source = ParquetSource(str(folder), series="sid", partition_bytes=partition_bytes, index=None if index else False)
    every = source.decode_units_all()
    assert len(every) == len(source.partitions) > 0
    for p, units in enumerate(every):
        assert np.array_equal(units, source.decode_units(p))


@pytest.mark.parametrize("buffer_bytes", [None, 2_000])
def test_unit_bounds_equal_the_per_partition_merge(folder, buffer_bytes) -> None:
    import dask_windows as dw
    from dask_windows.planning.budget import pool_rows
    from dask_windows.settings.tuning import MIN_UNIT_ROWS, UNITS_PER_BATCH

    ds = dw.WindowDataset(str(folder), features=["f0"], series="sid", window=4, batch_size=2, buffer_bytes=buffer_bytes)
    reads = ds._read_values()
    span = reads.spec.span
    target = max(span, pool_rows(reads.spec, reads.row_bytes) // (UNITS_PER_BATCH * reads.spec.batch_size))
    expected = old_unit_bounds(ds.source, target, max(4 * span, target, MIN_UNIT_ROWS))
    assert len(ds._unit_bounds) == len(expected)
    for got, want in zip(ds._unit_bounds, expected):
        assert np.array_equal(got, want)
    frame = pd.DataFrame({"sid": np.repeat([0, 1], 50), "f0": np.arange(100, dtype=np.float32)})
    arrays = dw.WindowDataset(frame, features=["f0"], series="sid", window=4, batch_size=2, buffer_bytes=buffer_bytes)
    reads = arrays._read_values()
    target = max(reads.spec.span, pool_rows(reads.spec, reads.row_bytes) // (UNITS_PER_BATCH * reads.spec.batch_size))
    expected = old_unit_bounds(arrays.source, target, max(4 * reads.spec.span, target, MIN_UNIT_ROWS))
    assert [u.tolist() for u in arrays._unit_bounds] == [u.tolist() for u in expected]
