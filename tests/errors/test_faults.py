"""Faults: transient errors retried, corrupt partitions raised or skipped without breaking equal batches."""

from __future__ import annotations

import errno
import os
import warnings

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers import collect, make_frames, oracle_starts, write_parquet

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError, SourceReadError
from dask_windows.errors.faults import SkippedPartitionWarning, is_transient, replacement_picks
from dask_windows.planning.plan import rng_for
from dask_windows.sources.retry import RetryPolicy

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=6, stride=1, batch_size=16, return_index=True)
FAST = RetryPolicy(retries=3, base_delay=0.001)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b)
    )


def _corrupt_column(path: str, column: str) -> None:
    """Overwrite every chunk of ``column`` with garbage; the footer stays valid."""
    meta = pq.read_metadata(path)
    with open(path, "r+b") as f:
        for g in range(meta.num_row_groups):
            for j in range(meta.num_columns):
                chunk = meta.row_group(g).column(j)
                if chunk.path_in_schema == column:
                    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o)
                    f.seek(start)
                    f.write(b"\xff" * chunk.total_compressed_size)


# -- the retry policy ------------------------------------------------------------------------


def test_transient_classification():
    from botocore.exceptions import ClientError, ConnectionClosedError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.EREMOTEIO, "We encountered an internal error"))
    assert is_transient(ConnectionClosedError(endpoint_url="http://x"))
    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("Whatever", 502))
    assert is_transient(client_error("TooManyRequestsException", 429))
    try:  # s3fs style: its own OSError raised from the store's error
        try:
            raise client_error("InternalError", 500)
        except ClientError as exc:
            raise OSError("wrapped") from exc
    except OSError as wrapped:
        assert is_transient(wrapped)
    assert not is_transient(client_error("AccessDenied", 403))
    assert not is_transient(client_error("NoSuchKey", 404))
    assert not is_transient(FileNotFoundError("gone"))
    assert not is_transient(PermissionError("no"))
    assert not is_transient(pa.ArrowInvalid("Parquet magic bytes not found"))
    assert not is_transient(OSError("Couldn't deserialize thrift"))
    assert not is_transient(ValueError("bug"))


def test_retry_policy_calls():
    calls = []

    def flaky(failures: int, exc: Exception):
        def fn():
            calls.append(1)
            if len(calls) <= failures:
                raise exc
            return "ok"

        return fn

    assert FAST.call(flaky(3, ConnectionResetError()), "x") == "ok" and len(calls) == 4
    calls.clear()
    with pytest.raises(ConnectionResetError) as info:
        FAST.call(flaky(9, ConnectionResetError()), "x")
    assert len(calls) == 4 and info.value.attempts == 4
    calls.clear()
    with pytest.raises(FileNotFoundError):
        FAST.call(flaky(9, FileNotFoundError()), "x")
    assert len(calls) == 1  # permanent: not retried
    policy = RetryPolicy(retries=10, base_delay=1.0, max_delay=4.0)
    assert policy.delay(9, "x") <= 4.0 and policy.delay(0, "x") == policy.delay(0, "x")
    assert 0.5 <= policy.delay(0, "x") < 1.0
    with pytest.raises(ConfigError, match="retries"):
        RetryPolicy(retries=-1)
    with pytest.raises(ConfigError, match="retries"):
        WindowDataset(np.zeros((10, 1)), window=2, retries="many")
    with pytest.raises(ConfigError, match="on_error"):
        WindowDataset(np.zeros((10, 1)), window=2, on_error="ignore")


def test_replacement_picks():
    rng = rng_for(1)
    picks = replacement_picks(10, 4, rng)
    assert len(set(picks.tolist())) == 4 and picks.max() < 10
    picks = replacement_picks(3, 7, rng_for(1))
    assert np.bincount(picks, minlength=3).tolist() in ([3, 2, 2], [2, 3, 2], [2, 2, 3])
    assert np.array_equal(replacement_picks(10, 4, rng_for(1)), replacement_picks(10, 4, rng_for(1)))


# -- a flaky filesystem: fails the first N reads ---------------------------------------------


class FlakyFileSystem(MemoryFileSystem):
    """The memory filesystem, failing the next ``failures`` reads with a connection reset."""

    protocol = "flaky"
    failures = 0
    injected = 0

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path[len("flaky://") :] if path.startswith("flaky://") else path)

    def _maybe_fail(self) -> None:
        if FlakyFileSystem.failures > 0:
            FlakyFileSystem.failures -= 1
            FlakyFileSystem.injected += 1
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer (injected)")

    def cat_ranges(self, *args, **kwargs):
        self._maybe_fail()
        return super().cat_ranges(*args, **kwargs)

    def cat_file(self, *args, **kwargs):
        self._maybe_fail()
        return super().cat_file(*args, **kwargs)


@pytest.fixture
def flaky(tmp_path):
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    frames = make_frames(seed=5, num_files=5)
    memory = fsspec.filesystem("memory")
    for path in write_parquet(frames, str(tmp_path), row_group_size=20):
        memory.pipe(f"/flakydata/{os.path.basename(path)}", open(path, "rb").read())
    FlakyFileSystem.failures = FlakyFileSystem.injected = 0
    yield frames
    memory.rm("/flakydata", recursive=True)


def test_flaky_reads_are_retried_and_the_epoch_is_identical(flaky):
    FlakyFileSystem.failures = 2  # the footer fetch at open fails twice too
    ds = WindowDataset("flaky://flakydata", retries=FAST, **KW)
    assert FlakyFileSystem.injected == 2
    clean = collect(ds)
    assert np.array_equal(np.sort(np.concatenate([b[-1] for b in clean])), oracle_starts(flaky, "sid", 6))
    FlakyFileSystem.failures, FlakyFileSystem.injected = 3, 0
    ds.set_epoch(0)  # the same epoch again (a new pass would take the next one)
    assert _same(collect(ds), clean)
    assert FlakyFileSystem.injected == 3


def test_transient_failure_while_opening_is_not_skipped(flaky):
    FlakyFileSystem.failures = 10**6  # every footer fetch fails: ranks could disagree, so no skip
    with pytest.raises(SourceReadError, match=r"after 2 tries.*not skipped while opening"):
        WindowDataset("flaky://flakydata", on_error="skip", retries=RetryPolicy(1, base_delay=0.001), **KW)
    FlakyFileSystem.failures = 0


def test_flaky_reads_without_retries_name_the_object(flaky):
    ds = WindowDataset("flaky://flakydata", retries=0, **KW)
    FlakyFileSystem.failures = 1
    with pytest.raises(SourceReadError, match=r"cannot read flaky:///flakydata/part-000\d\.parquet.*retries="):
        collect(ds)
    ds = WindowDataset("flaky://flakydata", retries=RetryPolicy(1, base_delay=0.001), **KW)
    FlakyFileSystem.failures = 10
    with pytest.raises(SourceReadError, match=r"after 2 tries: ConnectionResetError"):
        collect(ds)


# -- corrupt data: raise, or skip and keep the batch count -----------------------------------


@pytest.fixture
def corrupt(tmp_path):
    """Six files; file 3's feature column f0 is garbage (its footer and series column are fine)."""
    frames = make_frames(seed=11, num_files=6, num_series=12)
    paths = write_parquet(frames, str(tmp_path), row_group_size=25)
    _corrupt_column(paths[3], "f0")
    offsets = np.cumsum([0] + [len(f) for f in frames])
    every = oracle_starts(frames, "sid", 6)
    bad = (every >= offsets[3]) & (every < offsets[4])
    return str(tmp_path), paths[3], every[~bad], every[bad]


def test_corrupt_partition_raises_by_default(corrupt):
    root, bad_path, _, _ = corrupt
    ds = WindowDataset(root, **KW)
    with pytest.raises(SourceReadError, match=rf"cannot read {bad_path}: .*corrupt.*on_error='skip'"):
        collect(ds)


@pytest.mark.parametrize("buffer_partitions", [1, 2, 3])
def test_skipped_partition_keeps_equal_batches_on_two_ranks(corrupt, buffer_partitions):
    root, bad_path, good, bad = corrupt
    for epoch in range(3):
        seen, skipped = [], []
        for rank in (0, 1):
            ds = WindowDataset(
                root, rank=rank, world_size=2, on_error="skip", buffer_partitions=buffer_partitions, **KW
            )
            ds.set_epoch(epoch)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batches = collect(ds)
            assert all(
                issubclass(w.category, SkippedPartitionWarning) and "part-0003" in str(w.message) for w in caught
            )
            assert len(caught) == len(ds.skipped)
            skipped += ds.skipped
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds.set_epoch(epoch)
                assert _same(collect(ds), batches)  # the same failures give the same batches
            assert len(batches) == len(ds)
            assert all(len(b[0]) == 16 for b in batches[:-1])
            assert sum(len(b[0]) for b in batches) == (len(good) + len(bad)) // 2
            seen.append(np.concatenate([b[-1] for b in batches]))
            x = np.concatenate([b[0] for b in batches])
            assert np.array_equal(x[:, 0, 0], seen[-1].astype(np.float32))  # f0 == global row: real windows
        assert skipped and {(s.name, s.stage) for s in skipped} == {(bad_path, "read")}
        starts = np.concatenate(seen)
        assert not np.isin(starts, bad).any()
        assert np.isin(good, starts).sum() >= len(good) - 1  # all but the window world_size may leave out


def test_skipped_partition_in_dataloader_workers(corrupt):
    root, _, good, bad = corrupt
    ds = WindowDataset(root, on_error="skip", buffer_partitions=1, **KW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = collect(ds, {"num_workers": 2})
    assert len(batches) == len(ds) and all(len(b[0]) == 16 for b in batches[:-1])
    starts = np.concatenate([b[-1] for b in batches])
    assert len(starts) == len(good) + len(bad) and not np.isin(starts, bad).any()
    assert ds.skipped == []  # the workers skipped it, in their own processes


def test_skip_without_failures_changes_nothing(tmp_path):
    frames = make_frames(seed=2, num_files=4)
    write_parquet(frames, str(tmp_path))
    raising = WindowDataset(str(tmp_path), **KW)
    skipping = WindowDataset(str(tmp_path), on_error="skip", **KW)
    assert _same(collect(skipping), collect(raising))
    assert skipping.skipped == []


def test_reader_with_every_partition_unreadable_raises(tmp_path):
    frames = make_frames(seed=2, num_files=2)
    for path in write_parquet(frames, str(tmp_path)):
        _corrupt_column(path, "f0")
    with pytest.warns(SkippedPartitionWarning):
        ds = WindowDataset(str(tmp_path), on_error="skip", **KW)
        with pytest.raises(SourceReadError, match="every partition of this reader's share"):
            collect(ds)


def test_series_column_unreadable_at_open(tmp_path):
    frames = make_frames(seed=4, num_files=4)
    paths = write_parquet(frames, str(tmp_path))
    _corrupt_column(paths[1], "sid")
    with pytest.raises(SourceReadError, match=r"part-0001\.parquet"):
        WindowDataset(str(tmp_path), **KW)
    with pytest.warns(SkippedPartitionWarning, match="scanning series runs"):
        ds = WindowDataset(str(tmp_path), on_error="skip", **KW)
    assert [(s.name, s.stage) for s in ds.skipped] == [(paths[1], "scan")]
    # The partition stays in place with no windows: global rows of the others are unchanged.
    offsets = np.cumsum([0] + [len(f) for f in frames])
    every = oracle_starts(frames, "sid", 6)
    keep = (every < offsets[1]) | (every >= offsets[2])
    starts = np.sort(np.concatenate([b[-1] for b in collect(ds)]))
    assert np.array_equal(starts, every[keep])


def test_unreadable_footer_on_local_disk(tmp_path):
    frames = make_frames(seed=4, num_files=3)
    paths = write_parquet(frames, str(tmp_path))
    with open(paths[0], "r+b") as f:
        f.truncate(100)
    with pytest.raises(SourceReadError, match=rf"footer of {paths[0]}.*truncated or corrupt"):
        WindowDataset(str(tmp_path), **KW)
    with pytest.warns(SkippedPartitionWarning):
        ds = WindowDataset(str(tmp_path), on_error="skip", **KW)
    assert [s.stage for s in ds.skipped] == ["open"]
    assert np.array_equal(np.sort(np.concatenate([b[-1] for b in collect(ds)])), oracle_starts(frames[1:], "sid", 6))
