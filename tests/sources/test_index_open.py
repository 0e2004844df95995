"""Opening from the dataset index, columnar (``sources.parquet.index_open``): against the footers it replaces."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from helpers import collect, same_batches

from dask_windows.dataset import WindowDataset
from dask_windows.planning.index import FileRuns
from dask_windows.sources import ParquetSource
from dask_windows.sources.base import Source
from dask_windows.sources.parquet.footer_index import IndexedFooter
from dask_windows.sources.parquet.index_writer import write_index

KW = dict(features=["f0"], window=6, stride=1, batch_size=8, return_index=True)


def _write(root, keys: list, seed: int = 0) -> None:
    """One file per entry of ``keys``: each a few series (runs of the given key values)."""
    rng = np.random.default_rng(seed)
    root.mkdir()
    for i, file_keys in enumerate(keys):
        sid = np.repeat(np.asarray(file_keys, dtype=object if isinstance(file_keys[0], str) else None), 9 + i)
        pd.DataFrame({"sid": sid, "f0": rng.standard_normal(len(sid)).astype(np.float32)}).to_parquet(
            root / f"part-{i:03d}.parquet", row_group_size=7
        )


@pytest.mark.parametrize(
    "keys",
    [
        [["a", "b"], ["c"], ["d", "e", "f"]],  # strings
        [[0.5, 1.5], [2.5], [3.5, 4.5, 5.5]],  # floats
        [[3, 1], [2], [7, 5, 6]],  # integers, not sorted
    ],
    ids=["str", "float", "int"],
)
def test_series_keys_of_any_type_come_from_the_index_and_give_the_same_epoch(tmp_path, keys, monkeypatch):
    root = tmp_path / "data"
    _write(root, keys)
    plain = WindowDataset(str(root), series="sid", index=False, **KW)
    write_index(str(root), series="sid")
    monkeypatch.setattr(Source, "read_runs", lambda *a: pytest.fail("series scanned despite the index"))
    indexed = WindowDataset(str(root), series="sid", **KW)
    monkeypatch.undo()
    assert isinstance(indexed.source._footers[indexed.source.files[0]], IndexedFooter)
    assert indexed.source.runs_at_once("sid") is not None  # every file's runs at once, no scan per partition
    assert isinstance(indexed.runs, FileRuns)  # columnar: no array nor PartitionRuns held per file
    assert indexed.grid.first is indexed.runs.starts and indexed.grid.counts.offsets is indexed.runs.starts.offsets
    for runs_a, runs_b in zip(indexed.runs, plain.runs):
        assert np.array_equal(runs_a.starts, runs_b.starts) and np.array_equal(runs_a.lengths, runs_b.lengths)
        assert list(runs_a.keys) == list(runs_b.keys)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        indexed.set_epoch(epoch)
        assert same_batches(collect(indexed), collect(plain))  # the same epoch, bit for bit


def test_indexed_footers_equal_the_files_and_survive_pickling(tmp_path):
    root = tmp_path / "data"
    _write(root, [[1, 2], [3], [4, 5]])
    write_index(str(root), series="sid")
    read = ParquetSource(str(root), series="sid", index=False)
    indexed = ParquetSource(str(root), series="sid")
    assert indexed.files == read.files and len(indexed._footers) == len(read.files)
    for path in read.files:
        a, b = read._footers[path], indexed._footers[path]
        assert (a.size, a.rows) == (b.size, b.rows)
        assert b.metadata.num_rows == a.metadata.num_rows and b.metadata.num_row_groups == a.metadata.num_row_groups
        assert indexed._identities[path] == read._identities[path]
    assert "missing.parquet" not in indexed._footers
    copy = pickle.loads(pickle.dumps(indexed))  # what DataLoader workers receive
    assert [copy._footers[p].rows for p in copy.files] == [read._footers[p].rows for p in read.files]
    assert copy.identity_digest() == read.identity_digest()  # the resume fingerprint is that of the files


def test_a_list_out_of_order_opens_from_an_index_elsewhere(tmp_path):
    root = tmp_path / "data"
    _write(root, [[1], [2], [3], [4]])
    write_index(str(root), str(tmp_path / "idx.dwi"), series="sid")
    files = [str(root / f"part-{i:03d}.parquet") for i in (3, 0, 2)]
    indexed = WindowDataset(files, series="sid", index=str(tmp_path / "idx.dwi"), **KW)
    plain = WindowDataset(files, series="sid", index=False, **KW)
    assert [p.name for p in indexed.partitions] == [p.name for p in plain.partitions]
    assert same_batches(collect(indexed), collect(plain))


def test_the_index_build_scans_series_columns_on_threads(tmp_path, monkeypatch):
    import threading
    import time

    from dask_windows.sources.parquet import opening

    root, kw = tmp_path / "data", {**KW, "series": "sid"}
    _write(root, [["a", "b"], ["c", "d"], ["e"], ["f", "g"], ["h"], ["i", "j"]])
    plain = collect(WindowDataset(str(root), index=False, **kw))
    monkeypatch.setattr(opening, "tail_runs", lambda *a: None)  # no runs from the tails: every file is scanned
    read_runs, running, most = Source.read_runs, [0], [0]
    lock = threading.Lock()

    def slow(self, index, series):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)  # an object store's latency
        try:
            return read_runs(self, index, series)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(Source, "read_runs", slow)
    write_index(str(root), series="sid", threads=4)
    assert most[0] > 1  # one file at a time before
    monkeypatch.undo()
    monkeypatch.setattr(Source, "read_runs", lambda *a: pytest.fail("series scanned despite the index"))
    assert same_batches(collect(WindowDataset(str(root), **kw)), plain)


def test_partitions_opened_from_the_index_are_columns_equal_to_the_footers_partitions(tmp_path):
    from dask_windows.sources.parquet.partitions import FilePartitions

    root = tmp_path / "data"
    _write(root, [[1, 2], [3], [4, 5, 6], [7]])
    pd.DataFrame({"sid": np.zeros(0, np.int64), "f0": np.zeros(0, np.float32)}).to_parquet(root / "part-009.parquet")
    write_index(str(root), series="sid")
    for partition_bytes in (1 << 20, 60):  # every file whole; most files cut at their row groups
        plain = ParquetSource(str(root), series="sid", index=False, partition_bytes=partition_bytes)
        indexed = ParquetSource(str(root), series="sid", partition_bytes=partition_bytes)
        parts = indexed.partitions
        assert isinstance(parts, FilePartitions)  # no Partition object held per file
        assert list(parts) == list(plain.partitions) and len(parts) == len(plain.partitions)  # the empty file: none
        assert [parts[i] for i in range(-len(parts), 0)] == list(plain.partitions)
        assert parts[1:3] == list(plain.partitions)[1:3] and list(parts.names) == [p.name for p in plain.partitions]
        assert np.array_equal(parts.num_rows, [p.num_rows for p in plain.partitions])
        assert [indexed.continues(i) for i in range(len(parts))] == [plain.continues(i) for i in range(len(parts))]
        assert [indexed._first_partition(i) for i in range(len(parts))] == [
            plain._first_partition(i) for i in range(len(parts))
        ]
        units, expected = indexed.decode_units_all(), plain.decode_units_all()
        assert np.array_equal(units.values, expected.values) and np.array_equal(units.offsets, expected.offsets)
    assert any("row groups" in p.name for p in plain.partitions)  # the cut case was reached
    ds_plain = WindowDataset(str(root), series="sid", index=False, partition_bytes=60, **KW)
    assert same_batches(collect(WindowDataset(str(root), series="sid", partition_bytes=60, **KW)), collect(ds_plain))
