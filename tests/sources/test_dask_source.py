"""Dask DataFrames as a source: locally, then on a real LocalCluster (worker processes).

The same rows as Parquet files and as a Dask DataFrame with one partition
per file must give bit-identical batches: same partitions, same plan.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import warnings

import numpy as np
import pandas as pd
import pytest

dd = pytest.importorskip("dask.dataframe")

from helpers import collect, make_frames, oracle_starts, write_parquet  # noqa: E402

from dask_windows.dataset import WindowDataset  # noqa: E402
from dask_windows.errors import SourceReadError  # noqa: E402
from dask_windows.errors.faults import SkippedPartitionWarning  # noqa: E402
from dask_windows.sources.dask_frame import DaskSource, _active_client, _DaskReader, _known_lengths  # noqa: E402

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=7, stride=2, batch_size=16, return_index=True)
FRAMES = make_frames(seed=8, num_files=5, num_series=10)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b)
    )


def _starts(batches: list) -> np.ndarray:
    return np.sort(np.concatenate([b[-1] for b in batches]))


_calls = {"n": 0}
_lock = threading.Lock()


def _counted_frame(i: int) -> pd.DataFrame:
    with _lock:
        _calls["n"] += 1
    return FRAMES[i]


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask-parquet")
    return write_parquet(FRAMES, str(root))


# -- without a cluster (these run first: the cluster fixture below becomes the default client) --


def test_no_client_yet():
    assert _active_client() is None


def test_known_lengths_come_from_the_graph(parquet_dir):
    full = pd.concat(FRAMES, ignore_index=True)
    assert _known_lengths(dd.from_pandas(full, npartitions=3)) == (
        tuple(len(p) for p in np.array_split(np.arange(len(full)), 3))
    )
    assert _known_lengths(dd.read_parquet(parquet_dir)) == tuple(len(f) for f in FRAMES)
    assert _known_lengths(dd.from_map(_counted_frame, range(len(FRAMES)))) is None


def test_one_counting_pass_then_identical_to_parquet(parquet_dir):
    ddf = dd.from_map(_counted_frame, range(len(FRAMES)))
    _calls["n"] = 0
    ds = WindowDataset(ddf, **KW)
    assert _calls["n"] == len(FRAMES)  # rows and series runs in one pass
    assert [p.num_rows for p in ds.partitions] == [len(f) for f in FRAMES]
    local = WindowDataset(os.path.dirname(parquet_dir[0]), pieces_per_partition=1, **KW)  # Dask reads whole partitions
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        local.set_epoch(epoch)
        batches = collect(ds)
        assert _same(batches, collect(local))
        assert np.array_equal(_starts(batches), oracle_starts(FRAMES, "sid", 7, 2))


def test_failing_partition_at_open_raises_or_is_skipped(tmp_path):
    def load(i: int) -> pd.DataFrame:
        if i == 2:
            raise ValueError("bad Avro block in input 2")
        return FRAMES[i]

    ddf = dd.from_map(load, range(len(FRAMES)))
    with pytest.raises(SourceReadError, match=r"ddf\.partitions\[2\].*bad Avro block"):
        WindowDataset(ddf, **KW)
    with pytest.warns(SkippedPartitionWarning, match=r"ddf\.partitions\[2\]"):
        ds = WindowDataset(ddf, on_error="skip", **KW)
    assert [(s.name, s.stage) for s in ds.skipped] == [("ddf.partitions[2]", "scan")]
    kept = [f for i, f in enumerate(FRAMES) if i != 2]
    assert np.array_equal(_starts(collect(ds)), oracle_starts(kept, "sid", 7, 2))


def test_failing_partition_while_iterating(tmp_path):
    paths = write_parquet(FRAMES, str(tmp_path))
    ddf = dd.from_map(pd.read_parquet, paths)
    ds = WindowDataset(ddf, **KW)
    skipping = WindowDataset(ddf, on_error="skip", rank=1, world_size=2, **KW)
    with open(paths[1], "wb") as f:  # the input breaks after the dataset was opened
        f.write(b"garbage")
    with pytest.raises(SourceReadError, match=r"cannot compute ddf\.partitions\[1\]"):
        collect(ds)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        batches = collect(skipping)
    assert len(batches) == len(skipping)


# -- on a LocalCluster -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
    )
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_cluster_computes_partitions_and_keeps_them_in_flight(client, parquet_dir):
    ddf = dd.from_map(pd.read_parquet, parquet_dir)
    ds = WindowDataset(ddf, **KW)
    local = WindowDataset(os.path.dirname(parquet_dir[0]), pieces_per_partition=1, **KW)  # Dask reads whole partitions
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        local.set_epoch(epoch)
        assert _same(collect(ds), collect(local))
    source = DaskSource(ddf, series="sid", read_ahead=2)
    reader = source.reader([4, 0, 3, 1, 2], ["f0"])
    assert isinstance(reader, _DaskReader)
    first = reader.read(4)
    assert np.array_equal(first["f0"], FRAMES[4]["f0"].to_numpy())
    assert sorted(reader._futures) == [1, 2]  # the next two are computing on the cluster
    reader.close()
    assert reader._futures == {}


def test_read_csv_on_the_cluster(client, tmp_path):
    for i, frame in enumerate(FRAMES):
        frame.to_csv(tmp_path / f"part-{i:04d}.csv", index=False)
    ddf = dd.read_csv(str(tmp_path / "part-*.csv"), blocksize=None)
    ds = WindowDataset(ddf, **KW)
    assert np.array_equal(_starts(collect(ds)), oracle_starts(FRAMES, "sid", 7, 2))


def test_avro_through_from_map_on_the_cluster(client, tmp_path):
    fastavro = pytest.importorskip("fastavro")
    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "Row",
            "fields": [
                {"name": "sid", "type": "long"},
                {"name": "ts", "type": "long"},
                {"name": "f0", "type": "float"},
                {"name": "f1", "type": "float"},
                {"name": "y", "type": "float"},
            ],
        }
    )
    paths = []
    for i, frame in enumerate(FRAMES):
        path = str(tmp_path / f"part-{i:04d}.avro")
        with open(path, "wb") as f:
            fastavro.writer(f, schema, frame[["sid", "ts", "f0", "f1", "y"]].to_dict("records"))
        paths.append(path)

    def read_avro(path: str) -> pd.DataFrame:
        # nested, so the workers unpickle it by value: by reference, each would import this test module
        # (and torch with it) first
        with open(path, "rb") as f:
            return pd.DataFrame.from_records(list(fastavro.reader(f)))

    ddf = dd.from_map(read_avro, paths)
    ds = WindowDataset(ddf, **KW)
    batches = collect(ds)
    assert np.array_equal(_starts(batches), oracle_starts(FRAMES, "sid", 7, 2))
    x = np.concatenate([b[0] for b in batches])
    assert np.array_equal(x[:, 0, 0], np.concatenate([b[-1] for b in batches]).astype(np.float32))


def test_dataloader_workers_reconnect_to_the_scheduler(client, parquet_dir):
    ddf = dd.from_map(pd.read_parquet, parquet_dir)
    ds = WindowDataset(ddf, **KW)
    local = WindowDataset(os.path.dirname(parquet_dir[0]), pieces_per_partition=1, **KW)  # Dask reads whole partitions
    assert _same(collect(ds, {"num_workers": 2}), collect(local, {"num_workers": 2}))
    again = pickle.loads(pickle.dumps(ds))
    assert _same(collect(again), collect(local))
