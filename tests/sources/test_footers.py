"""Opening Parquet files: compact footers, and series runs taken from the tail read."""

from __future__ import annotations

import gc
import sys
import types

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dask_windows.sources import ParquetSource
from dask_windows.sources.base import Source
from dask_windows.sources.parquet.footers import FOOTER_BYTES, Footer

_NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def retained_bytes(obj: object, skip: tuple = ()) -> tuple[int, list]:
    """Bytes of every Python object reachable from ``obj`` (each once), and the pyarrow objects among them.

    ``sys.getsizeof`` does not see memory held inside C extension objects, which is why the pyarrow
    objects found are returned too: a parsed footer kept per file would show up there.
    """
    seen: set[int] = set()
    arrow: list = []
    total = 0
    todo = [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (*_NOT_DATA, *skip)):
            continue
        seen.add(id(item))
        if type(item).__module__.startswith("pyarrow"):
            arrow.append(item)
        total += sys.getsizeof(item)
        todo.extend(gc.get_referents(item))
    return total, arrow


def _write_small_files(root, count: int, rows: int = 50) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        table = pa.table(
            {"sid": np.full(rows, i, np.int64), **{c: rng.standard_normal(rows).astype(np.float32) for c in "abcd"}}
        )
        pq.write_table(table, root / f"part-{i:05d}.parquet")


def test_many_small_files_keep_small_footers(tmp_path):
    count = 2000
    _write_small_files(tmp_path, count)
    source = ParquetSource(str(tmp_path), series="sid", threads=2)
    assert len(source.partitions) == count
    fs_type = type(source.fs)
    total, arrow = retained_bytes({k: v for k, v in vars(source).items() if k != "fs"}, skip=(fs_type,))
    per_file = total / count
    assert per_file < 2048, f"{per_file:.0f} bytes kept per file"
    # Only the distinct schemas are pyarrow objects: no parsed footer per file.
    assert len(arrow) <= 4, [type(a).__name__ for a in arrow[:10]]
    assert all(isinstance(f, Footer) for f in source._footers.values())
    raw = [len(f.raw) for f in source._footers.values()]
    assert max(raw) < 1536
    # The compact footer parses back to the file's own metadata.
    path = source.files[7]
    assert source._footers[path].metadata.equals(pq.read_metadata(path))


def _base_runs(source: ParquetSource, index: int, series: str):
    return Source.read_runs(source, index, series)


def _assert_same_runs(got, want):
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


@pytest.mark.parametrize(
    "case",
    ["one_series_per_file", "series_per_row_group", "many_series", "string_series", "large_file_mixed", "nullable"],
)
def test_runs_from_the_tail_equal_a_scan_of_the_column(tmp_path, case):
    rng = np.random.default_rng(1)
    frames = []
    for f in range(3):
        rows = 20_000 if case == "large_file_mixed" else 300
        if case == "one_series_per_file":
            sid = np.full(rows, f * 10)
        elif case == "series_per_row_group":
            sid = np.repeat([f * 3, f * 3 + 1, f * 3 + 1], rows // 3)  # 100 rows each: one per row group
        else:
            sid = np.sort(rng.integers(0, 7, rows)) + 7 * f
        frame = pd.DataFrame({"x": rng.standard_normal(len(sid)).astype(np.float32)})
        if case == "string_series":
            frame["sid"] = [f"s{v}" for v in sid]
        elif case == "nullable":
            frame["sid"] = pd.array(sid, dtype="Int32")
        else:
            frame["sid"] = sid.astype(np.int32 if f == 1 else np.int64)
        frames.append(frame)
        pq.write_table(
            pa.Table.from_pandas(frame, preserve_index=False), tmp_path / f"p{f}.parquet", row_group_size=100
        )
    told = ParquetSource(str(tmp_path), series="sid")
    plain = ParquetSource(str(tmp_path))
    if case == "large_file_mixed":
        assert (tmp_path / "p0.parquet").stat().st_size > FOOTER_BYTES
        assert not told._tail_runs  # neither the statistics nor the tail tell: scanned as before
    else:
        assert len(told._tail_runs) == 3
    for i in range(len(told.partitions)):
        _assert_same_runs(told.read_runs(i, "sid"), _base_runs(plain, i, "sid"))
        _assert_same_runs(told.read_runs(i, "sid"), _base_runs(plain, i, "sid"))  # asked again: read again
    assert not told._tail_runs


def test_statistics_tell_the_runs_of_large_single_series_files(tmp_path):
    rows = 40_000
    for f in range(2):
        table = pa.table({"sid": np.full(rows, f, np.int64), "x": np.arange(rows, dtype=np.float64)})
        pq.write_table(table, tmp_path / f"p{f}.parquet", row_group_size=10_000)
    assert (tmp_path / "p0.parquet").stat().st_size > FOOTER_BYTES
    told = ParquetSource(str(tmp_path), series="sid")
    assert len(told._tail_runs) == 2
    plain = ParquetSource(str(tmp_path))
    for i in range(2):
        _assert_same_runs(told.read_runs(i, "sid"), _base_runs(plain, i, "sid"))


def test_a_different_series_column_is_scanned(tmp_path):
    _write_small_files(tmp_path, 3)
    told = ParquetSource(str(tmp_path), series="sid")
    plain = ParquetSource(str(tmp_path))
    _assert_same_runs(told.read_runs(0, "a"), _base_runs(plain, 0, "a"))
    assert len(told._tail_runs) == 3  # kept for the column it was told


def test_paused_gc_restores_the_collector_also_on_errors():
    import gc

    from dask_windows.sources.parquet.footers import paused_gc

    before = gc.get_threshold()
    with paused_gc():
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] >= 10**9
        assert gc.isenabled()  # young collections still run
    assert gc.get_threshold() == before
    with pytest.raises(KeyError), paused_gc():
        raise KeyError("inside")
    assert gc.get_threshold() == before


def test_local_listing_equals_fsspec_find(tmp_path):
    """The scandir listing of a local folder: the files fsspec's find gives, with their sizes,
    nested folders, hidden files and a symbolic link included; its stat is each file's identity."""
    import os

    import fsspec

    from dask_windows.sources import identity
    from dask_windows.sources.parquet.footers import _local_find

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "_hidden").mkdir()
    for name, size in [("x.parquet", 3), ("a/y.parquet", 5), ("a/b/z.PARQUET", 7), ("_hidden/h", 1), (".crc", 2)]:
        (tmp_path / name).write_bytes(b"1" * size)
    os.symlink(tmp_path / "x.parquet", tmp_path / "a" / "link.parquet")
    fs = fsspec.filesystem("file")
    root = fs._strip_protocol(str(tmp_path))
    want = fs.find(root, detail=True)
    got = _local_find(fs, root)
    assert sorted(got) == sorted(want)
    assert {p: i["size"] for p, i in got.items()} == {p: i["size"] for p, i in want.items()}
    for path, info in got.items():
        assert identity.FileIdentity(info["size"], info["mtime_ns"]) == identity.local(path)
    assert _local_find(fs, root + "/x.parquet") is None  # a file: fsspec's own find
