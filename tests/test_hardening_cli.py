"""Issue 23, items 10-17: regressions and wrong remedies found by a battery of attacks.

Each test feeds the hostile input the issue names and checks the behaviour
(and, for an error, that the message names the remedy that works) against a
pandas or plain-Python reference.
"""

from __future__ import annotations

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
    pd.DataFrame({"sid": [1, 1], "t": ["3 Mar 2021", "4 Mar 2021"], "x": [1.0, 2.0]}).to_csv(
        src / "b.csv", index=False
    )
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
