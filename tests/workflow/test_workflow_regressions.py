"""Workflows that gave wrong data with no error (issue 34, items 5-7), each against pandas.

* A fit on ``dask-windows convert``'s spread layout counted the overlap rows (stored twice at
  chunk cuts) twice: statsmodels' fertility, 11,826 rows, was fitted on 14,588.
* Calendar fields shifted by the zone's offset when the time zone of a timestamp column
  differed between the fit and the data.
* ``FillMissing(mask=True)`` counted its own look-back twice, and messages quoted the window
  plus the look-back instead of the window asked for.
"""

from __future__ import annotations

import json
import warnings

import dask
import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows import WindowDataset
from dask_windows.cli.convert import convert
from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.opening.omissions import ShortSeriesWarning
from dask_windows.workflow import (
    Categorify,
    FillMissing,
    Lag,
    Log1p,
    Normalize,
    TimeFeatures,
    Transform,
    Workflow,
    fill_timesteps,
    invert_target,
)
from dask_windows.workflow.transforms import forward, inverse


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
    glob = wf.ops[0].state["rate"]["global"]
    assert glob[0] == pytest.approx(frame["rate"].mean(), rel=1e-12)
    assert glob[1] == pytest.approx(frame["rate"].std(), rel=1e-12)
    empty = want["mean"].isna().reindex(got.index).to_numpy()  # countries without a value: the global ones
    assert empty.sum() == 9 and (got[empty].to_numpy() == glob).all()
    np.testing.assert_allclose(got["mean"][~empty], want["mean"].reindex(got.index)[~empty], rtol=1e-12)
    std = want["std"].reindex(got.index)[~empty]
    std = std.where(np.isfinite(std) & (std > 0), 1.0)  # the workflow's scale of an undefined spread
    np.testing.assert_allclose(got["std"][~empty], std, rtol=1e-9)


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
        ds = WindowDataset(frame, workflow=wf, series="s", window=5, horizon=2)
    assert "window=5," in repr(ds)
    with pytest.raises(DataError, match=r"no windows: window=40 \+ 3 look-back rows of the workflow = 43 rows"):
        WindowDataset(frame, workflow=wf, series="s", window=40)


def saved(tmp_path) -> tuple[str, pd.DataFrame]:
    frame = pd.DataFrame({"s": np.repeat(["a", "b"], 30), "x": np.arange(60, dtype=np.float64) ** 1.5,
                          "c": np.tile(["u", "v", "w"], 20)})  # fmt: skip
    wf = Workflow([Normalize(["x"], per_series=True), Categorify(["c"])], series="s", continuous=["x"],
                  categorical=["c"])  # fmt: skip
    wf.fit(frame, scheduler="sync").save(str(tmp_path / "wf.json"))
    return str(tmp_path / "wf.json"), frame


def edit(path: str, change) -> str:
    doc = json.loads(open(path).read())
    change(doc)
    out = path.replace(".json", "-edited.json")
    with open(out, "w") as f:
        json.dump(doc, f)
    return out


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["ops"][0]["state"]["x"]["series"][0].__setitem__(1, -1.0),
        lambda d: d["ops"][0]["state"]["x"]["series"][1].__setitem__(1, 1e-30),
        lambda d: d["ops"][1]["state"]["c"].reverse(),
        lambda d: d["series_keys"].pop(),
        lambda d: d["ops"][0]["config"].pop("columns"),
        lambda d: d.pop("roles"),
    ],
    ids=["negative-std", "tiny-std", "vocabulary-order", "series-dropped", "config-field", "roles"],
)
def test_an_edited_saved_workflow_is_refused_naming_the_file(tmp_path, change):
    path, _ = saved(tmp_path)
    Workflow.load(path)  # as saved: fine
    edited = edit(path, change)
    with pytest.raises(ConfigError, match=r"edited.json .*(checksum|refit)"):
        Workflow.load(edited)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["ops"][0]["state"]["x"]["series"][0].__setitem__(1, -1.0),
        lambda d: d["series_keys"].pop(),
        lambda d: d["ops"][0]["config"].pop("columns"),
        lambda d: d["ops"][1].pop("state"),
    ],
    ids=["negative-std", "series-dropped", "config-field", "no-state"],
)
def test_a_broken_workflow_without_checksum_gets_a_clear_error_not_a_bare_one(tmp_path, change):
    path, _ = saved(tmp_path)

    def old_and_broken(doc: dict) -> None:
        doc.pop("checksum")
        doc["version"] = 1  # files of version 1 have no checksum: their fields are still checked
        change(doc)

    with pytest.raises(ConfigError, match=r"edited.json .*refit"):
        Workflow.load(edit(path, old_and_broken))


def test_a_workflow_file_of_a_newer_version_says_to_upgrade(tmp_path):
    path, _ = saved(tmp_path)
    newer = edit(path, lambda d: d.__setitem__("version", 3))
    with pytest.raises(ConfigError, match=r"version 3.*upgrade dask_windows"):
        Workflow.load(newer)


@pytest.mark.parametrize("method", ["standard", "robust"])
def test_fitting_an_all_null_column_is_refused(method):
    frame = pd.DataFrame({"s": np.repeat([0, 1], 10), "x": np.nan, "y": np.arange(20.0)})
    wf = Workflow([Normalize(["x"], method=method)], series="s", continuous=["x", "y"])
    with pytest.raises(DataError, match=r"column 'x' of DataFrame holds no value.*FillMissing"):
        wf.fit(frame, scheduler="sync")


@pytest.mark.parametrize("method", ["standard", "robust"])
def test_a_series_without_values_takes_the_global_statistics(method):
    frame = pd.DataFrame({"s": np.repeat([0, 1], 10), "x": np.r_[np.full(10, np.nan), np.arange(10.0)]})
    wf = Workflow([Normalize(["x"], per_series=True, method=method)], series="s", continuous=["x"])
    state = wf.fit(frame, scheduler="sync").ops[0].state["x"]
    assert state["series"][0] == state["global"]
    assert np.isfinite(state["series"][0]).all()


DOMAINS = {  # values each transform takes back exactly (relu: its predictions are clamped at 0)
    "log": (1e-6, 1e6),
    "log1p": (0.0, 1e6),
    "logit": (1e-6, 1 - 1e-6),
    "softplus": (1e-6, 500.0),
    "relu": (0.0, 1e6),
    "boxcox": (1e-6, 1e6),
}


@pytest.mark.parametrize("name", sorted(DOMAINS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_each_transform_is_undone_exactly_by_its_inverse(name, data):
    lo, hi = DOMAINS[name]
    x = np.array(data.draw(st.lists(st.floats(lo, hi), min_size=1, max_size=20)))
    lmbda = data.draw(st.sampled_from([-0.5, 0.0, 0.3, 1.0])) if name == "boxcox" else None
    y = forward(name, x, lmbda)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(inverse(name, y, lmbda), x, rtol=1e-9, atol=1e-12)
    back = inverse(name, torch.from_numpy(y), lmbda).numpy()  # predictions are tensors
    np.testing.assert_allclose(back, x, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "transform",
    [Log1p(["price"]), *(Transform(["price"], n, 0.25 if n == "boxcox" else None) for n in sorted(DOMAINS))],
    ids=lambda op: getattr(op, "name", "Log1p"),
)
@pytest.mark.parametrize("scale_target", [True, False])
def test_invert_target_undoes_every_target_transform(transform, scale_target):
    rng = np.random.default_rng(0)
    n = 50
    price = rng.uniform(0.05, 0.95, 2 * n) * np.repeat([1.0, 0.9], n)  # in every domain, logit's included
    frame = pd.DataFrame({"s": np.repeat(["a", "b"], n), "price": price, "i": np.arange(2 * n, dtype=np.float64)})
    wf = Workflow([transform, Normalize(["price"], per_series=True)], series="s", continuous=["i"], target=["price"])
    wf.fit(frame, scheduler="sync")
    ds = WindowDataset(frame, workflow=wf.named(scale_target=scale_target), series="s", window=4, horizon=3,
                       batch_size=200, shuffle=False)  # fmt: skip
    b = next(iter(ds))
    starts = b["past_cont"][:, 0, 0].numpy().astype(np.int64)  # "i" is the row
    want = price[starts[:, None] + 4 + np.arange(3)]  # (B, H) the horizon's prices
    got = invert_target(b["target"], b, wf)
    np.testing.assert_allclose(got[:, 0].numpy(), want, rtol=2e-5)
    np.testing.assert_allclose(invert_target(b["target"].numpy(), b, wf.named())[:, 0], want, rtol=2e-5)


def test_a_target_transformed_after_its_scale_is_refused_by_invert_target():
    frame = pd.DataFrame({"s": 0, "y": np.arange(1.0, 41.0)})
    wf = Workflow([Normalize(["y"]), Transform(["y"], "relu")], series="s", target=["y"]).fit(frame, scheduler="sync")
    b = next(iter(WindowDataset(frame, workflow=wf.named(), series="s", window=3, horizon=1, batch_size=4)))
    with pytest.raises(ConfigError, match=r"cannot undo Normalize.*before the Normalize"):
        invert_target(b["target"], b, wf)


def pandas_missing_steps(frame: pd.DataFrame, series: str, time: str, step: float) -> int:
    """The oracle: per series sorted by time, the steps missing between consecutive rows."""
    gaps = frame.sort_values([series, time]).groupby(series)[time].diff().dropna()
    return int((gaps / step - 1).round().clip(lower=0).sum())


@pytest.mark.parametrize("layout", ["frame", "files", "converted"])
def test_missing_time_steps_are_refused_with_their_count(tmp_path, layout):
    frame = fertility_long()
    gappy_frame = frame.drop(index=frame.sample(40, random_state=1).index).reset_index(drop=True)
    want = pandas_missing_steps(gappy_frame, "country", "year", 1.0)
    assert want > 0
    data: object = gappy_frame
    if layout == "files":  # each series cut across files, in order
        (tmp_path / "files").mkdir()
        ordered = gappy_frame.sort_values(["country", "year"])
        for k, part in enumerate(np.array_split(np.arange(len(ordered)), 4)):
            ordered.iloc[part].to_parquet(tmp_path / "files" / f"p{k}.parquet", index=False)
        data = str(tmp_path / "files")
    elif layout == "converted":
        gappy_frame.to_parquet(tmp_path / "raw.parquet", index=False)
        with dask.config.set(scheduler="sync"):
            convert([str(tmp_path / "raw.parquet")], str(tmp_path / "conv"), series="country", time="year",
                    partition_size="40KB", chunk_rows=20, window=4)  # fmt: skip
        data = str(tmp_path / "conv")
    wf = Workflow([Normalize(["rate"])], series="country", continuous=["rate"], time="year")
    with pytest.raises(DataError, match=rf"has {want:,} missing time steps.*'year'.*fill_timesteps"):
        wf.fit(data, scheduler="sync")
    allowed = Workflow([Normalize(["rate"])], series="country", continuous=["rate"], time="year",
                       missing_timesteps="allow").fit(data, scheduler="sync")  # fmt: skip
    assert allowed.timesteps["missing"] == want
    whole = Workflow([Normalize(["rate"])], series="country", continuous=["rate"], time="year")
    whole.fit(frame, scheduler="sync")
    assert whole.timesteps == {"step": 1.0, "missing": 0, "backwards": 0}


def test_filled_time_steps_fit_and_duplicates_are_refused():
    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str)
    gap = df.drop(index=[10, 11, 500])
    filled = fill_timesteps(gap, "decade", "date", "W-SAT")
    assert len(filled) == len(df) and filled["co2"].isna().sum() == gap["co2"].isna().sum() + 3
    wf = Workflow([Normalize(["co2"])], series="decade", continuous=["co2"], time="date", freq="W-SAT")
    assert wf.fit(filled, scheduler="sync").timesteps["missing"] == 0
    with pytest.raises(DataError, match=r"1 time steps of zero or less.*duplicate"):
        wf.fit(pd.concat([df, df.iloc[[5]]]), scheduler="sync")


@pytest.mark.parametrize("tz", [None, "UTC"])
def test_fit_at_counts_only_the_training_period_of_a_split(tmp_path, tz):
    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str)
    if tz:
        df["date"] = df["date"].dt.tz_localize(tz)
    df.to_parquet(tmp_path / "co2.parquet", index=False, row_group_size=300)
    cut = "1985-01-01"
    wf = Workflow([Normalize(["co2"], per_series=True)], series="decade", continuous=["co2"])
    wf.fit(str(tmp_path / "co2.parquet"), at=cut, time="date", scheduler="sync")
    train = df[df["date"] < pd.Timestamp(cut, tz=tz)]
    want = train.groupby("decade")["co2"].agg(["mean", "std"])
    assert wf.series_keys == sorted(want.index) and wf.fit_report.rows == len(train)
    np.testing.assert_allclose(np.array(wf.ops[0].state["co2"]["series"]), want.to_numpy(), rtol=1e-12)
    # The same rows as the split's train part: every train window ends before the cut.
    ds = WindowDataset(str(tmp_path / "co2.parquet"), ["co2"], series="decade", window=8, nan="drop",
                       return_index=True)  # fmt: skip
    part, _ = ds.split(at=cut, time="date")
    rows = np.concatenate([r.numpy() for _, r in part])
    assert df["date"].iloc[rows + 7].max() < pd.Timestamp(cut, tz=tz)


def test_transform_frame_refuses_a_naive_column_fitted_zoned():
    wf = calendar_workflow().fit(hourly("Asia/Tokyo"), scheduler="sync")
    out = wf.transform_frame(hourly("Asia/Tokyo"))
    np.testing.assert_array_equal(out["t_hour"], hourly("Asia/Tokyo")["t"].dt.hour)
    with pytest.raises(SchemaError, match=r"column 't' of the frame is stored naive"):
        wf.transform_frame(hourly(None))
