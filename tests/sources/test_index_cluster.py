"""The dataset index built on a Dask cluster (``write_index(client=)``, ``dask-windows index --scheduler``):
the same bytes as the build on threads of one process, from a real ``distributed.LocalCluster``."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import collect, make_frames, same_batches

from dask_windows.dataset import WindowDataset
from dask_windows.sources.parquet.footer_index import INDEX_NAME
from dask_windows.sources.parquet.index_writer import write_index

distributed = pytest.importorskip("distributed")

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True)


@pytest.fixture(scope="module")
def cluster():
    """Two in-process workers of one thread; the client connects through the scheduler's address, so
    every block's entries travel pickled as from a remote worker."""
    import logging

    local = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    with local, distributed.Client(local.scheduler_address) as client:
        yield client


def _write(root, frames, keys: str = "int", first: int = 0) -> None:
    """Files of row groups of 17 rows; with ``keys == "str"`` string keys and 1 KiB of random bytes a row,
    so that the files larger than the tail read at open have their series column scanned."""
    root.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(frames, first):
        if keys == "str":
            rng = np.random.default_rng(i)
            pad = [rng.bytes(1024) for _ in range(len(frame))]
            frame = frame.assign(sid=frame["sid"].map(lambda s: f"s{s:03d}"), pad=pad)
        pq.write_table(
            pa.Table.from_pandas(frame, preserve_index=False), root / f"part-{i:04d}.parquet", row_group_size=17
        )


def _frames() -> list[pd.DataFrame]:
    return make_frames(seed=5, num_files=20, num_series=30, max_len=60)


def _both(root, index, **kwargs) -> tuple[bytes, bytes, dict, dict]:
    """The index written on threads here, then on the cluster (``client=``), each from no index."""
    here = write_index(str(root), index, series="sid", **{k: v for k, v in kwargs.items() if k != "client"})
    path = here["index"]
    local_bytes = _read(path)
    _remove(path)
    there = write_index(str(root), index, series="sid", **kwargs)
    return local_bytes, _read(there["index"]), here, there


def _read(path: str) -> bytes:
    import fsspec

    with fsspec.open(path, "rb") as f:
        return f.read()


def _remove(path: str) -> None:
    import fsspec

    fs, stripped = fsspec.core.url_to_fs(path)
    fs.rm(stripped)


@pytest.mark.parametrize("keys", ["int", "str"])
def test_the_index_built_on_a_cluster_is_the_index_built_here(cluster, tmp_path, keys, monkeypatch):
    import threading

    from dask_windows.sources.base import Source
    from dask_windows.sources.parquet.opening import ParquetOpening

    frames = _frames()
    root = tmp_path / "data"
    _write(root, frames, keys)
    where: dict[str, list[str]] = {"open": [], "scan": []}  # the threads each footer and series column is read on
    open_files, read_runs = ParquetOpening._open_files, Source.read_runs

    def opened(self, files, *args, **kwargs):
        where["open"] += [threading.current_thread().name] * len(files)
        return open_files(self, files, *args, **kwargs)

    def scanned(self, index, series):
        where["scan"].append(threading.current_thread().name)
        return read_runs(self, index, series)

    monkeypatch.setattr(ParquetOpening, "_open_files", opened)
    monkeypatch.setattr(Source, "read_runs", scanned)
    local_bytes, cluster_bytes, here, there = _both(root, None, client=cluster)
    threads = where["open"]  # the cluster's build opened every file on the workers' threads
    assert ["Dask-" in t for t in threads] == [False] * 20 + [True] * 20
    if keys == "str":  # and scanned the series columns there (on threads of each task), as many as here
        assert where["scan"] and len(where["scan"]) % 2 == 0
    assert here["files"] == there["files"] == 20 and there["footers_read"] == 20
    assert cluster_bytes == local_bytes
    if keys == "int":  # the index opens and yields what the files do
        want = collect(WindowDataset(str(root), index=False, **KW))
        assert same_batches(collect(WindowDataset(str(root), index=True, **KW)), want)


def test_an_object_store_index_built_on_a_cluster_is_the_same(cluster, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")  # not local disk: identities from the listing, URLs to the workers
    frames = _frames()[:8]
    _write(tmp_path / "data", frames)
    for name in sorted(os.listdir(tmp_path / "data")):
        fs.pipe_file(f"/cluster-index/data/{name}", (tmp_path / "data" / name).read_bytes())
    try:
        local_bytes, cluster_bytes, _, there = _both("memory://cluster-index/data", None, client=cluster)
        assert there["index"].endswith(INDEX_NAME) and there["files"] == 8
        assert cluster_bytes == local_bytes
    finally:
        fs.rm("/cluster-index", recursive=True)


def test_files_added_are_read_on_the_cluster_into_the_same_index(cluster, tmp_path):
    frames = _frames()
    root = tmp_path / "data"
    _write(root, frames[:15])
    write_index(str(root), series="sid")
    previous = (root / INDEX_NAME).read_bytes()
    _write(root, frames[15:], first=15)  # five files added
    os.utime(root / "part-0003.parquet", ns=(1, 1))  # and one touched: read again
    here = write_index(str(root), series="sid")
    local_bytes = (root / INDEX_NAME).read_bytes()
    (root / INDEX_NAME).write_bytes(previous)
    there = write_index(str(root), series="sid", client=cluster)
    assert here["footers_read"] == there["footers_read"] == 6 and here["files"] == there["files"] == 20
    assert (root / INDEX_NAME).read_bytes() == local_bytes


def test_cli_index_on_a_scheduler_writes_the_same_index(cluster, tmp_path, capsys):
    from dask_windows.cli import main

    root = tmp_path / "data"
    _write(root, _frames())
    assert main(["index", str(root), "--series", "sid", "--json"]) == 0
    local_bytes = (root / INDEX_NAME).read_bytes()
    os.remove(root / INDEX_NAME)
    capsys.readouterr()
    address = cluster.scheduler_info()["address"]
    assert main(["index", str(root), "--series", "sid", "--scheduler", address, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 20 and out["workers"] == 2
    assert (root / INDEX_NAME).read_bytes() == local_bytes


def test_an_unreachable_scheduler_fails_in_its_timeout_naming_the_remedy(tmp_path, capsys):
    from dask_windows.cli import main

    root = tmp_path / "data"
    _write(root, _frames()[:2])
    started = time.monotonic()
    code = main(["index", str(root), "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1s"])
    assert code == 1 and time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert err.startswith("dask-windows index: error: could not reach the Dask scheduler at tcp://127.0.0.1:9")
    assert "leave out --scheduler" in err and "Traceback" not in err
    assert not (root / INDEX_NAME).exists()


def test_a_damaged_file_read_on_the_cluster_raises_naming_it(cluster, tmp_path):
    from dask_windows.errors import SourceReadError

    root = tmp_path / "data"
    _write(root, _frames()[:4])
    (root / "part-0002.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(SourceReadError, match="part-0002.parquet"):
        write_index(str(root), series="sid", client=cluster)
    assert not (root / INDEX_NAME).exists()


def test_a_scheduler_without_workers_raises_in_its_wait_naming_the_remedy(tmp_path, monkeypatch):
    import logging

    from dask_windows.sources.parquet import index_cluster

    root = tmp_path / "data"
    _write(root, _frames()[:2])
    monkeypatch.setattr(index_cluster, "WORKER_WAIT_SECONDS", 0.5)
    empty = distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0", silence_logs=logging.ERROR)
    with empty, distributed.Client(empty) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="has no worker.*start workers on it"):
            write_index(str(root), series="sid", client=client)
        assert time.monotonic() - started < 10
    assert not (root / INDEX_NAME).exists()
