"""Issue 11, on real local files: every way bad, changed or stalled data reaches a batch raises or is counted.

One test (or a few) per numbered case of the issue; each asserts the error type, that the message
names the file and column and the remedy, and that no wrong batch was yielded before it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_frames, oracle_starts, write_parquet

import dask_windows as dw
from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError
from dask_windows.errors.faults import classify, skip_allowed
from dask_windows.opening.checks import ManifestWarning, SeriesOrderWarning
from dask_windows.sources.manifest import series_runs, write_manifest

KW = dict(features=["f0", "f1"], targets=["y"], window=4, batch_size=32, shuffle=False, prefetch_partitions=0)


def _batches(ds) -> list:
    return [tuple(t.numpy() for t in b) for b in ds]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))


def _write(frames, root, crc=True, row_group_size=60) -> list[str]:
    os.makedirs(root, exist_ok=True)
    paths = []
    for i, frame in enumerate(frames):
        path = os.path.join(root, f"part-{i:04d}.parquet")
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table, path, row_group_size=row_group_size, write_page_checksum=crc)
        paths.append(path)
    return paths


def _manifest(root: str, frames, series="sid") -> None:
    files = []
    for i, frame in enumerate(frames):
        name = f"part-{i:04d}.parquet"
        files.append(
            {
                "path": name,
                "rows": len(frame),
                "bytes": os.path.getsize(os.path.join(root, name)),
                "runs": series_runs(frame[series].to_numpy()),
            }
        )
    import fsspec

    write_manifest(root, fsspec.filesystem("file"), series=series, time="ts", files=files)


def json_size(root: str, name: str) -> int:
    import json

    with open(os.path.join(root, "_dask_windows_manifest.json")) as src:
        return next(f["bytes"] for f in json.load(src)["files"] if f["path"] == name)


# -- 1. corrupt pages: with page CRCs every flip raises or changes nothing ----------------------


def _flip_trials(tmp_path, crc: bool, trials: int) -> tuple[int, int, int]:
    """``(silent, raised, unchanged)`` over ``trials`` seeded runs of 1-8 random byte flips in one file of 3."""
    src = str(tmp_path / f"src{int(crc)}")
    frames = make_frames(seed=1, num_files=3, num_series=6, max_len=200)
    _write(frames, src, crc=crc, row_group_size=100)
    kw = dict(KW, series="sid", batch_size=64)
    want = _batches(WindowDataset(src, **kw))
    # the reference is the oracle: f0 holds the global row, so each window's first f0 is its start
    assert np.array_equal(np.concatenate([b[0][:, 0, 0] for b in want]), oracle_starts(frames, "sid", 4))
    rng = np.random.default_rng(11)
    silent = raised = unchanged = 0
    for _ in range(trials):
        work = str(tmp_path / "work")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        victim = os.path.join(work, f"part-{int(rng.integers(3)):04d}.parquet")
        with open(victim, "rb") as src_file:
            data = bytearray(src_file.read())
        for pos in rng.integers(0, len(data), int(rng.integers(1, 9))):
            data[pos] ^= int(rng.integers(1, 256))
        with open(victim, "wb") as out_file:
            out_file.write(bytes(data))
        got = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for batch in WindowDataset(work, **kw):
                    got.append(tuple(t.numpy() for t in batch))
        except Exception:
            # a raise is fine, but every batch yielded before it must be right
            assert _same(got, want[: len(got)]), "a wrong batch was yielded before the error"
            raised += 1
            continue
        if _same(got, want):
            unchanged += 1
        else:
            silent += 1
    return silent, raised, unchanged


def test_random_byte_flips_with_page_checksums_never_give_silent_differences(tmp_path):
    silent, raised, _ = _flip_trials(tmp_path, crc=True, trials=150)
    assert silent == 0
    assert raised > 100  # the test can fail: most flips land in data pages and must raise


def test_random_byte_flips_without_checksums_are_only_partly_detected(tmp_path):
    # What docs/checks.md states: without CRCs a flip inside a data page may change values silently.
    silent, raised, unchanged = _flip_trials(tmp_path, crc=False, trials=40)
    assert raised > 0 and silent + raised + unchanged == 40


def test_convert_writes_page_checksums_and_a_flip_raises(tmp_path):
    pytest.importorskip("dask")
    from dask_windows.cli.convert import convert

    frame = pd.concat(make_frames(seed=2, num_files=1, num_series=4, max_len=60))
    src = tmp_path / "in.parquet"
    frame.to_parquet(src, index=False)
    out = tmp_path / "out"
    convert([str(src)], str(out), series="sid", time="ts")
    path = sorted(p for p in out.iterdir() if p.suffix == ".parquet")[0]
    meta = pq.read_metadata(path)
    chunk = meta.row_group(0).column(meta.schema.names.index("f0"))
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size - 3] ^= 0x40  # inside f0's data page values
    path.write_bytes(bytes(data))
    with pytest.raises(SourceReadError, match=r"CRC.*corrupt"):
        _batches(WindowDataset(str(out), features=["f0"], window=4, batch_size=8))


# -- 2. the manifest, both ways -----------------------------------------------------------------


@pytest.fixture
def converted(tmp_path):
    frames = make_frames(seed=4, num_files=4, num_series=8)
    root = str(tmp_path / "ds")
    paths = _write(frames, root)
    _manifest(root, frames)
    return root, frames, paths


def test_manifest_file_deleted_locally_warns_and_scans(converted):
    root, frames, paths = converted
    os.remove(paths[2])
    with pytest.warns(ManifestWarning, match=r"part-0002.parquet is listed in the manifest but missing.*scanning"):
        ds = WindowDataset(root, return_index=True, **KW)
    starts = np.sort(np.concatenate([b[-1] for b in _batches(ds)]))
    assert np.array_equal(starts, oracle_starts([frames[0], frames[1], frames[3]], "sid", 4))
    # (on an object store the same state is an unfinished commit and raises: tests/opening/test_checks_s3.py)


def test_manifest_extra_or_rewritten_file_warns_and_scans(converted):
    root, frames, paths = converted
    # a part rewritten with the same row count but other series: the stale runs must not be used
    other = frames[1].copy()
    other["sid"] = np.arange(len(other)) // 5
    pq.write_table(pa.Table.from_pandas(other, preserve_index=False), paths[1], row_group_size=7)
    with pytest.warns(ManifestWarning, match=r"part-0001.parquet has [\d,]+ bytes, the manifest says"):
        ds = WindowDataset(root, return_index=True, **KW)
    starts = np.sort(np.concatenate([b[-1] for b in _batches(ds)]))
    assert np.array_equal(starts, oracle_starts([frames[0], other, *frames[2:]], "sid", 4))
    # the same, keeping the size: the footer's series statistics disagree with the manifest's runs
    mixed = other.copy()
    mixed["sid"] = mixed["sid"] + 1000  # other series
    pq.write_table(pa.Table.from_pandas(mixed, preserve_index=False), paths[1], row_group_size=7)
    _manifest(root, [frames[0], other, *frames[2:]])  # today's sizes, the old runs of part 1
    assert os.path.getsize(paths[1]) == json_size(root, "part-0001.parquet")
    with pytest.warns(
        ManifestWarning, match=r"part-0001.parquet: row group 0 holds series 1000..*the manifest's runs say"
    ):
        ds = WindowDataset(root, return_index=True, **KW)
    starts = np.sort(np.concatenate([b[-1] for b in _batches(ds)]))
    assert np.array_equal(starts, oracle_starts([frames[0], mixed, *frames[2:]], "sid", 4))
    # an extra data file not in the manifest
    shutil.copy(paths[0], os.path.join(root, "part-0009.parquet"))
    with pytest.warns(ManifestWarning, match=r"part-0009.parquet is not in the manifest"):
        WindowDataset(root, **KW)


# -- 3. the series column from the manifest -----------------------------------------------------


def test_series_comes_from_the_manifest_unless_series_none(converted):
    root, frames, _ = converted
    ds = WindowDataset(root, return_index=True, **KW)
    assert ds.spec.series == "sid" and "series='sid' (from the manifest)" in repr(ds)
    starts = np.sort(np.concatenate([b[-1] for b in _batches(ds)]))
    assert np.array_equal(starts, oracle_starts(frames, "sid", 4))
    one = WindowDataset(root, series=None, return_index=True, **KW)
    assert one.spec.series is None and "from the manifest" not in repr(one)
    assert one.num_windows == len(oracle_starts(frames, None, 4))


# -- 4. rows not grouped by series --------------------------------------------------------------


def _blocks(tmp_path, block: int) -> str:
    n = 240
    sid = (np.arange(n) // block) % 2  # A,B,A,B... in blocks of `block` rows
    frame = pd.DataFrame(
        {"sid": sid, "f0": np.arange(n, dtype=np.float32), "f1": np.ones(n, np.float32), "y": np.zeros(n, np.float32)}
    )
    root = str(tmp_path / f"blocks{block}")
    _write([frame], root)
    return root


def test_reappearing_series_warn_or_raise_with_strict(tmp_path):
    root = _blocks(tmp_path, 20)
    with pytest.warns(SeriesOrderWarning, match=r"'sid' is not grouped.*2 series form 12 runs.*sort the rows by 'sid'"):
        WindowDataset(root, series="sid", **KW)
    with pytest.raises(DataError, match=r"not grouped.*dask-windows convert"):
        WindowDataset(root, series="sid", strict=True, **KW)


def test_interleaved_rows_no_windows_error_names_sorting(tmp_path):
    root = _blocks(tmp_path, 1)
    with (
        pytest.warns(SeriesOrderWarning),
        pytest.raises(DataError, match=r"no windows.*not grouped.*sort the rows by 'sid' and time"),
    ):
        WindowDataset(root, series="sid", **KW)


# -- 6. non-finite values and normalisation -----------------------------------------------------


def _with_value(tmp_path, value, row=50, dtype=np.float64) -> tuple[str, list]:
    frames = [f.astype({"f1": dtype}) for f in make_frames(seed=5, num_files=1, num_series=6, max_len=120)] * 2
    frames = [frames[0].copy(), frames[1].copy()]
    frames[1].iloc[row, frames[1].columns.get_loc("f1")] = value
    root = str(tmp_path / f"v{abs(hash(str(value))) % 1000}")
    return root, _write(frames, root) and frames


@pytest.mark.parametrize("value", [np.inf, -np.inf, 1e39])
def test_non_finite_values_raise_naming_file_column_row(tmp_path, value):
    root, _ = _with_value(tmp_path, value)
    ds = WindowDataset(root, series="sid", normalize="sample", **KW)
    got = []
    with pytest.raises(DataError, match=r"infinite value.*column 'f1' of .*part-0001.parquet at row 50.*nan='drop'"):
        for batch in ds:
            got.append(batch)
            assert np.isfinite(batch[0].numpy()).all()


def test_non_finite_windows_dropped_with_nan_drop(tmp_path):
    root, frames = _with_value(tmp_path, np.inf, row=50)
    ds = WindowDataset(root, series="sid", nan="drop", normalize="sample", return_index=True, **KW)
    batches = _batches(ds)
    assert all(np.isfinite(b[0]).all() for b in batches)
    starts = np.sort(np.concatenate([b[-1] for b in batches]))
    bad = len(frames[0]) + 50
    want = oracle_starts(frames, "sid", 4)
    assert np.array_equal(starts, want[(want > bad) | (want + 4 <= bad)])


def test_sample_normalisation_of_constant_and_huge_windows_is_finite(tmp_path):
    n = 64
    frame = pd.DataFrame(
        {
            "sid": np.zeros(n, np.int64),
            "f0": np.full(n, 7.0, np.float32),
            "f1": np.where(np.arange(n) % 2, 3e38, -3e38).astype(np.float32),
            "y": np.zeros(n, np.float32),
        }
    )
    root = str(tmp_path / "const")
    _write([frame], root)
    x = np.concatenate([b[0] for b in _batches(WindowDataset(root, series="sid", normalize="sample", **KW))])
    assert np.isfinite(x).all()
    assert (x[:, 0] == 0).all() and np.allclose(np.abs(x[:, 1]), 1.0)


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"mean": float("nan"), "std": 1.0}, "mean nan"),
        ({"mean": 0.0, "std": -1.0}, "std -1.0"),
        ({"mean": 0.0, "std": float("inf")}, "std inf"),
        ({"mean": 1e39, "std": 1.0}, "mean 1e.39"),
    ],
)
def test_stats_file_validated_like_the_dict(tmp_path, entry, match):
    import json

    root = str(tmp_path / "d")
    write_parquet(make_frames(seed=6, num_files=1), root)
    stats = tmp_path / "stats.json"
    doc = {"format": "dask_windows.stats", "version": 1, "features": {"f0": {"mean": 0.0, "std": 1.0}, "f1": entry}}
    stats.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=rf"{stats}.*feature 'f1' the {match}.*dask-windows stats"):
        WindowDataset(root, series="sid", normalize=str(stats), **KW)
    with pytest.raises(ConfigError, match="finite"):
        WindowDataset(root, series="sid", normalize={"mean": [0, entry["mean"]], "std": [1, entry["std"]]}, **KW)


# -- 7. one dtype of y for the whole dataset ----------------------------------------------------


def test_int_target_with_a_null_in_one_file_keeps_int64(tmp_path):
    frames = make_frames(seed=7, num_files=3, num_series=4)
    for f in frames:
        f["label"] = pd.array(np.arange(len(f)) % 3, dtype="Int64")
    frames[1].loc[10, "label"] = pd.NA
    root = str(tmp_path / "int")
    _write(frames, root)
    kw = dict(KW, targets=["label"], series="sid")
    ds = WindowDataset(root, nan="drop", **kw)
    dtypes = {b[1].dtype for b in _batches(ds)}
    assert dtypes == {np.dtype(np.int64)}
    with pytest.raises(DataError, match=r"null \(missing value\) in target column 'label' of .*part-0001"):
        _batches(WindowDataset(root, **kw))


# -- 8. resume state per pass -------------------------------------------------------------------


def test_second_iterator_never_moves_the_first(tmp_path):
    root = str(tmp_path / "r")
    write_parquet(make_frames(seed=8, num_files=4), root)
    kw = dict(KW, series="sid", batch_size=8, shuffle=True)
    ds = WindowDataset(root, **kw)
    full = _batches(WindowDataset(root, **kw))
    it = iter(ds)
    taken = [tuple(t.numpy() for t in next(it)) for _ in range(5)]
    peek = iter(ds)
    next(peek), next(peek)
    with pytest.raises(ConfigError, match=r"ambiguous: 2 passes.*close the other iterator"):
        ds.state_dict()
    peek.close()
    state = ds.state_dict()
    assert state["batches"] == 5
    next(iter(ds))  # a peek dropped at once
    assert ds.state_dict()["batches"] == 5
    resumed = WindowDataset(root, **kw)
    resumed.load_state_dict(state)
    assert _same(taken + _batches(resumed), full)


# -- 10. resource errors are not corruption and are never skipped -------------------------------


def test_error_classes_and_skip_rules():
    assert classify(OSError(errno.EMFILE, "Too many open files")) == "resource"
    assert classify(OSError("Failed to open local file: Too many open files")) == "resource"
    assert classify(MemoryError()) == "resource"
    assert classify(PermissionError(errno.EACCES, "denied")) == "permission"
    assert classify(FileNotFoundError(errno.ENOENT, "gone")) == "missing"
    assert classify(IsADirectoryError(errno.EISDIR, "dir")) == "missing"
    assert classify(pa.ArrowInvalid("bad magic")) == "corrupt"
    assert classify(ConnectionResetError()) == "transient"
    for kind, skipped in [("resource", False), ("permission", False), ("missing", True), ("corrupt", True)]:
        error = SourceReadError("x")
        error.kind = kind
        assert skip_allowed("skip", error) is skipped
    assert not skip_allowed("raise", pa.ArrowInvalid("x"))


def test_too_many_open_files_is_a_resource_error_not_skipped(tmp_path):
    root = str(tmp_path / "many")
    write_parquet(make_frames(seed=9, num_files=24, num_series=30), root)
    script = textwrap.dedent(f"""
        import resource, sys, os
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(dw.__file__)))!r})
        import pyarrow.parquet, numpy
        from dask_windows.dataset import WindowDataset
        from dask_windows.errors import SourceReadError
        paths = sorted(os.path.join({root!r}, p) for p in os.listdir({root!r}))  # a list: no listing, only footers
        WindowDataset(paths, features=["f0"], series="sid", window=4, threads=1)  # imports done before
        hold = []
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        try:
            while True:
                hold.append(open(os.devnull))
        except OSError:
            pass
        try:
            WindowDataset(paths, features=["f0"], series="sid", window=4, on_error="skip", threads=1)
        except SourceReadError as exc:
            print("RAISED", exc)
        else:
            print("OPENED")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "RAISED" in out.stdout, out.stdout + out.stderr
    assert "cannot read the Parquet footer of" in out.stdout  # 22 good files were dropped here before
    assert "ran out of a resource" in out.stdout and "ulimit -n" in out.stdout and "never skipped" in out.stdout
    assert "corrupt" not in out.stdout.split("; ", 1)[1]


def test_missing_file_and_folder_in_a_list_name_the_remedy(tmp_path):
    root = str(tmp_path / "l")
    paths = write_parquet(make_frames(seed=10, num_files=2), root)
    gone = str(tmp_path / "gone.parquet")
    with pytest.raises(SourceReadError, match=r"gone.parquet.*does not exist, or is a folder"):
        WindowDataset([paths[0], gone], series="sid", **KW)
    with pytest.warns(dw.SkippedPartitionWarning):
        ds = WindowDataset([paths[0], gone, paths[1]], series="sid", on_error="skip", **KW)
    assert [s.name for s in ds.skipped] == [gone]
    folder = str(tmp_path / "sub")
    os.makedirs(folder)
    with pytest.raises(SourceReadError, match=r"sub.*(folder|directory)"):
        WindowDataset([paths[0], folder], series="sid", **KW)


# -- 11. the smaller ones -----------------------------------------------------------------------


def test_upper_case_suffix_and_the_same_path_twice(tmp_path):
    frames = make_frames(seed=12, num_files=2)
    root = str(tmp_path / "u")
    paths = write_parquet(frames, root)
    os.rename(paths[1], os.path.join(root, "part-0001.PARQUET"))
    ds = WindowDataset(root, series="sid", **KW)
    assert len(ds.partitions) == 2 and ds.num_windows == len(oracle_starts(frames, "sid", 4))
    with pytest.raises(ConfigError, match=r"part-0000.parquet is given 2 times.*remove the repeats"):
        WindowDataset([paths[0], paths[0]], series="sid", **KW)


def test_resume_rejects_swapped_or_rewritten_same_shape_files(tmp_path):
    first = make_frames(seed=13, num_files=1, num_series=4)[0]
    second = first.copy()  # same shape, same series, other values
    second["f1"] = -second["f1"]
    frames = [first, second]
    root = str(tmp_path / "s")
    paths = write_parquet(frames, root)
    kw = dict(KW, series="sid", batch_size=4)
    ds = WindowDataset(root, **kw)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    tmp = paths[0] + ".tmp"
    os.rename(paths[0], tmp)
    os.rename(paths[1], paths[0])
    os.rename(tmp, paths[1])
    swapped = WindowDataset(root, **kw)
    with pytest.raises(ConfigError, match=r"files: .* in the state"):
        swapped.load_state_dict(state)
    # a file rewritten while a dataset reads it: the read names it instead of yielding other rows
    frame = frames[0].copy()
    frame["f0"] += 1
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), paths[0])
    with pytest.raises(
        SourceReadError, match=r"part-0000.parquet changed after the dataset was opened.*open the dataset again"
    ):
        _batches(swapped)


def test_string_and_list_feature_columns_rejected_at_open(tmp_path):
    frame = make_frames(seed=14, num_files=1)[0]
    frame["name"] = frame["sid"].astype(str)
    frame["vec"] = [[1.0, 2.0]] * len(frame)
    root = str(tmp_path / "t")
    write_parquet([frame], root)
    for col, kind in (("name", "(large_)?string"), ("vec", "list")):
        with pytest.raises(SchemaError, match=rf"feature '{col}' of .*part-0000.parquet is {kind}.*not a number"):
            WindowDataset(root, features=["f0", col], series="sid", window=4)


def test_split_at_sub_day_on_a_date32_column(tmp_path):
    import datetime

    n = 48
    days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=int(d)) for d in np.arange(n) // 4]
    frame = pd.DataFrame({"sid": np.zeros(n, np.int64), "f0": np.arange(n, dtype=np.float32), "day": days})
    root = str(tmp_path / "d")
    table = pa.Table.from_pandas(frame, preserve_index=False).cast(
        pa.schema([("sid", pa.int64()), ("f0", pa.float32()), ("day", pa.date32())])
    )
    os.makedirs(root)
    pq.write_table(table, os.path.join(root, "part-0.parquet"))
    ds = WindowDataset(root, features=["f0"], series="sid", window=2, return_index=True, shuffle=False)
    train, valid = ds.split(at="2024-01-05T12:00", time="day")
    # rows of 2024-01-05 (16..19) are before noon-of-the-5th's cut only if cut to the day: they must be train
    first_valid = int(min(np.concatenate([b[-1].numpy() for b in valid])))
    last_train = int(max(np.concatenate([b[-1].numpy() for b in train])))
    assert first_valid == 20 and last_train == 18  # a train window (2 rows) ends before the cut row 20


def test_numpy_ints_world_size_and_storage_options(tmp_path):
    root = str(tmp_path / "n")
    frames = make_frames(seed=15, num_files=2)
    write_parquet(frames, root)
    ds = WindowDataset(
        root,
        features=["f0"],
        series="sid",
        window=np.int64(2),
        stride=np.int32(1),
        batch_size=np.int64(8),
        seed=np.uint16(3),
    )
    assert ds.spec.window == 2 and type(ds.spec.window) is int
    with pytest.raises(ConfigError, match=r"world_size=\d+ is larger than the [\d,]+ windows.*use fewer ranks"):
        len(WindowDataset(root, features=["f0"], series="sid", window=2, rank=0, world_size=10**6))
    with pytest.raises(TypeError, match=r"storage_options='anon' must be a dict.*\{'anon': True\}"):
        WindowDataset(root, features=["f0"], series="sid", window=2, storage_options="anon")


def test_permission_denied_is_never_skipped(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    root = str(tmp_path / "p")
    paths = write_parquet(make_frames(seed=16, num_files=2), root)
    os.chmod(paths[1], 0)
    try:
        with pytest.raises(SourceReadError, match=r"part-0001.parquet.*access was denied.*never skipped"):
            WindowDataset(root, series="sid", on_error="skip", **KW)
    finally:
        os.chmod(paths[1], 0o644)


def test_deadline_bounds_a_call_and_retries_within_it():
    import time

    from dask_windows.sources.retry import DeadlineExceeded, RetryPolicy, with_deadline

    policy = RetryPolicy(retries=100, base_delay=0.001, timeout=0.5)
    with pytest.raises(DeadlineExceeded):
        policy.call(lambda: time.sleep(30), "s3://b/stalled")
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    assert policy.call(flaky, "s3://b/k") == "ok" and len(calls) == 3
    assert with_deadline(RetryPolicy(), None).timeout == 60.0 and with_deadline(RetryPolicy(), 5).open_timeout == 10
    for bad in (0, -1, True, "5"):
        with pytest.raises(ConfigError, match="timeout"):
            with_deadline(RetryPolicy(), bad)


@pytest.mark.parametrize("numbers", [[0, 0, 1], np.array([0, 0, 1])], ids=["list", "array (from an index)"])
def test_the_type_check_names_the_file_of_each_distinct_schema(numbers):
    """Files share schema objects (``_schemas`` are the distinct ones, ``_schema_numbers`` each file's):
    a text column is reported in the first file whose schema has it, not in the file at the schema's
    position in the list (the sources check that the column has one type first, so this is the check alone)."""
    import types

    import pyarrow as pa

    from dask_windows.opening.checks import check_column_types

    files = types.SimpleNamespace(
        files=["a.parquet", "b.parquet", "c.parquet"],
        _schemas=[pa.schema([("f", pa.float64())]), pa.schema([("f", pa.string())])],
        _schema_numbers=numbers,
    )
    with pytest.raises(SchemaError, match=r"feature 'f' of c\.parquet is string, not a number"):
        check_column_types(files, ["f"], {"f": "feature"})
