"""inspect and stats: counts equal WindowDataset's, statistics equal numpy's."""

from __future__ import annotations

import json
import os

import dask
import fsspec
import numpy as np
import pandas as pd
import pytest
from helpers import collect, make_frames, oracle_starts, write_parquet

import dask_windows as dw
from dask_windows.cli.convert import convert
from dask_windows.cli.summary import (
    compute_stats,
    inspect_dataset,
    loader_memory,
    manifest_windows,
)
from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError
from dask_windows.runtime.normalize import load_stats
from dask_windows.sources.manifest import MANIFEST_NAME, write_manifest


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The same rows as a plain multi-file dataset (series span files) and converted."""
    root = tmp_path_factory.mktemp("summary")
    frames = make_frames(seed=5, num_files=4, num_series=9, max_len=120)
    write_parquet(frames, str(root / "plain"), row_group_size=50)
    with dask.config.set(scheduler="sync"):
        convert(
            [str(root / "plain")], str(root / "converted"), series="sid", time="ts", partition_size="6KB", window=44
        )  # chunks overlap for the longest window tested
    return {"plain": str(root / "plain"), "converted": str(root / "converted")}


def _yielded(ds) -> int:
    """Windows the loader really yields in one epoch."""
    return sum(len(b[0]) for b in collect(ds))


@pytest.mark.parametrize("kind", ["plain", "converted"])
@pytest.mark.parametrize("window,stride,horizon", [(1, 1, 0), (8, 1, 0), (8, 3, 2), (30, 5, 4), (44, 2, 0)])
def test_inspect_counts_equal_window_dataset(datasets, kind, window, stride, horizon):
    path = datasets[kind]
    options = {"partition_bytes": 2_000} if kind == "plain" else {}
    targets = ["y"] if horizon else None
    report = inspect_dataset(
        path, series="sid", window=window, stride=stride, horizon=horizon, targets=targets, **options
    )
    ds = dw.WindowDataset(
        path,
        features=["f0", "f1"],
        targets=targets,
        series="sid",
        window=window,
        stride=stride,
        horizon=horizon,
        **options,
    )
    assert report["windows"] == ds.num_windows == _yielded(ds)
    if kind == "plain":  # partition_bytes cuts files at row groups; windows crossing a cut are kept
        frames = [pd.read_parquet(p) for p in ds.source.files]
        assert report["windows"] == len(oracle_starts(frames, "sid", window, stride, horizon))
    assert report["partitions"] == len(ds.partitions)
    assert report["rows"] == sum(p.num_rows for p in ds.partitions)
    assert report["series"] == 9
    assert report["runs_from"] == ("manifest" if kind == "converted" else "series column")


def test_inspect_without_series_counts_whole_partitions(datasets):
    report = inspect_dataset(datasets["plain"], window=16)
    ds = dw.WindowDataset(datasets["plain"], features=["f0"], window=16)
    assert report["windows"] == ds.num_windows and report["series"] is None
    frames = [pd.read_parquet(p) for p in ds.source.files]
    assert report["windows"] == len(oracle_starts(frames, None, 16))


@pytest.mark.parametrize("window", [1, 6, 20])
def test_inspect_nan_drop_counts_what_the_loader_yields(tmp_path, window):
    frames = make_frames(seed=8, num_files=3, num_series=6, max_len=90)
    rng = np.random.default_rng(1)
    for frame in frames:
        frame.loc[rng.choice(len(frame), 4, replace=False), "f1"] = np.nan
    write_parquet(frames, str(tmp_path))
    with pytest.raises(DataError, match="NaN"):  # nan="raise" meets them while iterating
        collect(dw.WindowDataset(str(tmp_path), features=["f0", "f1"], series="sid", window=window, batch_size=1000))
    kept = inspect_dataset(str(tmp_path), series="sid", window=window, features=["f0", "f1"], nan="drop")
    ds = dw.WindowDataset(str(tmp_path), features=["f0", "f1"], series="sid", window=window, nan="drop")
    assert kept["windows"] == ds.num_windows == _yielded(ds)
    every = len(oracle_starts(frames, "sid", window))
    assert every > kept["windows"]
    with pytest.raises(DataError) as info:  # nan="raise": inspect rejects what the loader rejects (issue 23)
        inspect_dataset(str(tmp_path), series="sid", window=window, features=["f0", "f1"])
    assert f"{every - kept['windows']:,} of {every:,} windows hold NaN" in str(info.value)
    assert "column 'f1'" in str(info.value)


def test_inspect_on_error_skip_counts_the_readable_files(datasets, tmp_path):
    import shutil

    shutil.copytree(datasets["plain"], tmp_path / "d")
    files = sorted(os.listdir(tmp_path / "d"))
    (tmp_path / "d" / files[1]).write_bytes(b"not parquet at all")
    with pytest.raises(SourceReadError, match="on_error='skip'"):
        inspect_dataset(str(tmp_path / "d"), series="sid", window=8)
    report = inspect_dataset(str(tmp_path / "d"), series="sid", window=8, on_error="skip")
    ds = dw.WindowDataset(str(tmp_path / "d"), features=["f0"], series="sid", window=8, on_error="skip")
    good = [pd.read_parquet(tmp_path / "d" / f) for f in files if f != files[1]]
    assert report["windows"] == ds.num_windows == len(oracle_starts(good, "sid", 8))
    assert report["skipped"] == [s.name for s in ds.skipped] and len(report["skipped"]) == 1


def test_inspect_takes_the_runs_from_the_manifest(tmp_path):
    """With a manifest the loader (and so inspect) trusts its runs: the series column is not read."""
    # the loader checks a manifest against each file's size and footer statistics (docs/checks.md),
    # so the manifest here is an honest one: its runs are taken without reading the series column
    pd.DataFrame({"s": np.repeat([0, 1], 50), "t": np.arange(100), "x": np.ones(100)}).to_parquet(
        tmp_path / "part-00000.parquet"
    )
    files = [
        {
            "path": "part-00000.parquet",
            "rows": 100,
            "bytes": os.path.getsize(tmp_path / "part-00000.parquet"),
            "runs": [[0, 50, 0], [50, 50, 1]],
        }
    ]
    write_manifest(str(tmp_path), fsspec.filesystem("file"), series="s", time="t", files=files)
    report = inspect_dataset(str(tmp_path), window=10, stride=1)
    ds = dw.WindowDataset(str(tmp_path), features=["x"], series="s", window=10)
    assert report["windows"] == ds.num_windows == 2 * 41
    assert report["runs_from"] == "manifest" and report["series"] == 2
    assert report["features"] == ["x"]  # series and time are not default features


def test_inspect_validates_with_the_loader(datasets):
    path = datasets["converted"]
    cases = [
        ({"features": ["f0", "e"]}, SchemaError, "feature 'e' is missing"),
        ({"features": ["f0", "sid"]}, ConfigError, "series='sid' is also a feature"),
        ({"batch_size": 0}, ConfigError, "batch_size=0 must be >= 1"),
        ({"horizon": 2}, ConfigError, "horizon=2 needs targets"),
        ({"nan": "keep"}, ConfigError, "nan='keep' must be one of"),
        ({"window": 500}, DataError, "longer than every series run .*longest: 11[0-9] rows"),
    ]
    for kwargs, error, message in cases:
        options = {"window": 8, **kwargs}
        with pytest.raises(error, match=message):
            inspect_dataset(path, **options)
        with pytest.raises(error, match=message):
            dw.WindowDataset(path, **{"features": ["f0"], "series": "sid", **options})


def test_inspect_ignores_a_stale_manifest(datasets, tmp_path, caplog):
    import shutil

    path = tmp_path / "copy"
    shutil.copytree(datasets["converted"], path)
    first = sorted(p for p in os.listdir(path) if p.endswith(".parquet"))[0]
    os.remove(path / first)
    # A spread dataset's chunks are known only from its manifest: no silent fall back to a scan.
    with pytest.raises(DataError, match="not there.*rerun `dask-windows convert`"):
        inspect_dataset(str(path), series="sid", window=4)
    assert "lists other files" in caplog.text
    shutil.rmtree(path)
    shutil.copytree(datasets["plain"], path)  # a version-1 manifest that went stale is ignored
    shutil.copy(os.path.join(datasets["converted"], MANIFEST_NAME), path / MANIFEST_NAME)
    manifest = json.load(open(path / MANIFEST_NAME))
    manifest.update(version=1, files=[dict(f, runs=[r[:3] for r in f["runs"]]) for f in manifest["files"]])
    del manifest["span"], manifest["layout"]
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = inspect_dataset(str(path), series="sid", window=4)
    assert report["runs_from"] == "series column"


def test_loader_memory_grows_with_partitions_not_dataset():
    small = loader_memory(1000, 900, 4, 1, 64, 0, 32)
    more = loader_memory(1000, 900, 4, 1, 64, 0, 32, buffer_partitions=4)
    workers = loader_memory(1000, 900, 4, 1, 64, 0, 32, num_workers=3)
    assert more["partitions"] > small["partitions"]
    assert workers["total"] == 3 * workers["per_process"]


def test_stats_match_numpy_and_load(tmp_path):
    rng = np.random.default_rng(0)
    n = 5_000
    frame = pd.DataFrame(
        {
            "sid": rng.integers(0, 3, n),
            "ts": np.arange(n),
            "a": 1e9 + rng.standard_normal(n),  # cancels in a naive sum of squares
            "b": rng.integers(-100, 100, n).astype(np.int64),
            "c": rng.standard_normal(n).astype(np.float32),
            "d": np.full(n, np.nan),
        }
    )
    frame.loc[rng.choice(n, 300, replace=False), "c"] = np.nan
    for i, rows in enumerate(np.array_split(np.arange(n), 4)):
        frame.iloc[rows].to_parquet(tmp_path / f"p{i}.parquet")
    doc = compute_stats(str(tmp_path), ["a", "b", "c", "d"])
    assert doc["format"] == "dask_windows.stats" and doc["version"] == 1 and doc["rows"] == n
    for name in "abc":
        values = frame[name].to_numpy(np.float64)
        ok = values[~np.isnan(values)]
        got = doc["features"][name]
        assert got["count"] == len(ok) and got["nan_count"] == n - len(ok)
        assert got["mean"] == pytest.approx(ok.mean(), rel=1e-12, abs=1e-9)
        assert got["std"] == pytest.approx(ok.std(), rel=1e-9)
        assert (got["min"], got["max"]) == (ok.min(), ok.max())
    assert doc["features"]["d"] == {"count": 0, "mean": None, "std": None, "min": None, "max": None, "nan_count": n}
    with pytest.raises(ConfigError, match="no manifest.*an integer series id.*--series"):
        compute_stats(str(tmp_path))  # sid is an int: it would pass for a feature
    everything = compute_stats(str(tmp_path), series="sid", time="ts")
    assert set(everything["features"]) == {"a", "b", "c", "d"}
    assert set(compute_stats(str(tmp_path), series="sid")["features"]) == {"ts", "a", "b", "c", "d"}
    with pytest.raises(ConfigError, match="series='sid' is also a feature"):
        compute_stats(str(tmp_path), ["a", "sid"], series="sid")

    (tmp_path / "stats.json").write_text(json.dumps(doc))
    mean, std = load_stats(str(tmp_path / "stats.json"), ["c", "a"])
    assert mean.dtype == np.float32 and mean.shape == (2,)
    np.testing.assert_allclose(std, [doc["features"]["c"]["std"], doc["features"]["a"]["std"]], rtol=1e-6)
    assert load_stats(doc, ["b"])[0][0] == np.float32(doc["features"]["b"]["mean"])
    with pytest.raises(SchemaError, match="no mean/std for feature 'zz'.*dask-windows stats"):
        load_stats(doc, ["a", "zz"])
    with pytest.raises(SchemaError, match="'d'"):
        load_stats(doc, ["d"])
    with pytest.raises(DataError, match="not a dask_windows stats file"):
        load_stats({"format": "other", "features": {}}, ["a"])


def test_stats_skip_manifest_series_and_time(datasets):
    doc = compute_stats(datasets["converted"])
    assert "sid" not in doc["features"] and "ts" not in doc["features"]
    files = json.load(open(os.path.join(datasets["converted"], MANIFEST_NAME)))["files"]
    assert doc["rows"] == sum(run[4] for f in files for run in f["runs"])  # owned rows: each row once
    with pytest.raises(SchemaError, match="feature 'nope' is missing from"):
        compute_stats(datasets["converted"], ["nope"])


def test_manifest_windows_counts_what_file_cuts_lose():
    manifest = {
        "files": [
            {"runs": [[0, 10, "a"], [10, 30, "b"]]},
            {"runs": [[0, 20, "b"], [20, 5, "c"]]},
            {"runs": [[0, 12, "c"]]},
        ]
    }
    # as runs: a 10, b 30 + 20, c 5 + 12; whole series: a 10, b 50, c 17
    assert manifest_windows(manifest, 8) == (3 + 23 + 13 + 0 + 5, (3 + 43 + 10) - 44)
    assert manifest_windows(manifest, 8, stride=4, horizon=2) == (1 + 6 + 3 + 0 + 1, (1 + 11 + 2) - 11)
