"""Footers once per job on S3 (moto behind the counting proxy): the index's one read, and ranks sharing footers."""

from __future__ import annotations

import json
import os
import sys

import forkrun
import numpy as np
import pytest
from helpers import collect, make_frames, oracle_starts, parquet_bytes, s3_endpoint, same_batches, skip_unless_installed

from dask_windows.dataset import WindowDataset
from dask_windows.errors import DataError, SourceReadError
from dask_windows.sources.parquet.footer_index import INDEX_NAME
from dask_windows.sources.parquet.index_writer import write_index

skip_unless_installed("s3fs", "moto")

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True)


@pytest.fixture(scope="module")
def s3():
    endpoint = s3_endpoint("shared-footers", make_frames(seed=3, num_files=6))
    yield endpoint
    endpoint.close()


def _copy(s3, prefix: str) -> str:
    for i, frame in enumerate(s3.frames):
        s3.fs.pipe(f"shared-footers/{prefix}/part-{i:04d}.parquet", parquet_bytes(frame, row_group_size=17))
    return f"s3://shared-footers/{prefix}/"


def test_index_on_s3_one_get_at_open_same_batches(s3):
    url = _copy(s3, "indexed")
    options = s3.storage_options()
    plain = WindowDataset(url, storage_options=options, **KW)
    report = write_index(url, series="sid", storage_options=options)
    assert report["index"] == f"s3://shared-footers/indexed/{INDEX_NAME}"
    s3.reset()
    indexed = WindowDataset(url, storage_options=options, **KW)
    # one GET of the index, instead of a listing and one GET per object: the index is the source of truth
    assert (s3.log.count("list"), s3.log.count("head"), s3.log.count("get")) == (0, 0, 1)
    assert indexed._fingerprint() == plain._fingerprint()
    want = collect(plain)
    assert same_batches(collect(indexed), want)
    starts = np.sort(np.concatenate([b[-1] for b in want]))
    assert np.array_equal(starts, oracle_starts(s3.frames, "sid", 8, 2))


@pytest.mark.parametrize("change", ["rewritten", "deleted", "added"])
def test_stale_index_on_s3_is_named_at_the_read_or_by_verify(s3, change):
    from dask_windows.sources.parquet.index_writer import verify_index

    url = _copy(s3, f"stale-{change}")
    options = s3.storage_options()
    write_index(url, series="sid", storage_options=options)
    key = f"shared-footers/stale-{change}/part-0003.parquet"
    if change == "rewritten":
        s3.fs.pipe(key, parquet_bytes(s3.frames[3].iloc[1:], row_group_size=17))
    elif change == "deleted":
        s3.fs.rm(key)
    else:
        key = f"shared-footers/stale-{change}/part-0042.parquet"
        s3.fs.pipe(key, parquet_bytes(s3.frames[0], row_group_size=17))
    s3.reset()
    ds = WindowDataset(url, storage_options=options, **KW)  # the index alone: no listing sees the change
    assert s3.log.count("list") == 0
    if change == "added":
        assert len(ds.source.files) == len(s3.frames)  # not in the index: not opened, as a listing before it
    else:  # the object's read fails, naming the index and the command that finds every change
        with pytest.raises(SourceReadError, match=r"part-0003.parquet.*from its index.*dask-windows index --verify"):
            collect(ds)
    with pytest.raises(DataError, match=rf"is stale: s3://{key}.*dask-windows index"):
        verify_index(url, storage_options=options)


def test_verify_passes_on_a_fresh_index_and_fails_on_a_stale_one(tmp_path, capsys):
    from dask_windows.cli import main

    frames = make_frames(seed=3, num_files=3)
    for i, frame in enumerate(frames):
        (tmp_path / f"part-{i:04d}.parquet").write_bytes(parquet_bytes(frame, row_group_size=17))
    assert main(["index", str(tmp_path), "--series", "sid"]) == 0
    capsys.readouterr()
    assert main(["index", str(tmp_path), "--verify"]) == 0
    assert "matches the 3 files" in capsys.readouterr().out
    (tmp_path / "part-0001.parquet").unlink()
    assert main(["index", str(tmp_path), "--verify"]) == 1
    assert "part-0001.parquet is in it but not there" in capsys.readouterr().err


def test_two_gloo_ranks_make_the_footer_requests_of_one(s3, tmp_path):
    from scale_helpers import ROOT, wait

    url = _copy(s3, "shared")
    files = len(s3.frames)
    child = os.path.join(os.path.dirname(os.path.dirname(__file__)), "footer_share_child.py")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    options = json.dumps(s3.storage_options())
    s3.reset()
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        forkrun.popen(
            [sys.executable, child, rendezvous, str(r), "2", url, options, str(tmp_path / f"r{r}.npy")], env=env
        )
        for r in range(2)
    ]
    wait(procs, timeout=180)
    tails = [r for r in s3.log.requests if r.kind == "get" and r.range is not None and r.range.startswith("bytes=-")]
    assert len(tails) == files  # one tail GET per object for the whole job, not one per object and rank
    assert s3.log.count("list") == 2  # each rank lists (one request per 1,000 objects)
    for r in range(2):  # telemetry gathered over the ranks: each rank's batches, the slowest named
        stats = json.load(open(tmp_path / f"r{r}.npy.json"))
        assert stats["ranks"] == [stats["len"]] * 2 and stats["slowest"] in (0, 1)
    got = np.sort(np.concatenate([np.load(tmp_path / f"r{r}.npy") for r in range(2)]))
    want = oracle_starts(s3.frames, "sid", 8, 2)
    assert len(np.unique(got)) == len(got) and np.isin(got, want).all() and len(got) >= len(want) - 1


def test_a_prefix_copied_with_its_index_opens_from_it_without_listing(s3):
    url = _copy(s3, "original")
    options = s3.storage_options()
    write_index(url, series="sid", storage_options=options)
    want = collect(WindowDataset(url, storage_options=options, index=False, **KW))
    for key in s3.fs.find("shared-footers/original/"):
        s3.fs.copy(key, key.replace("/original/", "/copied/"))
    s3.reset()
    copied = WindowDataset("s3://shared-footers/copied/", storage_options=options, **KW)
    assert (s3.log.count("list"), s3.log.count("get")) == (0, 1)
    assert all(f.startswith("shared-footers/copied/") for f in copied.source.files)
    assert same_batches(collect(copied), want)
