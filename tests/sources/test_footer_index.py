"""The dataset index (``sources.footer_index``): one read at open instead of one per file, checked against the files."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import collect, make_frames, oracle_starts, parquet_bytes, same_batches, write_parquet

from dask_windows.dataset import WindowDataset
from dask_windows.errors import DataError
from dask_windows.sources.base import Source
from dask_windows.sources.parquet.footer_compact import compact_footer, key_values_field, with_key_values
from dask_windows.sources.parquet.footer_index import INDEX_NAME, IndexedFooter
from dask_windows.sources.parquet.footers import metadata_from_bytes
from dask_windows.sources.parquet.index_writer import write_index
from dask_windows.sources.parquet.opening import ParquetOpening

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True)


def _footer(data: bytes) -> bytes:
    return data[-(int.from_bytes(data[-8:-4], "little") + 8) :]


@pytest.mark.parametrize("columns,row_groups", [(1, 1), (6, 1), (6, 5)])
def test_compact_footer_reads_the_same_rows(columns, row_groups):
    rng = np.random.default_rng(columns * 10 + row_groups)
    rows = 500
    table = pa.table(
        {
            "sid": np.repeat(np.arange(5), rows // 5),
            "name": pa.array([f"s{i % 7}" for i in range(rows)]).dictionary_encode(),
            "ts": pd.date_range("2024-01-01", periods=rows, freq="min", tz="UTC"),
            **{f"f{c}": rng.standard_normal(rows).astype(np.float32) for c in range(columns)},
            "n": pa.array([None if i % 11 == 0 else i for i in range(rows)], pa.int32()),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=rows // row_groups, write_page_index=True)
    data = out.getvalue()
    raw = _footer(data)
    compact = compact_footer(raw)
    assert len(compact) < len(raw)
    whole = pq.read_metadata(io.BytesIO(data))
    for footer in (
        compact,
        with_key_values(compact, key_values_field([(b"ARROW:schema", whole.metadata[b"ARROW:schema"])])),
    ):
        meta = metadata_from_bytes(footer)
        assert (meta.num_rows, meta.num_row_groups, meta.num_columns) == (
            whole.num_rows,
            whole.num_row_groups,
            whole.num_columns,
        )
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                a, b = meta.row_group(g).column(c), whole.row_group(g).column(c)
                assert (a.data_page_offset, a.total_compressed_size, a.dictionary_page_offset) == (
                    b.data_page_offset,
                    b.total_compressed_size,
                    b.dictionary_page_offset,
                )
                assert a.statistics is None or (
                    a.statistics.null_count == b.statistics.null_count and not a.statistics.has_min_max
                )
        got = pq.ParquetFile(io.BytesIO(data), metadata=meta).read()
        if b"ARROW:schema" in (meta.metadata or {}):  # the Arrow types back: the very table
            assert got.equals(table)
        else:  # Parquet's own types: the same values
            assert got.column("f0" if columns else "sid").equals(table.column("f0" if columns else "sid"))
    with pytest.raises(ValueError, match="not a Parquet footer"):
        compact_footer(b"not a footer at all")


def test_compact_footer_of_one_row_group_is_under_a_kib():
    rng = np.random.default_rng(0)
    table = pa.table({"sid": np.zeros(1000, np.int64), **{f"f{c}": rng.standard_normal(1000) for c in range(6)}})
    out = io.BytesIO()
    pq.write_table(table, out)
    raw = _footer(out.getvalue())
    assert len(compact_footer(raw)) <= 1024 < len(raw)


@pytest.fixture
def local(tmp_path):
    frames = make_frames(seed=3, num_files=5)
    root = tmp_path / "data"
    root.mkdir()
    write_parquet(frames, str(root), row_group_size=17)
    return root, frames


def test_same_windows_and_batches_with_the_index_and_no_footer_read(local, monkeypatch):
    root, frames = local
    plain = WindowDataset(str(root), **KW)
    report = write_index(str(root), series="sid")
    assert report["files"] == 5 and os.path.exists(root / INDEX_NAME)

    def no_footers(*args, **kwargs):
        raise AssertionError("a footer was read although the index holds them all")

    monkeypatch.setattr(ParquetOpening, "_open_files", no_footers)
    monkeypatch.setattr(Source, "read_runs", lambda *a: pytest.fail("series scanned despite the index"))
    indexed = WindowDataset(str(root), **KW)
    assert all(isinstance(f, IndexedFooter) for f in indexed.source._footers.values())
    assert indexed.num_windows == plain.num_windows
    assert np.array_equal(indexed.grid.windows_per_partition, plain.grid.windows_per_partition)
    assert indexed._fingerprint() == plain._fingerprint()  # a state saved without the index resumes with it
    monkeypatch.undo()
    for loader in ({"num_workers": 2}, {}):
        plain.set_epoch(1)
        indexed.set_epoch(1)
        want = collect(plain, loader)
        assert same_batches(collect(indexed, loader), want)
    starts = np.sort(np.concatenate([b[-1] for b in want]))
    assert np.array_equal(starts, oracle_starts(frames, "sid", 8, 2))
    unindexed = WindowDataset(str(root), index=False, **KW)
    assert not any(isinstance(f, IndexedFooter) for f in unindexed.source._footers.values())
    unindexed.set_epoch(1)
    assert same_batches(collect(unindexed), want)


def test_another_series_column_is_scanned_and_partition_bytes_applied(local):
    root, frames = local
    write_index(str(root), series="sid")
    plain = WindowDataset(str(root), partition_bytes=200, **{**KW, "series": None})
    indexed = WindowDataset(str(root), partition_bytes=200, **{**KW, "series": None})
    assert [p.name for p in indexed.partitions] == [p.name for p in plain.partitions]
    assert len(plain.partitions) > 5  # files cut at row groups: the index's row-group bytes cut them alike
    assert same_batches(collect(indexed), collect(plain))


@pytest.mark.parametrize("change", ["rewritten", "touched", "deleted", "added"])
def test_a_stale_index_raises_naming_the_file(local, change):
    root, frames = local
    write_index(str(root), series="sid")
    victim = root / "part-0002.parquet"
    if change == "rewritten":
        victim.write_bytes(parquet_bytes(frames[2].iloc[:-1], row_group_size=17))
    elif change == "touched":
        os.utime(victim, ns=(1, 1))
    elif change == "deleted":
        victim.unlink()
    else:
        victim = root / "part-0009.parquet"
        victim.write_bytes(parquet_bytes(frames[0], row_group_size=17))
    # Added and deleted files are seen in the listing at open; a local file's size and mtime are
    # compared when it is read (index_open: no stat per file at open), before any of its rows is used.
    with pytest.raises(DataError, match=rf"{INDEX_NAME} is stale: .*{victim.name}.*dask-windows index"):
        collect(WindowDataset(str(root), **KW))
    WindowDataset(str(root), index=False, **KW)  # the remedy the message names


def test_the_index_never_replaces_a_user_file_and_may_live_elsewhere(local, tmp_path):
    root, frames = local
    user = tmp_path / "notes.dwi"
    user.write_text("my notes")
    with pytest.raises(FileExistsError, match="notes.dwi exists and is not a dask_windows index"):
        write_index(str(root), str(user), series="sid")
    assert user.read_text() == "my notes"
    elsewhere = tmp_path / "idx.dwi"
    write_index(str(root), str(elsewhere), series="sid")
    write_index(str(root), str(elsewhere), series="sid")  # its own index: replaced
    assert not (root / INDEX_NAME).exists()
    ds = WindowDataset(str(root), index=str(elsewhere), **KW)
    assert all(isinstance(f, IndexedFooter) for f in ds.source._footers.values())
    glob = WindowDataset(str(root / "part-000[0-2].parquet"), index=str(elsewhere), **KW)
    assert len(glob.source.files) == 3
    with pytest.raises(ValueError, match="not a folder or prefix"):
        write_index(str(root / "*.parquet"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WindowDataset(str(root), index=str(tmp_path / "missing.dwi"), **KW)


def test_cli_index_writes_and_reports(local, capsys):
    from dask_windows.cli import main

    root, _ = local
    assert main(["index", str(root), "--series", "sid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 5 and out["index"].endswith(INDEX_NAME) and out["series"] == "sid"
    assert main(["index", str(root / "*.parquet")]) == 1
    assert "--out" in capsys.readouterr().err


def test_a_dataset_moved_or_copied_with_its_index_opens_from_it(local, tmp_path, monkeypatch):
    import shutil

    root, frames = local
    write_index(str(root), series="sid")
    want = collect(WindowDataset(str(root), index=False, **KW))
    elsewhere = tmp_path / "copies" / "moved"
    shutil.copytree(root, elsewhere)
    shutil.rmtree(root)  # nothing left where the index was written
    monkeypatch.setattr(ParquetOpening, "_open_files", lambda *a, **k: pytest.fail("footers read despite the index"))
    moved = WindowDataset(str(elsewhere), **KW)
    assert all(isinstance(f, IndexedFooter) for f in moved.source._footers.values())
    assert same_batches(collect(moved), want)
    monkeypatch.undo()
    # an index kept apart from the data: its paths are relative to its own folder, so both move together
    write_index(str(elsewhere), str(tmp_path / "copies" / "idx.dwi"), series="sid")
    shutil.move(tmp_path / "copies", tmp_path / "again")
    apart = WindowDataset(str(tmp_path / "again" / "moved"), index=str(tmp_path / "again" / "idx.dwi"), **KW)
    assert same_batches(collect(apart), want)


def test_an_index_of_format_1_is_read_around_beside_the_data_and_refused_when_named(local, caplog):
    from dask_windows.sources.parquet import footer_index

    root, frames = local
    write_index(str(root), series="sid")
    table = pq.read_table(root / INDEX_NAME)
    header = json.loads(table.schema.metadata[b"dask_windows.index"])
    header.update(version=1, root=str(root))  # format 1: an absolute root, no checksum
    for key in ("relative", "files"):
        del header[key]
    old = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({b"dask_windows.index": json.dumps(header).encode()}), old)
    (root / INDEX_NAME).write_bytes(old.getvalue())
    assert footer_index.is_index(old.getvalue())
    want = collect(WindowDataset(str(root), index=False, **KW))
    with caplog.at_level("WARNING", "dask_windows.sources.parquet"):
        beside = WindowDataset(str(root), **KW)
    assert "earlier format" in caplog.text and "dask-windows index" in caplog.text
    assert not any(isinstance(f, IndexedFooter) for f in beside.source._footers.values())
    assert same_batches(collect(beside), want)
    with pytest.raises(DataError, match="earlier format.*write it again with `dask-windows index`"):
        WindowDataset(str(root), index=str(root / INDEX_NAME), **KW)
    write_index(str(root), series="sid")  # written over: it is an index of this library
    assert all(isinstance(f, IndexedFooter) for f in WindowDataset(str(root), **KW).source._footers.values())


def test_objects_added_are_indexed_by_reading_only_their_footers(local, monkeypatch):
    root, frames = local
    write_index(str(root), series="sid")
    (root / "part-0007.parquet").write_bytes(
        parquet_bytes(frames[0].assign(sid=frames[0]["sid"] + 1000), row_group_size=17)
    )
    (root / "part-0001.parquet").write_bytes(parquet_bytes(frames[1].iloc[:-3], row_group_size=17))  # rewritten
    opened = []
    open_files = ParquetOpening._open_files

    def counted(self, files, *args, **kwargs):
        opened.extend(files)
        return open_files(self, files, *args, **kwargs)

    monkeypatch.setattr(ParquetOpening, "_open_files", counted)
    report = write_index(str(root), series="sid")
    assert sorted(os.path.basename(f) for f in opened) == ["part-0001.parquet", "part-0007.parquet"]
    assert report["files"] == 6 and report["footers_read"] == 2
    monkeypatch.undo()
    want = WindowDataset(str(root), index=False, **KW)
    got = WindowDataset(str(root), **KW)
    assert all(isinstance(f, IndexedFooter) for f in got.source._footers.values())
    assert got._fingerprint() == want._fingerprint()
    assert same_batches(collect(got), collect(want))
    full = write_index(str(root), series="sid")  # nothing changed: no footer read at all
    assert full["footers_read"] == 0
