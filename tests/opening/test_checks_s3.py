"""Issue 11 against a real S3 server on 127.0.0.1: stalls end in a named error, partial commits are refused.

moto's server behind the counting, fault-injecting proxy of ``s3proxy``; a ``stall`` rule makes
the proxy read a request and never answer, as a hung endpoint does. Timeouts are a few seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_frames, oracle_starts, parquet_bytes, s3_endpoint, skip_unless_installed

from dask_windows.dataset import WindowDataset
from dask_windows.errors import DataError, SourceReadError
from dask_windows.sources.manifest import MANIFEST_FORMAT, MANIFEST_NAME, series_runs
from dask_windows.sources.retry import RetryPolicy

skip_unless_installed("s3fs", "moto")

from s3proxy import free_port  # noqa: E402

KW = dict(
    features=["f0", "f1"],
    targets=["y"],
    series="sid",
    window=8,
    batch_size=16,
    return_index=True,
    shuffle=False,
    prefetch_partitions=0,
)
FAST = RetryPolicy(retries=2, base_delay=0.01)


def _bytes(frame) -> bytes:
    return parquet_bytes(frame, write_page_checksum=True)


@pytest.fixture(scope="module")
def s3():
    # moto keeps one backend per process: a bucket of its own
    endpoint = s3_endpoint("checks", make_frames(seed=21, num_files=4), encode=_bytes)
    yield endpoint
    endpoint.close()


@pytest.fixture(autouse=True)
def _clean(s3):
    s3.reset()
    yield
    s3.reset()


def _options(s3) -> dict:
    return s3.storage_options(client_retries=False)


def test_stalled_endpoint_at_open_ends_in_a_named_error(s3):
    s3.fail(10**6, "stall", match=lambda r: True)
    with pytest.raises(
        SourceReadError,
        match=r"cannot (list|look for a dataset index in) s3://checks/data/.*DeadlineExceeded.*timeout=",
    ):
        WindowDataset("s3://checks/data/", storage_options=_options(s3), retries=FAST, timeout=1.5, **KW)


def test_stalled_endpoint_mid_epoch_names_the_object_and_yields_nothing_wrong(s3):
    ds = WindowDataset("s3://checks/data/", storage_options=_options(s3), retries=FAST, timeout=2, **KW)
    got = []
    s3.fail(10**6, "stall")  # every object read from now on hangs
    with pytest.raises(
        SourceReadError, match=r"cannot read s3://checks/data/part-\d{4}\.parquet.*DeadlineExceeded.*timeout="
    ):
        for batch in ds:
            got.append(batch[-1].numpy())
    assert not got  # nothing was read before the stall, so nothing may be yielded


def test_transient_errors_are_retried_within_the_deadline(s3):
    ds = WindowDataset("s3://checks/data/", storage_options=_options(s3), retries=FAST, timeout=20, **KW)
    s3.fail(2, "503")
    rows = np.sort(np.concatenate([b[-1].numpy() for b in ds]))
    assert np.array_equal(rows, oracle_starts(s3.frames, "sid", 8))
    assert s3.log.count("get", injected=True) == 2


def test_partial_commit_is_never_taken_for_a_dataset(s3):
    # a convert killed while moving its output: the manifest and only some parts are in the bucket
    files = []
    for i, frame in enumerate(s3.frames):
        data = _bytes(frame)
        files.append(
            {
                "path": f"part-{i:04d}.parquet",
                "rows": len(frame),
                "bytes": len(data),
                "runs": series_runs(frame["sid"].to_numpy()),
            }
        )
        if i < 2:
            s3.fs.pipe(f"checks/partial/part-{i:04d}.parquet", data)
    manifest = {"format": MANIFEST_FORMAT, "version": 1, "series": "sid", "time": "ts", "files": files}
    s3.fs.pipe(f"checks/partial/{MANIFEST_NAME}", json.dumps(manifest).encode())
    with pytest.raises(
        DataError, match=r"s3://checks/partial.*lists 4 files but 2 of them are not there.*did not finish"
    ):
        WindowDataset("s3://checks/partial/", storage_options=_options(s3), **KW)


def test_access_denied_and_missing_bucket_name_the_url(s3):
    s3.fail(10**6, "403", match=lambda r: True)
    with pytest.raises(SourceReadError, match=r"s3://checks/data/.*access was denied; check the credentials"):
        WindowDataset("s3://checks/data/", storage_options=_options(s3), retries=FAST, timeout=10, **KW)
    s3.reset()
    with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket/data"):
        WindowDataset("s3://no-such-bucket/data/", storage_options=_options(s3), retries=FAST, timeout=10, **KW)


def test_server_down_at_open_is_a_clear_error(s3):
    options = _options(s3)
    options["client_kwargs"] = dict(options["client_kwargs"], endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(
        SourceReadError,
        match=r"cannot (list|look for a dataset index in) s3://checks/data/.*check the connection or the endpoint",
    ):
        WindowDataset("s3://checks/data/", storage_options=options, retries=FAST, timeout=3, **KW)
