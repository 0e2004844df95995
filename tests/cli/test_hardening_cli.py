"""Issue 23, items 10-17: regressions and wrong remedies found by a battery of attacks.

Each test feeds the hostile input the issue names and checks the behaviour
(and, for an error, that the message names the remedy that works) against a
pandas or plain-Python reference.
"""

from __future__ import annotations

import os
import sys
import warnings

import dask
import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.cli.convert import convert
from dask_windows.errors import SchemaError, SourceReadError


@pytest.fixture
def sync_dask():
    with dask.config.set(scheduler="sync"):
        yield


def read_back(dst: str) -> pd.DataFrame:
    from dask_windows.cli.layout import read_converted

    return read_converted(dst)


# ---------------------------------------------------------------- item 10: CSV times per file


def to_csv_parts(root, freqs: list[tuple[str, str]], rows: int = 30) -> pd.DataFrame:
    """One series per file, written by ``DataFrame.to_csv`` from one datetime column."""
    root.mkdir()
    frames = []
    for i, (freq, start) in enumerate(freqs):
        frame = pd.DataFrame(
            {"sid": i, "t": pd.date_range(start, periods=rows, freq=freq), "x": np.arange(rows) * 1.5 + i}
        )
        frame.to_csv(root / f"p{i}.csv", index=False)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


THREE_KINDS = [("D", "2021-03-01"), ("s", "2021-03-01 00:00:00"), ("250ms", "2021-03-01 00:00:00.5")]


@pytest.mark.parametrize("parse_time", [False, True])
def test_convert_unifies_date_second_and_fraction_csv_times(tmp_path, sync_dask, parse_time):
    import pyarrow.csv as pacsv

    frame = to_csv_parts(tmp_path / "in", THREE_KINDS)
    kinds = [str(pacsv.read_csv(tmp_path / "in" / f"p{i}.csv").schema.field("t").type) for i in range(3)]
    assert kinds == ["date32[day]", "timestamp[s]", "timestamp[ns]"]  # the case the issue names
    report = convert([str(tmp_path / "in")], str(tmp_path / "out"), series="sid", time="t", parse_time=parse_time)
    assert report.rows_in == len(frame)
    out = read_back(str(tmp_path / "out"))
    assert pd.api.types.is_datetime64_any_dtype(out["t"])
    pd.testing.assert_series_equal(out["t"].astype("datetime64[ns]"), frame["t"].astype("datetime64[ns]"))
    np.testing.assert_array_equal(out["x"], frame["x"])


def test_time_column_differing_in_kind_advises_the_flag_not_pandas(tmp_path, sync_dask):
    src = tmp_path / "in"
    src.mkdir()
    pd.DataFrame({"sid": [0, 0], "t": [1, 2], "x": [1.0, 2.0]}).to_csv(src / "a.csv", index=False)
    pd.DataFrame({"sid": [1, 1], "t": ["3 Mar 2021", "4 Mar 2021"], "x": [1.0, 2.0]}).to_csv(src / "b.csv", index=False)
    with pytest.raises(SchemaError) as info:
        convert([str(src)], str(tmp_path / "out"), series="sid", time="t")
    assert "--parse-time" in str(info.value) and "in pandas" not in str(info.value)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- item 11: wrong remedies


def test_s3_without_s3fs_says_install_s3fs(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # `import s3fs` raises ImportError
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)  # a loaded class
    with pytest.raises(SourceReadError) as info:
        dw.WindowDataset("s3://bucket/data/", window=4, features=["x"], series="sid")
    message = str(info.value)
    assert "install s3fs (pip install 'dask_windows[s3]')" in message
    assert "corrupt" not in message and "on_error" not in message


@pytest.mark.parametrize("suffix", [".csv", ".avro", ".json"])
def test_other_format_handed_to_parquet_names_convert(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    pd.DataFrame({"sid": [0] * 10, "x": np.arange(10.0)}).to_csv(path, index=False)
    with pytest.raises(SourceReadError) as info:
        dw.WindowDataset(str(path), window=4, features=["x"], series="sid")
    message = str(info.value)
    assert "dask-windows convert" in message and str(path) in message
    assert "corrupt" not in message


def test_window_longer_than_spread_chunks_names_convert_window(tmp_path, sync_dask):
    rows = 4000
    frame = pd.DataFrame(
        {"sid": np.repeat([0, 1], rows), "t": np.tile(np.arange(rows), 2), "x": np.arange(2 * rows, dtype="f4")}
    )
    frame.to_parquet(tmp_path / "in.parquet")
    convert([str(tmp_path / "in.parquet")], str(tmp_path / "out"), series="sid", time="t", window=8, chunk_rows=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the span shortfall warning: its own test
        with pytest.raises(dw.DataError) as info:
            dw.WindowDataset(str(tmp_path / "out"), window=1000, features=["x"], series="sid")
    message = str(info.value)
    assert "--window 1000" in message and "dask-windows convert" in message
    assert f"{rows:,} rows" in message  # the real series length, not a chunk's
    assert "; ;" not in message


# ---------------------------------------------------------------- item 13: inspect rejects NaN as the loader does


def test_inspect_rejects_nan_the_loader_rejects(tmp_path):
    import torch

    from dask_windows.cli.main import main
    from dask_windows.cli.summary import inspect_dataset

    x = np.arange(600.0)
    x[[250, 420]] = [np.nan, np.inf]
    frame = pd.DataFrame({"id": np.repeat([0, 1], 300), "x": x, "y": np.arange(600.0)})
    path = str(tmp_path / "d.parquet")
    frame.to_parquet(path, row_group_size=150)
    window = 10
    with pytest.raises(dw.DataError, match="NaN"):  # the loader, on its first epoch
        for _ in torch.utils.data.DataLoader(
            dw.WindowDataset(path, window=window, features=["x", "y"], series="id"), batch_size=None
        ):
            pass
    with pytest.raises(dw.DataError) as info:
        inspect_dataset(path, series="id", window=window, features=["x", "y"])
    # brute force: windows of each series holding a non-finite x
    bad = 0
    for _, g in frame.groupby("id"):
        v = g["x"].to_numpy()
        bad += sum(not np.isfinite(v[s : s + window]).all() for s in range(len(v) - window + 1))
    assert f"{bad:,} of {2 * (300 - window + 1):,} windows" in str(info.value)
    assert "column 'x'" in str(info.value) and "row 250" in str(info.value)
    dropped = inspect_dataset(path, series="id", window=window, features=["x", "y"], nan="drop")
    assert dropped["windows"] == 2 * (300 - window + 1) - bad
    assert inspect_dataset(path, series="id", window=window, features=["y"])["windows"] == 2 * (300 - window + 1)
    # the CLI names its flag, not the Python keyword
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["inspect", path, "--series", "id", "--window", str(window), "--features", "x", "y"]) == 1
    assert "--nan drop" in err.getvalue() and "nan='drop'" not in err.getvalue()


# ---------------------------------------------------------------- item 17: smaller ones


@pytest.fixture(scope="module")
def small_parquet(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("small") / "d.parquet")
    pd.DataFrame({"id": np.repeat([0, 1], 50), "x": np.arange(100.0), "y": np.arange(100.0)}).to_parquet(path)
    return path


@pytest.mark.parametrize(
    "settings",
    [
        dict(window=2**70),
        dict(window=8, stride=2**70),
        dict(window=8, horizon=2**70, targets=["y"]),
        dict(window=8, partition_bytes=-1),
        dict(window=8, threads=-3),
        dict(window=8, threads=0),
    ],
)
def test_out_of_range_settings_raise_config_error(small_parquet, settings):
    name = next(k for k in ("stride", "horizon", "partition_bytes", "threads", "window") if k in settings)
    with pytest.raises(dw.ConfigError, match=name):
        dw.WindowDataset(small_parquet, features=["x"], series="id", **settings)


def test_resume_state_with_bad_world_size_or_batches_is_refused_at_load(small_parquet):
    ds = dw.WindowDataset(small_parquet, features=["x"], series="id", window=8, batch_size=4)
    state = ds.state_dict(batches=3, num_workers=1)
    ds.load_state_dict(dict(state))  # the state as saved loads
    with pytest.raises(dw.ConfigError, match="world_size"):
        ds.load_state_dict(dict(state, world_size="1"))
    whole = -(-ds.num_windows // 4)
    ds.load_state_dict(dict(state, batches=whole))
    for batches in (whole + 1, 10**12):
        with pytest.raises(dw.ConfigError, match="batches"):
            ds.load_state_dict(dict(state, batches=batches))


@pytest.mark.parametrize("weights, total", [((1, 1, 1), 10), ((1, 1, 1), 11), ((1, 1, 2), 10), ((5, 3, 1), 7)])
def test_mix_counts_sum_to_windows_per_epoch(small_parquet, weights, total):
    members = {
        name: dw.WindowDataset(small_parquet, features=["x"], series="id", window=4, batch_size=4) for name in "abc"
    }
    mixture = dw.mix(members, weights=dict(zip("abc", weights)), windows_per_epoch=total)
    assert int(mixture.counts.sum()) == mixture.num_windows == total
    share = np.array(weights) / sum(weights) * total
    assert (np.abs(mixture.counts - share) < 1).all()  # each within one window of its share
    assert sum(len(b[0] if isinstance(b, (tuple, list)) else b) for b in mixture) == total


def test_stats_with_a_vanishing_std_is_refused_naming_the_feature(tmp_path):
    import json

    from dask_windows.runtime.normalize import load_stats

    stats = {"a": {"mean": 0.0, "std": 1.0}, "b": {"mean": 0.0, "std": 1e-30}}
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    with pytest.raises(dw.DataError, match="'b'"):
        load_stats(str(path), ["a", "b"])
    stats["b"] = {"mean": 1e6, "std": 1e-12}  # below float64's resolution at 1e6 (1.2e-10)
    path.write_text(json.dumps(stats))
    with pytest.raises(dw.DataError, match="'b'"):
        load_stats(str(path), ["a", "b"])
    stats["b"] = {"mean": 1e-6, "std": 1e-9}  # small data, legitimately small std
    path.write_text(json.dumps(stats))
    np.testing.assert_allclose(load_stats(str(path), ["a", "b"])[1], [1.0, 1e-9])
    stats["b"] = {"mean": 5.0, "std": 0.0}  # constant: only centred, as before
    path.write_text(json.dumps(stats))
    assert load_stats(str(path), ["a", "b"])[1][1] == 0


def test_no_windows_message_has_no_empty_clause(tmp_path):
    path = str(tmp_path / "d.parquet")
    pd.DataFrame({"id": np.repeat([0, 1, 0], 20), "x": np.arange(60.0)}).to_parquet(path)  # not grouped
    for series in ("id", None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(dw.DataError) as info:
                dw.WindowDataset(path, features=["x"], series=series, window=500)
        assert "; ;" not in str(info.value) and ";;" not in str(info.value)


def test_cli_names_flags_not_keywords():
    from dask_windows.cli.options import _cli_message

    text = "clean the data, or pass nan='drop' to leave them out, or on_error='skip'"
    assert _cli_message(text) == "clean the data, or pass --nan drop to leave them out, or --on-error skip"


def test_tsai_example_gives_the_pinned_install_recipe():
    import ast
    import pathlib

    source = (pathlib.Path(os.path.dirname(__file__)).parent.parent / "examples" / "tsai_mvp.py").read_text()
    assert "pip install -c constraints.txt tsai" in source
    texts = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    for text in texts:  # never a bare `pip install tsai`
        assert "pip install tsai" not in text


def test_example_default_folders_are_ignored_by_git():
    import pathlib
    import re
    import shutil
    import subprocess

    root = pathlib.Path(os.path.dirname(__file__)).parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    defaults = []
    for path in sorted((root / "examples").glob("*.py")):
        found = re.findall(r'"--(?:data|out)",\s*default="([^"]+)"', path.read_text())
        defaults += [(path.name, d) for d in found]
    assert len(defaults) >= 5
    for name, folder in defaults:
        done = subprocess.run(["git", "check-ignore", "-q", f"{folder}/x.parquet"], cwd=root)
        assert done.returncode == 0, f"{name} writes {folder}/ by default, which git does not ignore"


# ---------------------------------------------------------------- item 14: convert's report of the spread layout


def test_convert_report_counts_split_series_and_overlap_rows_from_the_files(tmp_path, sync_dask):
    import glob

    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    lengths = [300] * 6 + [40, 5]  # none longer than a file, but dealt over the files in chunks
    frame = pd.DataFrame(
        {
            "sid": np.repeat(np.arange(len(lengths)), lengths),
            "t": np.concatenate([np.arange(n) for n in lengths]),
            "x": rng.standard_normal(sum(lengths)),
        }
    )
    frame.to_parquet(tmp_path / "in.parquet")
    report = convert(
        [str(tmp_path / "in.parquet")],
        str(tmp_path / "out"),
        series="sid",
        time="t",
        partition_size=20000,
        window=16,
        chunk_rows=40,
    )
    files = sorted(glob.glob(str(tmp_path / "out" / "*.parquet")))
    assert len(files) >= 2
    held = [set(pq.read_table(f, columns=["sid"]).column(0).to_pylist()) for f in files]
    split = sum(sum(s in h for h in held) > 1 for s in range(len(lengths)))
    stored = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert split >= 2 and stored > len(frame)  # the case: series dealt over files, with overlap rows
    assert report.split_series == split
    assert report.rows_out == report.rows_in == len(frame)  # each input row once
    assert report.rows_stored == stored and report.overlap_rows == stored - len(frame)


# ---------------------------------------------------------------- item 15: footer statistics as a check


def test_value_outside_footer_statistics_raises_without_page_crcs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    x = rng.random(400)  # in [0, 1)
    path = tmp_path / "d.parquet"
    table = pa.table({"id": np.repeat([0, 1], 200), "x": x})
    pq.write_table(table, path, compression="none", use_dictionary=False, row_group_size=100)
    data = bytearray(path.read_bytes())
    target = 250  # row group 2
    at = bytes(data).find(np.float64(x[target]).tobytes())
    assert at > 0
    data[at + 7] ^= 0x80  # the sign bit: a negative value, below every value the footer counted
    path.write_bytes(bytes(data))
    damaged = pq.read_table(path).column("x").to_numpy()
    assert not (0 <= damaged[target] < 1)  # the read itself succeeds: nothing but the values tells
    ds = dw.WindowDataset(str(path), window=8, features=["x"], series="id", batch_size=32, shuffle=False)
    with pytest.raises(SourceReadError) as info:
        for _ in ds:
            pass
    message = str(info.value)
    assert "column 'x' of row group 2" in message and "outside the footer's" in message and str(path) in message
    folder = tmp_path / "two"
    folder.mkdir()
    path.rename(folder / "a.parquet")  # the damaged file beside a clean one
    pq.write_table(pa.table({"id": np.repeat([2, 3], 200), "x": x}), folder / "b.parquet", row_group_size=100)
    skipping = dw.WindowDataset(str(folder), window=8, features=["x"], series="id", on_error="skip", shuffle=False)
    with pytest.warns(dw.SkippedPartitionWarning, match="outside the footer"):
        got = np.concatenate([np.asarray(b)[:, 0, :].ravel() for b in skipping])
    assert ((got >= 0) & (got < 1)).all()  # the damaged rows left out, no wrong value yielded
