"""Issue 23's data cases: no part rewritten, cache entry exchanged, in-memory dtype or short series slips through.

Each test builds the hostile state on small data and checks the error (naming the file, column or
setting and the remedy) or the counted warning, against what the data holds.
"""

from __future__ import annotations

import json
import os

import dask
import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.cli.convert import convert
from dask_windows.sources.manifest import MANIFEST_NAME


@pytest.fixture
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


# -- item 2: a converted part rewritten with the same row count ---------------------------------------


def _converted(tmp_path) -> tuple[str, list]:
    n = 3000
    frame = pd.DataFrame({"sid": np.repeat([0, 1, 2], n), "ts": np.tile(np.arange(n), 3)})
    frame["v"] = (frame["sid"] * 10_000 + frame["ts"]).astype(np.float64)
    src = tmp_path / "in"
    src.mkdir()
    frame.sample(frac=1.0, random_state=0).to_parquet(src / "p.parquet", index=False)
    out = str(tmp_path / "out")
    convert([str(src)], out, series="sid", time="ts", partition_size="20KB", window=8)
    parts = sorted(p for p in os.listdir(out) if p.endswith(".parquet"))
    return out, parts


@pytest.mark.usefixtures("_sync_scheduler")
def test_a_spread_part_rewritten_with_the_same_rows_raises(tmp_path):
    out, parts = _converted(tmp_path)
    assert len(parts) >= 3
    dw.WindowDataset(out, ["v"], series="sid", window=8)  # opens as converted
    path = os.path.join(out, parts[1])
    part = pd.read_parquet(path)
    part.iloc[::-1].to_parquet(path, index=False)  # same rows, same row count, other order
    assert len(pd.read_parquet(path)) == len(part)
    with pytest.raises(
        dw.DataError, match=rf"{parts[1]} does not match the manifest.*bytes.*rerun `dask-windows convert`"
    ):
        dw.WindowDataset(out, ["v"], series="sid", window=8)
    # the same size as recorded (the manifest's byte count set to today's): the footer still tells
    manifest_path = os.path.join(out, MANIFEST_NAME)
    manifest = json.load(open(manifest_path))
    entry = next(f for f in manifest["files"] if f["path"] == parts[1])
    entry["bytes"] = os.path.getsize(path)
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(dw.DataError, match=rf"{parts[1]} .*its Parquet footer differs.*rerun `dask-windows convert`"):
        dw.WindowDataset(out, ["v"], series="sid", window=8)
    # a manifest written before footers were recorded keeps the size check only (and opens)
    del entry["footer"]
    json.dump(manifest, open(manifest_path, "w"))
    dw.WindowDataset(out, ["v"], series="sid", window=8)


# -- items 3 and 5: the cache keeps to its own folder; an entry holds the bytes of its own key ----------


def _store(blob: bytes):
    """A "remote object" as a fetch callable over ``blob``, counting the ranges it was asked for."""
    asked = []

    def fetch(ranges):
        asked.extend(ranges)
        return [blob[a:b] for a, b in ranges]

    return fetch, asked


def test_cache_dir_never_touches_the_users_files(tmp_path):
    from dask_windows.sources.cache import OWN_FOLDER, RangeCache

    folder = tmp_path / "models"
    folder.mkdir()
    # files named like the entries and temporary files of 0.2's cache, older than anything it writes
    mine = {"weights.bin": b"w" * 5000, ".tmp-notes": b"draft", "0" * 40 + ".bin": b"x" * 300}
    for name, data in mine.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (1, 1))
    blob = bytes(range(256)) * 40
    cache = RangeCache(folder, max_bytes=700)  # a budget far below the user's files: evicts on every store
    fetch, asked = _store(blob)
    for start in range(0, 8000, 500):
        assert bytes(cache.fetch("s3://b/o", "v1", [(start, start + 500)], fetch)[0]) == blob[start : start + 500]
    assert {name: (folder / name).read_bytes() for name in mine} == mine  # all there, unchanged
    assert sorted(os.listdir(folder)) == sorted([*mine, OWN_FOLDER])
    assert 0 < cache.disk_bytes() <= 700
    # a folder of the cache's name holding someone else's files is refused, not emptied
    other = tmp_path / "other"
    (other / OWN_FOLDER).mkdir(parents=True)
    (other / OWN_FOLDER / "a.bin").write_bytes(b"mine")
    with pytest.raises(dw.ConfigError, match=rf"{OWN_FOLDER} holds files dask_windows did not write.*'a.bin'"):
        RangeCache(other, max_bytes=10)
    assert (other / OWN_FOLDER / "a.bin").read_bytes() == b"mine"


def test_cache_dir_with_user_files_through_a_dataset(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    frames = [pd.DataFrame({"f0": np.arange(400, dtype=np.float32) + 1000 * i}) for i in range(3)]
    for i, frame in enumerate(frames):
        with fs.open(f"/harden-cache/part-{i}.parquet", "wb") as f:
            frame.to_parquet(f, row_group_size=50)
    (tmp_path / "model.bin").write_bytes(b"weights")
    (tmp_path / ".tmp-upload").write_bytes(b"half")
    kw = dict(features=["f0"], window=8, batch_size=64, return_index=True, seed=3)
    plain = [b[-1].tolist() for b in dw.WindowDataset("memory://harden-cache/", **kw)]
    cached = dw.WindowDataset("memory://harden-cache/", cache_dir=str(tmp_path), cache_bytes=2000, **kw)
    for _ in range(2):
        cached.set_epoch(0)
        assert [b[-1].tolist() for b in cached] == plain
    assert (tmp_path / "model.bin").read_bytes() == b"weights"
    assert (tmp_path / ".tmp-upload").read_bytes() == b"half"


def test_exchanged_cache_entries_are_misses_not_values(tmp_path):
    from dask_windows.sources.cache import RangeCache

    blob = bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))
    cache = RangeCache(tmp_path)
    fetch, asked = _store(blob)
    ranges = [(0, 1000), (1000, 2000), (2000, 3000)]
    assert [bytes(b) for b in cache.fetch("s3://b/o", "v1", ranges, fetch)] == [blob[a:b] for a, b in ranges]
    first, second = cache.path_of("s3://b/o", "v1", ranges[0]), cache.path_of("s3://b/o", "v1", ranges[1])
    a, b = open(first, "rb").read(), open(second, "rb").read()
    assert len(a) == len(b) and a != b
    open(first, "wb").write(b)  # the two entries exchanged: each whole, with its own CRC, under the other's key
    open(second, "wb").write(a)
    asked.clear()
    assert [bytes(b) for b in cache.fetch("s3://b/o", "v1", ranges, fetch)] == [blob[a:b] for a, b in ranges]
    assert asked == ranges[:2]  # both fetched again; the third was served from disk
    # an entry copied under the key of the same range of another object is a miss too
    other = cache.path_of("s3://b/other", "v1", ranges[2])
    open(other, "wb").write(open(cache.path_of("s3://b/o", "v1", ranges[2]), "rb").read())
    fetch_other, asked_other = _store(bytes(3000))
    assert bytes(cache.fetch("s3://b/other", "v1", [ranges[2]], fetch_other)[0]) == bytes(1000)
    assert asked_other == [ranges[2]]


# -- item 4: tables in memory get the schema checks files get ------------------------------------------


def _table_kinds(frame: pd.DataFrame) -> dict:
    import pyarrow as pa

    kinds = {"pandas": frame, "pyarrow": pa.Table.from_pandas(frame, preserve_index=False)}
    try:
        import polars as pl

        kinds["polars"] = pl.from_pandas(frame)
    except ImportError:
        pass
    return kinds


@pytest.mark.parametrize("column", ["when", "label"])
def test_tables_in_memory_refuse_a_datetime_or_string_feature_at_open(column):
    frame = pd.DataFrame(
        {
            "sid": np.repeat([0, 1], 50),
            "x": np.arange(100, dtype=np.float32),
            "when": pd.date_range("2024-01-01", periods=100, freq="min"),
            "label": [f"s{i % 7}" for i in range(100)],
        }
    )
    kind = "timestamp" if column == "when" else "(large_)?string"
    remedy = "convert it to numbers first" if column == "when" else "encode it as numbers"
    for name, table in _table_kinds(frame).items():
        with pytest.raises(dw.SchemaError, match=rf"feature '{column}' of .* is {kind}.*not a number; .*{remedy}"):
            dw.WindowDataset(table, features=["x", column], series="sid", window=4)
        with pytest.raises(dw.SchemaError, match=rf"target '{column}' of .* is {kind}"):
            dw.WindowDataset(table, features=["x"], targets=[column], series="sid", window=4)
        # numeric columns open as before, and a series id may be any type
        assert dw.WindowDataset(table, features=["x"], series="sid", window=4, batch_size=8).num_windows == 94, name
        by_label = table.sort_values(["label"], kind="stable") if name == "pandas" else None
        if by_label is not None:
            assert dw.WindowDataset(by_label, features=["x"], series="label", window=4).num_windows == 100 - 7 * 3


def test_a_dask_frame_refuses_a_datetime_or_string_feature_at_open():
    import dask.dataframe as dd

    frame = pd.DataFrame(
        {
            "sid": np.repeat([0, 1], 50),
            "x": np.arange(100, dtype=np.float32),
            "when": pd.date_range("2024-01-01", periods=100, freq="min"),
            "label": [f"s{i % 7}" for i in range(100)],
        }
    )
    ddf = dd.from_pandas(frame, npartitions=2)
    with pytest.raises(
        dw.SchemaError, match=r"feature 'when' of .* is datetime64.*not a number; .*convert it to numbers"
    ):
        dw.WindowDataset(ddf, features=["x", "when"], series="sid", window=4)
    with pytest.raises(dw.SchemaError, match=r"target 'label' of .* not a number; .*encode it as numbers"):
        dw.WindowDataset(ddf, features=["x"], targets=["label"], series="sid", window=4)
    assert dw.WindowDataset(ddf, features=["x"], series="sid", window=4).num_windows == 94


# -- item 6: what opening leaves out is counted and warned about -------------------------------------------


def test_series_shorter_than_the_window_are_counted_and_warned_once(tmp_path):
    from dask_windows.opening.omissions import ShortSeriesWarning

    rng = np.random.default_rng(11)
    lengths = [[1000, 20], [63, 64, 5, 300], [1, 200]]  # per file; window 60 + horizon 4 = span 64
    frames, sid = [], 0
    for f, per_file in enumerate(lengths):
        sids = np.repeat(np.arange(sid, sid + len(per_file)), per_file)
        sid += len(per_file)
        frames.append(pd.DataFrame({"sid": sids, "x": rng.normal(size=len(sids)), "y": rng.normal(size=len(sids))}))
        frames[-1].to_parquet(tmp_path / f"part-{f}.parquet", index=False, row_group_size=128)
    span = 64
    short = [n for per_file in lengths for n in per_file if n < span]  # the oracle: per series in its file
    with pytest.warns(ShortSeriesWarning) as caught:
        ds = dw.WindowDataset(str(tmp_path), ["x"], targets=["y"], series="sid", window=60, horizon=4)
    shorts = [w for w in caught if issubclass(w.category, ShortSeriesWarning)]
    assert len(shorts) == 1
    assert f"{len(short)} series" in str(shorts[0].message) and f"{sum(short)} rows are left out" in str(
        shorts[0].message
    )
    assert (ds.left_out.runs, ds.left_out.rows) == (len(short), sum(short))
    kept = sum(max(0, n - span + 1) for per_file in lengths for n in per_file)
    assert ds.num_windows == kept
    # the same counts with partitions cut inside files (halo rows read past a cut are not counted twice)
    with pytest.warns(ShortSeriesWarning):
        cut = dw.WindowDataset(
            str(tmp_path), ["x"], targets=["y"], series="sid", window=60, horizon=4, partition_bytes=1
        )
    assert len(cut.partitions) > len(lengths)
    assert (cut.left_out.runs, cut.left_out.rows, cut.num_windows) == (len(short), sum(short), kept)
    # nothing to say when every series is long enough
    with warnings_as_errors(ShortSeriesWarning):
        fine = dw.WindowDataset(str(tmp_path), ["x"], series="sid", window=1)
    assert fine.left_out.runs == 0


def warnings_as_errors(category):
    import warnings

    class _Ctx:
        def __enter__(self):
            self._c = warnings.catch_warnings()
            self._c.__enter__()
            warnings.simplefilter("error", category)

        def __exit__(self, *exc):
            return self._c.__exit__(*exc)

    return _Ctx()


def test_a_likely_series_column_not_passed_is_warned_about(tmp_path):
    from dask_windows.opening.omissions import SeriesColumnWarning

    n = 400
    frame = pd.DataFrame({"sensor_id": np.repeat([7, 3, 9, 1], n // 4), "x": np.arange(n, dtype=np.float32)})
    frame.to_parquet(tmp_path / "multi.parquet", index=False)
    with pytest.warns(
        SeriesColumnWarning, match=r"'sensor_id' that looks like a series id \(4 runs.*series='sensor_id'"
    ):
        crossing = dw.WindowDataset(str(tmp_path / "multi.parquet"), ["x"], window=16)
    assert crossing.num_windows == n - 15  # windows across series: what the warning is about
    passed = dw.WindowDataset(str(tmp_path / "multi.parquet"), ["x"], series="sensor_id", window=16)
    assert passed.num_windows == 4 * (n // 4 - 15)
    with warnings_as_errors(SeriesColumnWarning):  # explicit one-series, a single series, a row id: no warning
        dw.WindowDataset(str(tmp_path / "multi.parquet"), ["x"], series=None, window=16)
        frame.assign(sensor_id=5).to_parquet(tmp_path / "one.parquet", index=False)
        dw.WindowDataset(str(tmp_path / "one.parquet"), ["x"], window=16)
        frame.rename(columns={"sensor_id": "id"}).assign(id=np.arange(n)).to_parquet(tmp_path / "rows.parquet")
        dw.WindowDataset(str(tmp_path / "rows.parquet"), ["x"], window=16)
        frame.rename(columns={"sensor_id": "valid"}).to_parquet(tmp_path / "named.parquet")  # not an id word
        dw.WindowDataset(str(tmp_path / "named.parquet"), ["x"], window=16)
    # pandas frames are checked the same way
    with pytest.warns(SeriesColumnWarning, match="'sensor_id'"):
        dw.WindowDataset(frame, ["x"], window=16)


def test_inspect_reports_the_series_left_out(tmp_path):
    from dask_windows.cli.summary import inspect_dataset

    frame = pd.DataFrame({"sid": np.repeat([0, 1], [1000, 20]), "x": np.arange(1020, dtype=np.float32)})
    frame.to_parquet(tmp_path / "part-0.parquet", index=False)
    with pytest.warns(UserWarning, match="1 series"):
        report = inspect_dataset(str(tmp_path), series="sid", window=64, features=["x"])
    assert report["left_out"] == {"runs": 1, "rows": 20}
    assert report["windows"] == 1000 - 63  # the 937 windows of the issue, the 20 rows counted


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("dask_windows.runtime.telemetry", "_READS"),
        ("dask_windows.speedups.slots", "_mapped_lock"),
        ("dask_windows.passes.workerwatch", "_watched_lock"),
        ("dask_windows.sources.parquet.opening", "_SCHEMAS_LOCK"),
    ],
)
def test_a_worker_forked_while_a_thread_holds_a_module_lock_can_take_it(module, name):
    """A reader thread inside one of the package's locks when a DataLoader worker forks: only the forking
    thread lives on in the child, so the child's copy of the lock would stay held forever."""
    import importlib

    from helpers import exit_code_forked_while_held

    lock = getattr(importlib.import_module(module), name)
    code = exit_code_forked_while_held(lock, _take_lock_in_child, (module, name))
    assert code == 0, f"{module}.{name} stayed held in the forked child"


def _take_lock_in_child(module, name):
    import importlib

    lock = getattr(importlib.import_module(module), name)
    raise SystemExit(0 if lock.acquire(timeout=5) else 3)
