"""Footers once per job on S3 (moto behind the counting proxy): the index's one read, and ranks sharing footers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import collect, make_frames, oracle_starts, parquet_bytes, s3_endpoint, same_batches, skip_unless_installed

from dask_windows.dataset import WindowDataset
from dask_windows.errors import DataError
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
    # the listing and one GET of the index, instead of one GET per object
    assert (s3.log.count("list"), s3.log.count("head"), s3.log.count("get")) == (1, 0, 1)
    assert indexed._fingerprint() == plain._fingerprint()
    want = collect(plain)
    assert same_batches(collect(indexed), want)
    starts = np.sort(np.concatenate([b[-1] for b in want]))
    assert np.array_equal(starts, oracle_starts(s3.frames, "sid", 8, 2))


@pytest.mark.parametrize("change", ["rewritten", "deleted", "added"])
def test_stale_index_on_s3_raises_naming_the_object(s3, change):
    url = _copy(s3, f"stale-{change}")
    write_index(url, series="sid", storage_options=s3.storage_options())
    key = f"shared-footers/stale-{change}/part-0003.parquet"
    if change == "rewritten":
        s3.fs.pipe(key, parquet_bytes(s3.frames[3].iloc[1:], row_group_size=17))
    elif change == "deleted":
        s3.fs.rm(key)
    else:
        key = f"shared-footers/stale-{change}/part-0042.parquet"
        s3.fs.pipe(key, parquet_bytes(s3.frames[0], row_group_size=17))
    with pytest.raises(DataError, match=rf"is stale: s3://{key}"):
        WindowDataset(url, storage_options=s3.storage_options(), **KW)


def test_two_gloo_ranks_make_the_footer_requests_of_one(s3, tmp_path):
    from scale_helpers import ROOT, wait

    url = _copy(s3, "shared")
    files = len(s3.frames)
    child = os.path.join(os.path.dirname(os.path.dirname(__file__)), "footer_share_child.py")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    options = json.dumps(s3.storage_options())
    s3.reset()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                child,
                f"file://{tmp_path / 'rendezvous'}",
                str(r),
                "2",
                url,
                options,
                str(tmp_path / f"r{r}.npy"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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
