"""Parquet in S3, against a real S3 endpoint on 127.0.0.1 (moto's server behind a counting proxy).

s3fs is configured exactly as a user would (``storage_options``); nothing in
the client is patched. The proxy counts requests and injects faults.
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    collect,
    make_frames,
    oracle_starts,
    parquet_bytes,
    s3_endpoint,
    same_batches,
    skip_unless_installed,
    write_parquet,
)

from dask_windows.dataset import WindowDataset
from dask_windows.errors import SourceReadError
from dask_windows.errors.faults import SkippedPartitionWarning
from dask_windows.sources.retry import RetryPolicy

skip_unless_installed("s3fs", "moto")


# next_pass_seconds=0: requests are counted per pass; a pass's read-ahead of the next one's first units
# (speedups/nextpass) would make them while the next count runs.
KW = dict(
    features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True,
    next_pass_seconds=0,
)  # fmt: skip
FAST = RetryPolicy(retries=3, base_delay=0.01)


def _parquet_bytes(frame) -> bytes:
    return parquet_bytes(frame, row_group_size=17)


@pytest.fixture(scope="module")
def s3():
    endpoint = s3_endpoint("bucket", make_frames(seed=3, num_files=5), extra={"data/_SUCCESS": b""})
    yield endpoint
    endpoint.close()


_same = same_batches


def _starts(batches: list) -> np.ndarray:
    return np.sort(np.concatenate([b[-1] for b in batches]))


def test_coverage_listing_once_and_requests_per_partition(s3, tmp_path):
    s3.reset()
    ds = WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), **KW)
    files, parts = len(s3.frames), len(ds.partitions)
    # Opening: a GET for a dataset index (none here: 404), one listing and one tail GET per file; the tail
    # holds these small files whole, so the series runs come out of it and no GET per partition is needed
    # for the series scan.
    assert s3.log.count("list") == 1
    assert s3.log.count("head") == 0
    assert s3.log.count("get") == files + 1

    for epoch in (0, 1):
        s3.reset()
        ds.set_epoch(epoch)
        batches = collect(ds)
        assert np.array_equal(_starts(batches), oracle_starts(s3.frames, "sid", 8, 2))
        # Each piece read costs one coalesced GET; no listing, no footer, no HEAD again.
        assert s3.log.count("get") == _pieces_read(ds) >= parts
        assert s3.log.count("list") == s3.log.count("head") == 0

    # Same rows on local disk: bit-identical batches, also through DataLoader worker processes.
    write_parquet(s3.frames, str(tmp_path), row_group_size=17)
    local = WindowDataset(str(tmp_path), **KW)
    for loader in ({}, {"num_workers": 2}):
        s3.reset()
        local.set_epoch(1)
        ds.set_epoch(1)  # each pass would otherwise take the next epoch
        assert _same(collect(ds, loader), collect(local, loader))
        assert s3.log.count("list") == s3.log.count("head") == 0


def test_pickled_dataset_does_not_list_again(s3):
    ds = WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), **KW)
    want = collect(ds)
    s3.reset()
    ds.set_epoch(0)  # iterated once: a copy's next pass would be epoch 1
    again = pickle.loads(pickle.dumps(ds))
    assert _same(collect(again), want)
    assert s3.log.count("list") == 0 and s3.log.count("get") == _pieces_read(ds)


def _pieces_read(ds) -> int:
    """GETs of one epoch of ``ds``: one GET per unit of the pool (whole partitions: a partition)."""
    from dask_windows.planning.world import World

    plan = ds._plan(World(0, 1, 0, 1))  # one GET per unit read (rows kept across cuts need none)
    return sum(1 for unit in plan.units if unit.fresh[1] > unit.fresh[0])


@pytest.mark.parametrize("kind", ["500", "reset"])
def test_transient_faults_complete_the_epoch_with_identical_batches(s3, kind):
    options = s3.storage_options(client_retries=False)  # botocore tries once: our policy does the retrying
    ds = WindowDataset("s3://bucket/data/", storage_options=options, retries=FAST, **KW)
    clean = collect(ds)
    s3.reset()
    s3.fail(3, kind)
    ds.set_epoch(0)
    assert _same(collect(ds), clean)
    assert s3.log.count("get", injected=True) == 3


def test_transient_faults_while_opening_are_retried(s3):
    s3.reset()
    s3.fail(2, "500", lambda r: r.kind == "get" and r.range is not None and r.range.startswith("bytes=-"))
    ds = WindowDataset(
        "s3://bucket/data/", storage_options=s3.storage_options(client_retries=False), retries=FAST, **KW
    )
    assert s3.log.count("get", injected=True) == 2
    assert np.array_equal(_starts(collect(ds)), oracle_starts(s3.frames, "sid", 8, 2))


def test_persistent_failure_names_the_object(s3):
    options = s3.storage_options(client_retries=False)
    ds = WindowDataset("s3://bucket/data/", storage_options=options, retries=RetryPolicy(2, base_delay=0.01), **KW)
    s3.reset()
    s3.fail(10**6, "500", lambda r: r.kind == "get" and r.path.endswith("part-0003.parquet"))
    with pytest.raises(SourceReadError, match=r"s3://bucket/data/part-0003\.parquet after 3 tries.*retries="):
        collect(ds)
    assert s3.log.count("get", injected=True) == 3
    s3.reset()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_object_raises_or_is_skipped(s3, damage):
    prefix = f"bucket/{damage}"
    for i, frame in enumerate(s3.frames):
        data = _parquet_bytes(frame)
        if i == 2:
            data = b"this is not parquet" * 10 if damage == "garbage" else data[: len(data) // 2]
        s3.fs.pipe(f"{prefix}/part-{i:04d}.parquet", data)
    url = f"s3://{prefix}/"
    with pytest.raises(SourceReadError, match=rf"s3://{prefix}/part-0002\.parquet.*on_error='skip'"):
        WindowDataset(url, storage_options=s3.storage_options(), **KW)
    with pytest.warns(SkippedPartitionWarning, match="part-0002"):
        ds = WindowDataset(url, storage_options=s3.storage_options(), on_error="skip", **KW)
    assert [(s.name, s.stage) for s in ds.skipped] == [(f"s3://{prefix}/part-0002.parquet", "open")]
    kept = [f for i, f in enumerate(s3.frames) if i != 2]
    assert np.array_equal(_starts(collect(ds)), oracle_starts(kept, "sid", 8, 2))


def test_object_glob_and_list_of_urls(s3):
    options = s3.storage_options()
    want = collect(WindowDataset("s3://bucket/data/", storage_options=options, **KW))
    by_glob = WindowDataset("s3://bucket/data/part-*.parquet", storage_options=options, **KW)
    urls = [f"s3://bucket/data/part-{i:04d}.parquet" for i in range(len(s3.frames))]
    s3.reset()
    by_list = WindowDataset(urls, storage_options=options, **KW)
    assert s3.log.count("list") == s3.log.count("head") == 0  # an explicit list is not listed
    for ds in (by_glob, by_list):
        assert _same(collect(ds), want)
    one = WindowDataset(urls[1], storage_options=options, **KW)
    assert np.array_equal(_starts(collect(one)), oracle_starts(s3.frames[1:2], "sid", 8, 2))
    with pytest.raises(FileNotFoundError, match="s3://bucket/nothing-here"):
        WindowDataset("s3://bucket/nothing-here/", storage_options=options, **KW)


def test_one_get_per_object_at_open_when_the_tail_tells_the_runs(s3):
    """Small files (the tail is the whole file) and larger one-series-per-row-group files (the footer's
    statistics tell the runs) cost one GET each at open, series scan included; runs equal a scan."""
    rng = np.random.default_rng(5)
    small = {
        f"bucket/one-get/small-{i}.parquet": pa.table(
            {"sid": np.sort(rng.integers(0, 4, 300)) + 10 * i, "f0": rng.standard_normal(300)}
        )
        for i in range(6)
    }
    large = {
        f"bucket/one-get/large-{i}.parquet": pa.table(
            {"sid": np.repeat([2 * i, 2 * i + 1], 20_000), "f0": rng.standard_normal(40_000)}
        )
        for i in range(3)
    }
    for key, table in {**small, **large}.items():
        out = io.BytesIO()
        pq.write_table(table, out, row_group_size=10_000)
        s3.fs.pipe(key, out.getvalue())
    assert all(len(s3.fs.cat_file(k)) > 64 * 2**10 for k in large)
    s3.reset()
    ds = WindowDataset(
        "s3://bucket/one-get/",
        storage_options=s3.storage_options(),
        features=["f0"],
        series="sid",
        window=4,
        batch_size=32,
    )
    assert s3.log.count("list") == 1 and s3.log.count("head") == 0
    assert s3.log.count("get") == len(small) + len(large) + 1  # + the look for an index (404)
    for runs, key in zip(ds.runs, sorted({**small, **large})):
        sid = (small.get(key) or large.get(key)).column("sid").to_numpy()
        starts = np.concatenate([[0], np.flatnonzero(np.diff(sid)) + 1])
        np.testing.assert_array_equal(runs.starts, starts)
        np.testing.assert_array_equal(runs.keys, sid[starts])
