"""Workflows against a pandas reference on real packaged data (statsmodels' co2 and grunfeld).

The reference is written here with pandas alone (groupby per series, the fitted statistics
recomputed the pandas way), and every yielded window is compared with it: the same window
start rows as a brute-force grid and the same values, at strides 1 and 3, with a horizon,
with NaN, through DataLoader workers, on two ranks and after a mid-epoch resume.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows import WindowDataset
from dask_windows.workflow import (
    Categorify,
    Clip,
    Difference,
    FillMissing,
    Function,
    Lag,
    Log1p,
    Normalize,
    Statics,
    TimeFeatures,
    Workflow,
    invert_target,
)

SEASONS = np.array(["winter", "spring", "summer", "autumn"])


def co2_frame() -> pd.DataFrame:
    """Weekly Mauna Loa CO2 (59 missing weeks), one series per decade, two categories."""
    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    df["season"] = SEASONS[(df["date"].dt.month.to_numpy() % 12) // 3]
    df["site"] = np.where(df["date"].dt.isocalendar().week.to_numpy() % 5 == 0, "flask", "insitu")
    return df


def co2_workflow(limit: int = 3) -> Workflow:
    return Workflow(
        [
            FillMissing(["co2"], method="ffill", limit=limit, mask=True),
            Lag("co2", [1, 2]),
            Difference("co2", 1),
            Normalize(["co2"], per_series=True),
            Categorify(["season", "site"]),
            TimeFeatures("date", ["month", "dayofweek"], cyclic=True),
            TimeFeatures("date", ["year"]),
        ],
        series="decade",
        continuous=[
            "co2",
            "co2_observed",
            "co2_lag1",
            "co2_lag2",
            "co2_diff1",
            "date_month_sin",
            "date_month_cos",
            "date_year",
        ],
        categorical=["season", "site"],
        target=["co2"],
        known=["date_month_sin", "date_month_cos", "season"],
    )


def co2_reference(df: pd.DataFrame, limit: int = 3) -> pd.DataFrame:
    """The co2 workflow in pandas: groupby per decade, statistics and vocabularies recomputed here."""
    out = pd.DataFrame(index=df.index)
    g = df.groupby("decade", sort=False)["co2"]
    out["co2_observed"] = df["co2"].notna().astype(float)
    filled = g.ffill(limit=limit)
    fg = filled.groupby(df["decade"])
    out["co2_lag1"], out["co2_lag2"] = fg.shift(1), fg.shift(2)
    out["co2_diff1"] = fg.diff(1)
    mean, std = fg.transform("mean"), fg.transform("std")
    out["co2"] = (filled - mean) / std
    for col in ("season", "site"):
        vocab = sorted(df[col].unique())
        out[col] = df[col].map({v: i + 2 for i, v in enumerate(vocab)})
    month, dow = df["date"].dt.month, df["date"].dt.dayofweek
    out["date_month_sin"], out["date_month_cos"] = (
        np.sin(2 * np.pi * (month - 1) / 12),
        np.cos(2 * np.pi * (month - 1) / 12),
    )
    out["date_year"] = df["date"].dt.year.astype(float)
    del dow
    return out


@pytest.fixture(scope="module")
def co2(tmp_path_factory):
    root = tmp_path_factory.mktemp("co2")
    df = co2_frame()
    df.to_parquet(root / "co2.parquet", row_group_size=128, index=False)
    wf = co2_workflow().fit(str(root), scheduler="sync")
    return root, df, wf, co2_reference(df)


def oracle(df: pd.DataFrame, series: str, window: int, horizon: int, stride: int, lookback: int) -> np.ndarray:
    """Window start rows: per series from ``lookback``, every ``stride`` rows, whole window and horizon inside."""
    starts = []
    for _, rows in df.groupby(series, sort=False).indices.items():
        n = len(rows)
        starts += [rows[0] + p for p in range(lookback, n - window - horizon + 1, stride)]
    return np.array(sorted(starts))


def take(frame: pd.DataFrame, cols: list, starts: np.ndarray, length: int, offset: int = 0) -> np.ndarray:
    """``(B, C, length)`` values of ``cols`` from row ``start + offset`` of each window."""
    values = frame[cols].to_numpy(np.float64)
    rows = starts[:, None] + offset + np.arange(length)[None, :]  # (B, length)
    return values[rows].transpose(0, 2, 1)


def gather(batches: list) -> dict:
    """Named batches joined and put in start-row order."""
    joined = {k: np.concatenate([b[k].numpy() for b in batches]) for k in batches[0]}
    order = np.argsort(joined["index"])
    return {k: v[order] for k, v in joined.items()}


@pytest.mark.parametrize("stride,horizon", [(1, 0), (3, 4)])
def test_tuple_windows_equal_the_pandas_reference(co2, stride, horizon):
    root, df, wf, ref = co2
    window = 12
    ds = WindowDataset(str(root), workflow=wf, window=window, horizon=horizon, stride=stride, batch_size=64,
                       return_index=True, nan="drop", seed=1)  # fmt: skip
    xs, ys, idx = zip(*ds)
    x, y, index = (np.concatenate([t.numpy() for t in part]) for part in (xs, ys, idx))
    order = np.argsort(index)
    x, y, index = x[order], y[order], index[order]
    want = oracle(df, "decade", window, horizon, stride, wf.lookback())
    # Windows holding a NaN the fill left (a gap longer than the limit) are dropped (nan="drop"), in
    # their lookback rows too, except the first lookback rows of a series (lags before its start).
    feats = list(wf.continuous) + list(wf.categorical)
    bad = ref[[*feats, "co2"]].isna().any(axis=1).to_numpy().copy()
    bad[df.groupby("decade").cumcount().to_numpy() < wf.lookback()] = False
    span = window + wf.lookback() + horizon
    clean = np.array([not bad[s - wf.lookback() : s + window + horizon].any() for s in want])
    assert clean.sum() < len(want)  # the real data's gaps are long enough to drop some windows
    np.testing.assert_array_equal(index, want[clean])
    np.testing.assert_allclose(x, take(ref, feats, index, window), rtol=2e-6, atol=2e-6)
    if horizon:
        np.testing.assert_allclose(y, take(ref, ["co2"], index, horizon, window), rtol=2e-6, atol=2e-6)
    else:
        np.testing.assert_allclose(y, ref[["co2"]].to_numpy()[index + window - 1], rtol=2e-6, atol=2e-6)
    assert span > window


def test_named_batches_equal_the_reference_through_two_workers(co2):
    root, df, wf, ref = co2
    window, horizon = 10, 3
    ds = WindowDataset(str(root), workflow=wf.named(index=True), window=window, horizon=horizon, stride=2,
                       batch_size=50, nan="drop")  # fmt: skip
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = gather(list(loader))
    index = got["index"]
    assert len(index) == len(np.unique(index)) > 100
    np.testing.assert_allclose(got["past_cont"], take(ref, list(wf.continuous), index, window), rtol=2e-6, atol=2e-6)
    assert got["past_cat"].dtype == np.int64
    np.testing.assert_array_equal(got["past_cat"], take(ref, ["season", "site"], index, window))
    known = take(ref, ["date_month_sin", "date_month_cos"], index, horizon, window)
    np.testing.assert_allclose(got["future_cont"], known, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(got["future_cat"], take(ref, ["season"], index, horizon, window))
    np.testing.assert_allclose(got["target"], take(ref, ["co2"], index, horizon, window), rtol=2e-6, atol=2e-6)
    # The per-window scale inverts the target back to ppm (the forward-filled values).
    filled = df.groupby("decade")["co2"].ffill(limit=3).to_frame()
    units = invert_target(torch.from_numpy(got["target"]), {k: torch.from_numpy(v) for k, v in got.items()})
    np.testing.assert_allclose(units.numpy(), take(filled, ["co2"], index, horizon, window), rtol=1e-6)
    series = np.array(wf.series_keys)[got["series"]]
    np.testing.assert_array_equal(series, df["decade"].to_numpy()[index])


def test_two_ranks_and_a_resume_give_the_same_windows(co2):
    root, _, wf, _ = co2
    kw = dict(workflow=wf.named(index=True), window=8, horizon=2, batch_size=32, nan="drop", seed=5)
    whole = gather(list(WindowDataset(str(root), **kw)))
    ranks = [gather(list(WindowDataset(str(root), rank=r, world_size=2, **kw))) for r in range(2)]
    both = np.concatenate([r["index"] for r in ranks])
    assert len(both) == len(np.unique(both)) >= len(whole["index"]) - 1
    for r in ranks:
        pos = np.searchsorted(whole["index"], r["index"])
        np.testing.assert_array_equal(r["past_cont"], whole["past_cont"][pos])
    ds = WindowDataset(str(root), **kw)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    state = ds.state_dict()
    del it
    again = WindowDataset(str(root), **kw)
    again.load_state_dict(state)
    rest = gather(first + list(again))
    np.testing.assert_array_equal(rest["index"], whole["index"])
    np.testing.assert_array_equal(rest["past_cat"], whole["past_cat"])


def test_save_load_keeps_every_value_and_checks_the_data(co2, tmp_path):
    root, df, wf, _ = co2
    wf.save(str(tmp_path / "wf.json"))
    back = Workflow.load(str(tmp_path / "wf.json"))
    a = wf.transform_frame(df[back.inputs])
    b = back.transform_frame(df[back.inputs])
    pd.testing.assert_frame_equal(a, b)
    # Same columns, other files: a warning; another kind of column: an error naming it.
    other = tmp_path / "other"
    other.mkdir()
    df.iloc[:-7].to_parquet(other / "x.parquet", index=False)
    with pytest.warns(UserWarning, match="fitted on other files"):
        WindowDataset(str(other), workflow=back, window=8, nan="drop")
    bad = tmp_path / "bad"
    bad.mkdir()
    df.assign(season=np.arange(len(df))).to_parquet(bad / "x.parquet", index=False)
    with pytest.raises(KeyError, match="'season'.*number.*fitted on string"):
        WindowDataset(str(bad), workflow=back, window=8, nan="drop")
    doc = (tmp_path / "wf.json").read_text().replace('"version": 2', '"version": 99')
    (tmp_path / "v99.json").write_text(doc)
    with pytest.raises(ValueError, match="version 99"):
        Workflow.load(str(tmp_path / "v99.json"))


GRUNFELD_SECTORS = {
    "General Motors": "auto", "Chrysler": "auto", "General Electric": "electric", "Westinghouse": "electric",
    "US Steel": "steel", "American Steel": "steel", "Atlantic Refining": "oil", "Union Oil": "oil",
    "IBM": "machines", "Goodyear": "rubber", "Diamond Match": "wood",
}  # fmt: skip


def grunfeld() -> tuple[pd.DataFrame, pd.DataFrame]:
    df = smd.grunfeld.load_pandas().data
    df["firm"] = df["firm"].astype(str)
    df["date"] = pd.to_datetime(df["year"].astype(int).astype(str) + "-07-01").dt.tz_localize("America/New_York")
    df["company"] = df["firm"]
    table = pd.DataFrame({"firm": list(GRUNFELD_SECTORS), "sector": list(GRUNFELD_SECTORS.values())})
    table["size"] = table["firm"].map(df.groupby("firm")["capital"].first())
    return df, table


def halve(block: dict) -> dict:
    return {"half_value": block["value"] / 2}


def test_statics_robust_scales_functions_and_a_cluster(tmp_path):
    from distributed import Client, LocalCluster

    df, table = grunfeld()
    df.to_parquet(tmp_path / "g.parquet", index=False, row_group_size=64)
    wf = Workflow(
        [Log1p(["value"]), Clip(["capital"], upper=1000.0), Normalize(["invest"], per_series=True, method="robust"),
         Normalize(["value"]), Categorify(["company"], min_frequency=1),
         TimeFeatures("date", ["year", "month"]), Function(halve, ["value"], ["half_value"])],
        series="firm", continuous=["value", "capital", "half_value", "date_year"], categorical=["company"],
        target=["invest"], known=["date_year"], statics=Statics(table, numeric=["size"], categorical=["sector"]),
    )  # fmt: skip
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False) as cluster, Client(cluster) as client:
        wf.fit(str(tmp_path / "g.parquet"), client=client)
    ds = WindowDataset(str(tmp_path / "g.parquet"), workflow=wf.named(index=True), window=6, horizon=2,
                       batch_size=40)  # fmt: skip
    got = gather(list(ds))
    index = got["index"]
    assert len(index) == 11 * (20 - 6 - 2 + 1)
    ref = pd.DataFrame(index=df.index)
    value = np.log1p(df["value"])
    ref["value"] = (value - value.mean()) / value.std()
    ref["capital"] = df["capital"].clip(upper=1000.0)
    ref["half_value"] = ref["value"] / 2
    ref["date_year"] = df["date"].dt.year.astype(float)
    ref["company"] = df["company"].map({v: i + 2 for i, v in enumerate(sorted(df["company"].unique()))})
    g = df.groupby("firm")["invest"]
    q25, q50, q75 = (g.transform(lambda s, q=q: s.quantile(q)) for q in (0.25, 0.5, 0.75))
    ref["invest"] = (df["invest"] - q50) / (q75 - q25)
    np.testing.assert_allclose(got["past_cont"], take(ref, list(wf.continuous), index, 6), rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(got["past_cat"][:, 0], take(ref, ["company"], index, 6)[:, 0])
    np.testing.assert_allclose(got["target"], take(ref, ["invest"], index, 2, 6), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got["future_cont"], take(ref, ["date_year"], index, 2, 6))
    firm = df["firm"].to_numpy()[index]
    keyed = table.set_index("firm")
    np.testing.assert_allclose(got["static_cont"][:, 0], keyed.loc[firm, "size"].to_numpy(), rtol=1e-6)
    sectors = sorted(table["sector"].unique())
    np.testing.assert_array_equal(got["static_cat"][:, 0], [sectors.index(s) + 2 for s in keyed.loc[firm, "sector"]])
    np.testing.assert_allclose(got["target_loc"][:, 0], q50.to_numpy()[index], rtol=1e-6)
    np.testing.assert_allclose(got["target_scale"][:, 0], (q75 - q25).to_numpy()[index], rtol=1e-6)
    # Time zone respected: July 1st 00:00 New York is still July (it is July 1st 04:00 UTC).
    frame = wf.transform_frame(df[wf.inputs])
    np.testing.assert_array_equal(frame["date_month"], 7.0)
    assert wf.cardinality("company") == 13 and wf.cardinality("sector") == len(sectors) + 2


def test_unseen_series_and_categories(tmp_path):
    df, _ = grunfeld()
    known = df[df["firm"] != "IBM"]
    wf = Workflow([Normalize(["invest"], per_series=True), Categorify(["company"], min_frequency=20)],
                  series="firm", continuous=["invest"], categorical=["company"])  # fmt: skip
    wf.fit(known, scheduler="sync")
    out = wf.transform_frame(df.assign(company=df["company"].where(df.index % 50 != 0)))
    ibm = (df["firm"] == "IBM").to_numpy()
    glob = known["invest"]
    np.testing.assert_allclose(out["invest"][ibm], (df["invest"][ibm] - glob.mean()) / glob.std())
    codes = out["company"].to_numpy()
    assert (codes[ibm & (df.index % 50 != 0)] == 1).all()  # unseen: 1
    assert (codes[df.index % 50 == 0] == 0).all()  # null: 0
    strict = Workflow([Normalize(["invest"], per_series=True, unseen="raise")], series="firm", continuous=["invest"])
    strict.fit(known, scheduler="sync")
    with pytest.raises(KeyError, match="not fitted on"):
        strict.transform_frame(df)


def test_bad_input_names_the_column_and_the_remedy(tmp_path):
    df, table = grunfeld()
    path = tmp_path / "g.parquet"
    df.to_parquet(path, index=False)
    with pytest.raises(KeyError, match="'sales'.*not in"):
        Workflow([Log1p(["sales"])], continuous=["sales"]).fit(str(path), scheduler="sync")
    with pytest.raises(KeyError, match="numbers but column 'company'"):
        Workflow([Log1p(["company"])], continuous=["company"]).fit(str(path), scheduler="sync")
    with pytest.raises(KeyError, match="'year'.*not a timestamp"):
        Workflow([TimeFeatures("year", ["month"])], continuous=["year_month"]).fit(str(path), scheduler="sync")
    dup = pd.concat([table, table.iloc[:2]])
    with pytest.raises(ValueError, match="2 duplicate series ids"):
        Workflow([], series="firm", continuous=["value"], statics=Statics(dup, numeric=["size"])).fit(
            df, scheduler="sync"
        )
    with pytest.raises(ValueError, match="no row for 1 series.*IBM"):
        Workflow([], series="firm", continuous=["value"],
                 statics=Statics(table[table.firm != "IBM"], numeric=["size"])).fit(df, scheduler="sync")  # fmt: skip
    with pytest.raises(ValueError, match="Lag.*longer than every series"):
        Workflow([Lag("value", [25])], series="firm", continuous=["value_lag25"]).fit(df, scheduler="sync")
    with pytest.raises(ValueError, match="limit="):
        FillMissing(["value"], method="ffill")
    with pytest.raises(ValueError, match="not fitted"):
        WindowDataset(str(path), workflow=Workflow([], continuous=["value"]), window=4)
    with pytest.raises(ValueError, match="module level"):
        Function(lambda b: b, ["value"], ["v"])


def test_a_workflow_with_device_mode_is_refused_with_the_remedy(co2):
    root, _, wf, _ = co2
    with pytest.raises(ValueError, match="device=None"):
        WindowDataset(str(root), workflow=wf, window=8, device="cpu")


def test_named_batches_through_device_prefetcher_lightning_and_fastai(co2):
    from dask_windows import DevicePrefetcher
    from dask_windows.integrations.loaders import window_loader  # what WindowDataModule hands Lightning

    root, _, wf, _ = co2
    ds = WindowDataset(str(root), workflow=wf.named(), window=8, horizon=2, batch_size=128, nan="drop", shuffle=False)
    first = next(iter(ds))
    moved = next(iter(DevicePrefetcher(torch.utils.data.DataLoader(ds, batch_size=None), "cpu")))
    assert set(moved) == set(first) and all(torch.equal(moved[k], first[k]) for k in first)
    lightning = next(iter(window_loader(ds, stateful=False)))
    assert all(torch.equal(lightning[k], first[k]) for k in first)


def test_fastai_takes_the_named_batch_as_input_and_its_target_for_the_loss(co2):
    fastai = pytest.importorskip("fastai") and __import__("dask_windows.integrations.fastai").integrations.fastai
    root, _, wf, _ = co2
    ds = WindowDataset(str(root), workflow=wf.named(), window=8, horizon=2, batch_size=128, nan="drop", shuffle=False)
    first = next(iter(ds))
    xb, yb = next(iter(fastai.WindowDL(ds)))
    assert isinstance(xb, dict) and torch.equal(yb, first["target"])


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(-(2**35), 2**35),
    step=st.integers(1, 10**7),
    n=st.integers(1, 300),
    fields=st.lists(st.sampled_from(["year", "month", "day", "dayofweek", "dayofyear", "hour", "minute", "quarter",
                                     "weekofyear"]), min_size=1, unique=True),
    repeats=st.integers(1, 3),
)  # fmt: skip
def test_calendar_arithmetic_equals_pandas(start, step, n, fields, repeats):
    """Per row, and through the table of the span's hours (small steps, series repeating the same hours)."""
    from dask_windows.workflow.ops import _calendar

    seconds = np.tile(start + step * np.arange(n, dtype=np.int64), repeats)
    stamps = pd.DatetimeIndex(seconds.astype("datetime64[s]"))
    names = {"dayofyear": "day_of_year", "dayofweek": "day_of_week"}
    got = _calendar(seconds, fields)
    for field in fields:
        want = stamps.isocalendar().week if field == "weekofyear" else getattr(stamps, names.get(field, field))
        np.testing.assert_array_equal(got[field], np.asarray(want, np.int64), err_msg=field)


def test_elastic_resume_of_named_batches(co2):
    root, _, wf, _ = co2
    kw = dict(workflow=wf.named(index=True), window=8, horizon=2, batch_size=32, nan="drop", seed=5)
    whole = gather(list(WindowDataset(str(root), **kw)))
    first = WindowDataset(str(root), rank=0, world_size=2, **kw)
    taken = [b for _, b in zip(range(4), first)]
    state = first.state_dict()
    other = WindowDataset(str(root), rank=1, world_size=2, **kw)
    taken += [b for _, b in zip(range(4), other)]
    again = WindowDataset(str(root), world_size=1, **kw)  # resumed on one rank: the rest of the epoch
    again.load_state_dict(state)
    rest = list(again)
    assert all(isinstance(b, dict) for b in rest)
    got = gather(taken + rest)
    _, pos = np.unique(got["index"], return_index=True)
    assert len(pos) == len(got["index"]) >= len(whole["index"]) - 1  # every window once (2 ranks: 1 left out)
    keep = np.searchsorted(whole["index"], got["index"])
    np.testing.assert_array_equal(got["past_cat"], whole["past_cat"][keep])
