"""convert and the manifest: exact round trips, file cuts at series boundaries, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.cli.convert import convert, plan_files
from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.sources.manifest import MANIFEST_NAME, read_manifest, series_runs, write_manifest


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def shuffled_frame(seed: int = 0, num_series: int = 12, max_len: int = 400) -> pd.DataFrame:
    """Series of random lengths, rows shuffled, a few (series, time) ties."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, num_series)
    sid = np.repeat([f"s{i:02d}" for i in range(num_series)], lengths)
    ts = np.concatenate([rng.permutation(n) for n in lengths]).astype(np.int64)
    tie = np.arange(0, len(ts) - 1, 97)
    ts[tie] = ts[tie + 1]  # a few equal (series, time) pairs
    frame = pd.DataFrame(
        {
            "sid": sid,
            "ts": ts,
            "a": rng.standard_normal(len(sid)),
            "b": rng.integers(-5, 5, len(sid)),
            "c": rng.random(len(sid)) < 0.5,
        }
    )
    frame["order"] = np.arange(len(frame))
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def expected(frame: pd.DataFrame) -> pd.DataFrame:
    """What convert must write: sorted by (series, time), ties in input order."""
    return frame.sort_values(["sid", "ts"], kind="stable").reset_index(drop=True)


def read_back(dst: str, columns: list | None = None) -> pd.DataFrame:
    """The rows in canonical order (the spread layout's overlap rows counted once)."""
    from dask_windows.cli.layout import read_converted

    return read_converted(dst, columns)


def check_manifest(dst: str, series: str = "sid") -> dict:
    manifest = json.load(open(os.path.join(dst, MANIFEST_NAME)))
    names = sorted(n for n in os.listdir(dst) if n.endswith(".parquet"))
    assert [f["path"] for f in manifest["files"]] == names
    for f in manifest["files"]:
        path = os.path.join(dst, f["path"])
        assert pq.ParquetFile(path).metadata.num_row_groups == 1
        values = pq.read_table(path, columns=[series]).column(0).to_numpy()
        assert f["rows"] == len(values) and f["bytes"] == os.path.getsize(path)
        if manifest["version"] == 1:
            assert f["runs"] == series_runs(values)
        else:  # spread layout: runs are chunk pieces, each of one series value
            assert sum(r[1] for r in f["runs"]) == len(values)
            for start, n, value, _, _ in f["runs"]:
                assert (values[start : start + n] == value).all()
    return manifest


@pytest.mark.parametrize("size", ["3KB", "1MB"])
def test_parquet_round_trip_is_exact_and_cut_at_series(tmp_path, size):
    frame = shuffled_frame()
    src = tmp_path / "in"
    src.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(frame)), 3)):
        frame.iloc[part].to_parquet(src / f"p{i}.parquet", index=False)
    report = convert(
        [str(src)], str(tmp_path / "out"), series="sid", time="ts", partition_size=size, layout="contiguous"
    )
    out = read_back(str(tmp_path / "out"))
    pd.testing.assert_frame_equal(out, expected(frame), check_dtype=False)
    manifest = check_manifest(str(tmp_path / "out"))
    assert report.rows_in == report.rows_out == len(frame)
    assert report.files == len(manifest["files"])
    # a series is in several files only when it is longer than one file's rows
    where: dict = {}
    for i, f in enumerate(manifest["files"]):
        for _, n, value in f["runs"]:
            where.setdefault(value, []).append(i)
    biggest = max(f["rows"] for f in manifest["files"])
    for value, files in where.items():
        rows = int((frame["sid"] == value).sum())
        assert files == list(range(files[0], files[0] + len(files)))
        if rows <= biggest // 2:
            assert len(files) == 1, value
    assert (report.split_series > 0) == (size == "3KB")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_files_of_data_that_compresses_well_hold_at_most_four_partition_sizes_in_memory(tmp_path):
    """--partition-size counts bytes on disk; 40 zero channels compress about 100x, and a file of
    them still holds at most CONVERT_DECODED_RATIO x partition_size of decoded rows."""
    from dask_windows.settings.tuning import CONVERT_DECODED_RATIO

    n = 60_000
    frame = pd.DataFrame({"sid": np.repeat(np.arange(3), n // 3), "ts": np.tile(np.arange(n // 3), 3)})
    frame["x"] = np.random.default_rng(0).standard_normal(n)
    for i in range(40):
        frame[f"z{i}"] = np.float32(0)
    frame.to_parquet(tmp_path / "in.parquet", index=False)
    row_bytes = 8 + 8 + 8 + 40 * 4
    report = convert(
        [str(tmp_path / "in.parquet")],
        str(tmp_path / "out"),
        series="sid",
        time="ts",
        partition_size="64KB",
        layout="contiguous",
    )
    manifest = check_manifest(str(tmp_path / "out"))
    biggest = max(f["rows"] for f in manifest["files"])
    assert biggest * row_bytes <= CONVERT_DECODED_RATIO * 64_000
    assert max(f["bytes"] for f in manifest["files"]) < 64_000  # the disk target alone would allow far more rows
    pd.testing.assert_frame_equal(read_back(str(tmp_path / "out")), frame, check_dtype=False)
    assert report.rows_out == n


def test_csv_npy_and_structured_npy(tmp_path):
    frame = shuffled_frame(seed=1, num_series=4, max_len=50).drop(columns=["c"])
    frame.to_csv(tmp_path / "in.csv", index=False)
    convert([str(tmp_path / "in.csv")], str(tmp_path / "csv"), series="sid", time="ts")
    pd.testing.assert_frame_equal(read_back(str(tmp_path / "csv")), expected(frame), check_dtype=False)

    npy = tmp_path / "npy"
    npy.mkdir()
    arrays = {"b": np.arange(12.0).reshape(6, 2), "a": -np.arange(8.0).reshape(4, 2)}
    np.save(npy / "a.npy", arrays["a"])
    np.save(npy / "b.npy", np.asfortranarray(arrays["b"]))  # column-major files work too
    convert(
        [str(npy)], str(tmp_path / "npy_out"), series="sensor", time="t", npy_columns=["x", "y"], input_block_size=16
    )
    out = read_back(str(tmp_path / "npy_out"))
    assert list(out.columns) == ["sensor", "t", "x", "y"]
    assert out["sensor"].tolist() == ["a"] * 4 + ["b"] * 6
    np.testing.assert_array_equal(out[["x", "y"]].to_numpy(), np.concatenate([arrays["a"], arrays["b"]]))
    np.testing.assert_array_equal(out["t"], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5])

    rec = np.zeros(5, dtype=[("id", "i4"), ("time", "f8"), ("v", "f4")])
    rec["id"], rec["time"], rec["v"] = [2, 1, 2, 1, 1], [3.0, 2.0, 1.0, 1.0, 0.5], np.arange(5)
    np.save(tmp_path / "rec.npy", rec)
    convert([str(tmp_path / "rec.npy")], str(tmp_path / "rec"), series="id", time="time")
    out = read_back(str(tmp_path / "rec"))
    assert out["v"].tolist() == [4, 3, 1, 2, 0]


def test_avro_round_trip_with_nulls_and_timestamps(tmp_path):
    fastavro = pytest.importorskip("fastavro")
    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "Row",
            "fields": [
                {"name": "sid", "type": "long"},
                {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                {"name": "x", "type": ["null", "double"]},
                {"name": "n", "type": ["null", "long"]},
                {"name": "tag", "type": "string"},
            ],
        }
    )
    rng = np.random.default_rng(3)
    records = []
    for i in range(300):
        records.append(
            {
                "sid": int(rng.integers(0, 4)),
                "tag": f"t{i % 7}",
                "ts": pd.Timestamp("2024-01-01", tz="UTC") + pd.Timedelta(seconds=i),
                "x": None if i % 11 == 0 else float(rng.standard_normal()),
                "n": None if i % 13 == 0 else 2**40 + i,
            }
        )
    for k in range(2):
        with open(tmp_path / f"f{k}.avro", "wb") as out:
            fastavro.writer(out, schema, records[k::2])
    convert([str(tmp_path / "*.avro")], str(tmp_path / "out"), series="sid", time="ts")
    out = read_back(str(tmp_path / "out"))
    want = pd.DataFrame.from_records(records[0::2] + records[1::2])
    want = want.sort_values(["sid", "ts"], kind="stable").reset_index(drop=True)
    assert len(out) == len(want)
    assert out["sid"].tolist() == want["sid"].tolist()
    assert (out["ts"] == pd.to_datetime(want["ts"], utc=True)).all()
    np.testing.assert_array_equal(out["x"].to_numpy(float), want["x"].to_numpy(float))
    assert out["n"].astype("Int64").tolist() == pd.array(want["n"], dtype="Int64").tolist()
    assert out["tag"].tolist() == want["tag"].tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=30), st.integers(1, 40))
def test_plan_files_packs_whole_series_and_splits_only_long_ones(rows, target):
    rows = np.array(rows)
    first, pieces = plan_files(rows, target)
    num_files = int(first[-1] + pieces[-1])
    used = np.zeros(num_files, dtype=int)
    for n, f, k in zip(rows, first, pieces):
        assert k == (1 if n <= target else -(-n // target))
        used[f : f + k] += n if k == 1 else 1
        if k > 1:
            assert f == 0 or first.tolist().count(f) == 1  # a split series has its own files
    assert (used > 0).all()  # no empty file ids
    assert np.all(np.diff(first) >= 0)
    for f in range(num_files):
        members = rows[(first == f) & (pieces == 1)]
        assert members.sum() <= target or len(members) == 0


def test_errors_are_clear_and_leave_nothing_behind(tmp_path):
    frame = pd.DataFrame({"sid": [1, 1, 2], "ts": ["b", "a", "c"], "x": [1.0, 2.0, 3.0]})
    frame.to_parquet(tmp_path / "in.parquet")
    src, dst = [str(tmp_path / "in.parquet")], str(tmp_path / "out")
    with pytest.raises(SchemaError, match="'nope' \\(--series\\) is not in .*pass --series"):
        convert(src, dst, series="nope", time="ts")
    with pytest.raises(SchemaError, match="does not sort as time.*--parse-time"):
        convert(src, dst, series="sid", time="ts")
    with pytest.raises(ConfigError, match="unknown format 'xls'"):
        convert(src, dst, series="sid", time="ts", fmt="xls")
    (tmp_path / "in.txt").write_text("sid,ts\n")
    with pytest.raises(ConfigError, match="cannot tell the format.*--format"):
        convert([str(tmp_path / "in.txt")], dst, series="sid", time="ts")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert([str(tmp_path / "missing.csv")], dst, series="sid", time="ts")
    pd.DataFrame({"sid": [1.0, None], "ts": [1, 2]}).to_parquet(tmp_path / "nul.parquet")
    with pytest.raises(DataError, match="series column 'sid' has 1 null"):
        convert([str(tmp_path / "nul.parquet")], dst, series="sid", time="ts")
    assert sorted(os.listdir(tmp_path)) == ["in.parquet", "in.txt", "nul.parquet"]

    frame["ts"] = ["2024-01-02", "2024-01-01", "2024-01-03"]
    frame.to_parquet(tmp_path / "in.parquet")
    convert(src, dst, series="sid", time="ts", parse_time=True)
    assert read_back(dst)["x"].tolist() == [2.0, 1.0, 3.0]
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert(src, dst, series="sid", time="ts", parse_time=True)
    frame.assign(x=frame["x"] * 10).to_parquet(tmp_path / "in.parquet")
    convert(src, dst, series="sid", time="ts", parse_time=True, overwrite=True)
    assert read_back(dst)["x"].tolist() == [20.0, 10.0, 30.0]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or ".old-" in n]


def test_failure_midway_removes_the_temporary_folder(tmp_path):
    good = pd.DataFrame({"sid": [1, 2], "ts": [1, 2]})
    good.to_parquet(tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_bytes(open(tmp_path / "a.parquet", "rb").read()[:-20])
    with pytest.raises(Exception):
        convert(
            [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], str(tmp_path / "out"), series="sid", time="ts"
        )
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]

    def failing_compute(label, *collections):
        results = dask.compute(*collections)
        if label.startswith("sorting"):  # after the scratch and some files were written
            raise KeyboardInterrupt
        return results

    with pytest.raises(KeyboardInterrupt):
        convert([str(tmp_path / "a.parquet")], str(tmp_path / "out"), series="sid", time="ts", compute=failing_compute)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]


def test_manifest_write_read_validate(tmp_path):
    import fsspec

    fs = fsspec.filesystem("file")
    files = [
        {
            "path": "part-1.parquet",
            "rows": 3,
            "bytes": 10,
            "footer": "0" * 16,
            "runs": [[0, 2, np.int64(7)], [2, 1, "x"]],
        }
    ]
    assert read_manifest(str(tmp_path), fs) is None
    write_manifest(str(tmp_path), fs, series="s", time="t", files=files)
    manifest = read_manifest(str(tmp_path), fs)
    assert manifest["files"][0]["runs"] == [[0, 2, 7], [2, 1, "x"]]
    assert series_runs(np.array([1, 1, 2, 1])) == [[0, 2, 1], [2, 1, 2], [3, 1, 1]]
    bad = dict(manifest, files=[dict(manifest["files"][0], rows=4)])
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(bad))
    with pytest.raises(DataError, match="runs cover 3 rows, not 4"):
        read_manifest(str(tmp_path), fs)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(dict(manifest, version=9)))
    with pytest.raises(DataError, match="version"):
        read_manifest(str(tmp_path), fs)
    (tmp_path / MANIFEST_NAME).write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        read_manifest(str(tmp_path), fs)


def _worker_baseline_bytes() -> int:
    """RSS of a fresh process holding what a convert worker imports.

    The current RSS (``/proc/self/statm``), not ``ru_maxrss``: Linux keeps the high-water mark
    across ``execve``, so a child of the test process reported the pytest process's own peak
    (torch and all, about twice the imports), which doubled this test's input and its time.
    """
    code = (
        "import os, distributed, dask.dataframe, dask_windows.cli.convert; "
        "print(int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE'))"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout)


def test_larger_than_memory_on_a_local_cluster(tmp_path):
    """A one-worker cluster whose memory limit is below the input size converts it, unharmed.

    The limit is the worker's idle footprint (imports) plus 180 MB, and the input is 10%
    larger than those 180 MB, so the input can never be held in the worker's memory beside what
    the worker itself needs (idle footprint plus input is above the limit, and above dask's
    terminate threshold at 95% of it). An input larger than the whole limit, footprint included,
    only doubled the test's time (about 110 CPU-s, the suite's costliest test). The channels
    hold random bytes: with zeros there (data that compresses 50x) the worker's memory stayed
    above dask's pause threshold after its tasks and the conversion waited for good.
    """
    import shutil

    from distributed import Client, LocalCluster, wait

    baseline = _worker_baseline_bytes()
    limit = baseline + 180 * 2**20
    channels = 96
    dtype = np.dtype([("sid", "i8"), ("ts", "i8"), *[(f"f{i}", "f4") for i in range(channels)]])
    n = int((limit - baseline) * 1.1) // dtype.itemsize
    rng = np.random.default_rng(0)
    rows = np.lib.format.open_memmap(tmp_path / "in.npy", mode="w+", dtype=dtype, shape=(n,))
    checksum, sids = 0.0, np.zeros(40, dtype=np.int64)
    for a in range(0, n, 100_000):  # in chunks: the test process stays small too
        chunk = rows[a : a + 100_000]
        chunk.view(np.uint8).reshape(len(chunk), -1)[:, 16:] = rng.integers(
            0, 255, (len(chunk), 4 * channels), dtype=np.uint8
        )
        chunk["sid"] = rng.integers(0, 40, len(chunk))
        chunk["ts"] = a + rng.permutation(len(chunk))  # unique, shuffled within the chunk
        chunk["f0"] = rng.standard_normal(len(chunk))
        checksum += float(chunk["f0"].astype(np.float64).sum())
        sids += np.bincount(chunk["sid"], minlength=40)
    rows.flush()
    del rows, chunk
    assert baseline + os.path.getsize(tmp_path / "in.npy") > limit
    try:
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, memory_limit=limit, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            pids = client.run(os.getpid)

            def compute(label, *collections):
                futures = client.compute(list(collections))
                # a worker paused at its memory limit for good would hang the suite: fail instead
                wait(futures, timeout=900)
                return tuple(client.gather(futures))

            report = convert(
                [str(tmp_path / "in.npy")],
                str(tmp_path / "out"),
                series="sid",
                time="ts",
                partition_size="6MB",
                input_block_size=4 * 2**20,
                compute=compute,
            )
            assert client.run(os.getpid) == pids  # no worker was killed and restarted
        assert report.rows_out == n and report.series == 40 and report.files > 20
        manifest = check_manifest(str(tmp_path / "out"))
        back = read_back(str(tmp_path / "out"), ["sid", "ts", "f0"])
        assert (np.diff(back["sid"]) >= 0).all()
        same = back["sid"].to_numpy()[1:] == back["sid"].to_numpy()[:-1]
        assert (np.diff(back["ts"].to_numpy())[same] > 0).all()
        np.testing.assert_array_equal(np.bincount(back["sid"]), sids)
        assert back["f0"].astype(np.float64).sum() == pytest.approx(checksum, rel=1e-9)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # about 0.8 GB of test data


@pytest.mark.parametrize("time", ["t", "n"])
def test_long_series_split_on_tz_aware_and_nullable_int_times(tmp_path, time):
    rng = np.random.default_rng(0)
    n = 3000
    frame = pd.DataFrame(
        {
            "s": rng.integers(0, 2, n),
            "x": np.arange(n, dtype=float),
            "t": pd.Timestamp("2024-01-01", tz="Europe/Paris") + pd.to_timedelta(rng.permutation(n), unit="s"),
            "n": pd.array(rng.permutation(n), dtype="Int64"),
        }
    )
    frame.to_parquet(tmp_path / "in.parquet")
    report = convert(
        [str(tmp_path / "in.parquet")],
        str(tmp_path / "out"),
        series="s",
        time=time,
        partition_size="8KB",
        layout="contiguous",
    )
    assert report.split_series == 2 and report.files > 4
    pd.testing.assert_frame_equal(
        read_back(str(tmp_path / "out")), frame.sort_values(["s", time]).reset_index(drop=True), check_dtype=False
    )


@pytest.mark.parametrize("layout", ["spread", "contiguous"])
def test_converting_the_same_input_twice_gives_the_same_bytes(tmp_path, layout):
    src = str(tmp_path / "in.parquet")
    shuffled_frame(seed=5).to_parquet(src, index=False)
    dst = str(tmp_path / "out")

    def written() -> dict:
        return {name: open(os.path.join(dst, name), "rb").read() for name in sorted(os.listdir(dst))}

    convert([src], dst, series="sid", time="ts", partition_size=20_000, layout=layout)
    first = written()
    assert "_dask_windows_index.dwi" in first and len(first) > 3  # several parts, the manifest and the index
    convert([src], dst, series="sid", time="ts", partition_size=20_000, layout=layout, overwrite=True)
    again = written()
    assert sorted(again) == sorted(first)
    assert [name for name in first if first[name] != again[name]] == []


def test_scratch_batches_are_sorted_so_they_compress_like_the_sorted_data(tmp_path):
    import fsspec
    import pyarrow as pa

    from dask_windows.cli.scratch import _scatter

    frame = shuffled_frame(seed=2)
    keys = pd.Index(sorted(frame["sid"].unique()))
    first_file = np.arange(len(keys)) % 3  # series dealt over 3 output files
    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    path, index = _scatter(
        frame, 0, fsspec.filesystem("file"), str(tmp_path), schema, ("sid", "ts", keys, first_file, {})
    )
    with pa.memory_map(path) as src:
        reader = pa.ipc.open_file(src)
        for file_id, batch, rows in index:
            got = reader.get_batch(batch).to_pandas()
            # the oracle: the file's rows of the input, sorted by (series, time), ties in input order
            mine = frame[first_file[keys.get_indexer(frame["sid"])] == file_id]
            want = mine.sort_values(["sid", "ts"], kind="stable").reset_index(drop=True)
            assert rows == len(want)
            pd.testing.assert_frame_equal(got, want)
