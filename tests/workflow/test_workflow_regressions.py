"""Workflows that gave wrong data with no error (issue 34, items 5-7), each against pandas.

* A fit on ``dask-windows convert``'s spread layout counted the overlap rows (stored twice at
  chunk cuts) twice: statsmodels' fertility, 11,826 rows, was fitted on 14,588.
* Calendar fields shifted by the zone's offset when the time zone of a timestamp column
  differed between the fit and the data.
* ``FillMissing(mask=True)`` counted its own look-back twice, and messages quoted the window
  plus the look-back instead of the window asked for.
"""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd

from dask_windows import WindowDataset
from dask_windows.cli.convert import convert
from dask_windows.errors import DataError, SchemaError
from dask_windows.omissions import ShortSeriesWarning
from dask_windows.workflow import FillMissing, Lag, Normalize, TimeFeatures, Workflow


def fertility_long() -> pd.DataFrame:
    """statsmodels' fertility (219 countries x 54 years, wide) as one row per country and year, nulls kept."""
    wide = smd.fertility.load_pandas().data
    years = [c for c in wide.columns if c.isdigit()]
    frame = wide.melt(id_vars=["Country Code"], value_vars=years, var_name="year", value_name="rate")
    frame["year"] = frame["year"].astype(np.int64)
    return frame.rename(columns={"Country Code": "country"})


@pytest.mark.parametrize("chunk_rows", [20, None])
def test_fit_on_converted_spread_data_counts_each_row_once(tmp_path, chunk_rows):
    frame = fertility_long()
    raw = tmp_path / "raw.parquet"
    frame.sample(frac=1.0, random_state=0).to_parquet(raw, index=False)
    with dask.config.set(scheduler="sync"):
        convert([str(raw)], str(tmp_path / "conv"), series="country", time="year", partition_size="40KB",
                chunk_rows=chunk_rows, window=8)  # fmt: skip
    wf = Workflow([Normalize(["rate"], per_series=True)], series="country", continuous=["rate"])
    wf.fit(str(tmp_path / "conv"), scheduler="sync")
    assert wf.fit_report.rows == len(frame) == 11_826
    want = frame.groupby("country")["rate"].agg(["mean", "std"])
    got = pd.DataFrame(wf.ops[0].state["rate"]["series"], index=wf.series_keys, columns=["mean", "std"])
    assert list(got.index) == sorted(want.index)
    np.testing.assert_allclose(got["mean"], want["mean"].reindex(got.index), rtol=1e-12, equal_nan=True)
    std = want["std"].reindex(got.index)
    std = std.where(np.isfinite(std) & (std > 0), 1.0)  # the workflow's scale of an undefined spread
    np.testing.assert_allclose(got["std"], std, rtol=1e-9)
    glob = wf.ops[0].state["rate"]["global"]
    assert glob[0] == pytest.approx(frame["rate"].mean(), rel=1e-12)
    assert glob[1] == pytest.approx(frame["rate"].std(), rel=1e-12)


def hourly(tz: str | None) -> pd.DataFrame:
    n = 24 * 9
    stamps = pd.date_range("2024-01-01", periods=n, freq="h", tz=tz)
    return pd.DataFrame({"s": "a", "t": stamps, "x": np.arange(n, dtype=np.float64)})


def calendar_workflow() -> Workflow:
    return Workflow([TimeFeatures("t", ["dayofweek", "hour"])], series="s", continuous=["t_dayofweek", "t_hour", "x"])


@pytest.mark.parametrize("fit_tz,data_tz", [("Asia/Tokyo", None), (None, "Asia/Tokyo")])
@pytest.mark.parametrize("where", ["parquet", "frame"])
def test_time_zone_differing_between_fit_and_data_is_refused(tmp_path, fit_tz, data_tz, where):
    hourly(fit_tz).to_parquet(tmp_path / "fit.parquet", index=False)
    hourly(data_tz).to_parquet(tmp_path / "data.parquet", index=False)
    wf = calendar_workflow().fit(str(tmp_path / "fit.parquet"), scheduler="sync")
    data = str(tmp_path / "data.parquet") if where == "parquet" else hourly(data_tz)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # other files than fitted on
        with pytest.raises(SchemaError, match=r"TimeFeatures column 't'.*(tz_localize|refit)"):
            WindowDataset(data, workflow=wf, series="s", window=4)


@pytest.mark.parametrize("tz", [None, "Asia/Tokyo"])
def test_calendar_fields_equal_pandas_when_the_zone_matches(tmp_path, tz):
    frame = hourly(tz)
    frame.to_parquet(tmp_path / "d.parquet", index=False)
    wf = calendar_workflow().fit(str(tmp_path / "d.parquet"), scheduler="sync")
    ds = WindowDataset(str(tmp_path / "d.parquet"), workflow=wf, window=1, shuffle=False, batch_size=len(frame),
                       return_index=True)  # fmt: skip
    x, rows = next(iter(ds))
    rows = rows.numpy()
    np.testing.assert_array_equal(x[:, 0, 0].numpy(), frame["t"].dt.day_of_week.to_numpy()[rows])
    np.testing.assert_array_equal(x[:, 1, 0].numpy(), frame["t"].dt.hour.to_numpy()[rows])


def gappy(n: int = 40) -> pd.DataFrame:
    x = np.arange(n, dtype=np.float64)
    x[[5, 6, 17]] = np.nan
    return pd.DataFrame({"s": 0, "x": x})


def test_fill_mask_does_not_double_the_lookback():
    wf = Workflow([FillMissing(["x"], method="ffill", limit=3, mask=True)], series="s", continuous=["x", "x_observed"])
    assert wf.lookback() == 3
    assert wf.lookback(["x_observed"]) == 0
    frame = gappy()
    wf.fit(frame, scheduler="sync")
    ds = WindowDataset(frame, workflow=wf, series="s", window=4, shuffle=False, batch_size=1000, return_index=True)
    x, rows = next(iter(ds))
    assert len(rows) == len(frame) - 4 - 3 + 1  # the first 3 starts lost to the look-back, not 6
    filled = frame["x"].ffill(limit=3).to_numpy()
    observed = frame["x"].notna().to_numpy(np.float32)
    starts = rows.numpy()
    np.testing.assert_array_equal(x[:, 0, :].numpy(), filled[starts[:, None] + np.arange(4)])
    np.testing.assert_array_equal(x[:, 1, :].numpy(), observed[starts[:, None] + np.arange(4)])


def test_messages_quote_the_window_asked_for_not_the_lookback_added():
    wf = Workflow([Lag("x", [3])], series="s", continuous=["x", "x_lag3"], target=["x"])
    frame = pd.concat([gappy(40).fillna(0.0), pd.DataFrame({"s": 1, "x": np.zeros(8)})], ignore_index=True)
    wf.fit(frame, scheduler="sync")
    with pytest.warns(ShortSeriesWarning, match=r"window=5 \+ horizon=2 \+ 3 look-back rows of the workflow = 10"):
        WindowDataset(frame, workflow=wf, series="s", window=5, horizon=2)
    with pytest.raises(DataError, match=r"no windows: window=40 \+ 3 look-back rows of the workflow = 43 rows"):
        WindowDataset(frame, workflow=wf, series="s", window=40)
