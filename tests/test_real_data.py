"""Real series (bundled with statsmodels, nothing downloaded) through every source, against an oracle.

The data sets are laid out the ways users have them: one long weekly series (Mauna Loa CO2, with
its 59 missing weeks as NaN) split over files in time order; a multi-channel quarterly panel
(US macro data) with targets; five real series of different lengths and frequencies grouped in
an arbitrary order and cut across files; and the same five interleaved by date, as a long-format
export comes, which only ``dask-windows convert`` makes readable. Every window an epoch yields
(``return_index=True``) is compared with a pandas/numpy brute force: exact values, every valid
window exactly once, ``nan="drop"`` leaving out exactly the windows that touch a NaN.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import cli  # the dask-windows command (in this process)

import dask_windows as dw
from dask_windows.opening.checks import SeriesOrderWarning

sm_datasets = pytest.importorskip("statsmodels.datasets")

MACRO = ["realgdp", "realcons", "realinv", "cpi", "unemp", "infl"]


# --- the real data -------------------------------------------------------------------------------


def co2_frame() -> pd.DataFrame:
    """Weekly CO2 at Mauna Loa, 1958-2001: 2,284 rows, 59 of them NaN (missing weeks)."""
    data = sm_datasets.co2.load_pandas().data
    return pd.DataFrame({"week": data.index.to_numpy(), "co2": data["co2"].to_numpy()})


def macro_frame() -> pd.DataFrame:
    """US quarterly macro data 1959-2009: 203 rows of six real channels."""
    data = sm_datasets.macrodata.load_pandas().data
    month = 3 * data["quarter"].astype(int) - 2
    quarter = pd.to_datetime(pd.DataFrame({"year": data["year"].astype(int), "month": month, "day": 1}))
    return pd.DataFrame({"quarter": quarter.to_numpy(), **{c: data[c].to_numpy() for c in MACRO}})


def panel_frame() -> pd.DataFrame:
    """Five real series of 100 to 2,284 rows (annual, quarterly, monthly, weekly), in one long frame."""
    sun = sm_datasets.sunspots.load_pandas().data
    nile = sm_datasets.nile.load_pandas().data
    nino = sm_datasets.elnino.load_pandas().data.melt(id_vars="YEAR", var_name="month", value_name="value")
    months = {m: i + 1 for i, m in enumerate(sm_datasets.elnino.load_pandas().data.columns[1:])}
    nino["t"] = pd.to_datetime(dict(year=nino["YEAR"].astype(int), month=nino["month"].map(months), day=1))
    macro = macro_frame()
    co2 = co2_frame()
    parts = {
        "sunspots": (pd.to_datetime(sun["YEAR"].astype(int).astype(str)), sun["SUNACTIVITY"]),
        "nile": (pd.to_datetime(nile["year"].astype(int).astype(str)), nile["volume"]),
        "elnino": (nino["t"], nino["value"]),
        "cpi": (macro["quarter"], macro["cpi"]),
        "co2": (co2["week"], co2["co2"]),
    }
    frames = [
        pd.DataFrame({"sid": name, "t": pd.Series(t).to_numpy(), "value": np.asarray(v, np.float64)}).sort_values("t")
        for name, (t, v) in parts.items()
    ]
    return pd.concat(frames, ignore_index=True)


# --- the oracle ----------------------------------------------------------------------------------


def oracle(
    parts: list[pd.DataFrame],
    features: list[str],
    *,
    window: int,
    stride: int = 1,
    horizon: int = 0,
    series: str | None = None,
    targets: list[str] | None = None,
    drop_nan: bool = False,
) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
    """``{global start row: (x (C, L), y)}`` of every valid window, by brute force over each partition."""
    out: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    offset = 0
    for part in parts:
        x_all = part[features].to_numpy(np.float64)
        y_all = part[targets].to_numpy(np.float64) if targets else None
        keys = part[series].to_numpy() if series else np.zeros(len(part))
        n = len(part)
        begin = 0
        for end in range(1, n + 1):
            if end < n and keys[end] == keys[end - 1]:
                continue
            for s in range(begin, end - window - horizon + 1, stride):
                rows = slice(s, s + window + horizon)
                if drop_nan and (np.isnan(x_all[rows]).any() or (y_all is not None and np.isnan(y_all[rows]).any())):
                    continue
                x = x_all[s : s + window].T.astype(np.float32)
                y = None
                if y_all is not None:
                    y = y_all[s + window - 1] if horizon == 0 else y_all[s + window : s + window + horizon].T
                    y = y.astype(np.float32)
                out[offset + s] = (x, y)
            begin = end
        offset += n
    return out


def epoch(ds: dw.WindowDataset, num_workers: int = 0) -> list[tuple]:
    """Every batch of one pass as numpy tuples ``(x, [y,] rows)``."""
    if num_workers:
        import torch

        batches = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers)
    else:
        batches = ds
    return [tuple(t.numpy() for t in batch) for batch in batches]


def check_epoch(batches: list[tuple], want: dict, rows_to_oracle=None, atol: float = 0.0) -> None:
    """Every window of ``want`` exactly once, with exactly its values (``atol`` for standardised ones)."""
    starts = np.concatenate([b[-1] for b in batches])
    keys = starts if rows_to_oracle is None else rows_to_oracle(starts)
    assert len(keys) == len(set(keys.tolist())), "a window was yielded twice"
    assert sorted(keys.tolist()) == sorted(want), "the yielded windows are not the valid ones"
    i = 0
    for batch in batches:
        for j in range(len(batch[0])):
            x_want, y_want = want[int(keys[i])]
            if atol:
                np.testing.assert_allclose(batch[0][j], x_want, rtol=0, atol=atol)
            else:
                np.testing.assert_array_equal(batch[0][j], x_want)
            if y_want is not None:
                np.testing.assert_array_equal(batch[1][j], y_want)
            i += 1


def write_parts(frame: pd.DataFrame, root, cuts: list[int]) -> list[pd.DataFrame]:
    """``frame`` cut at ``cuts`` into ``part-i.parquet`` files in row order; returns the parts."""
    os.makedirs(root, exist_ok=True)
    bounds = [0, *cuts, len(frame)]
    parts = [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]
    for i, part in enumerate(parts):
        part.to_parquet(os.path.join(root, f"part-{i}.parquet"), index=False)
    return parts


# --- one long series with real gaps --------------------------------------------------------------


@pytest.fixture(scope="module")
def co2(tmp_path_factory):
    root = tmp_path_factory.mktemp("co2")
    frame = co2_frame()
    assert frame["co2"].isna().sum() == 59  # the real missing weeks this test is about
    return str(root), write_parts(frame, root, [431, 1000, 1555, 1990])


@pytest.mark.parametrize("window,stride,horizon", [(16, 1, 0), (52, 4, 0), (26, 3, 8)])
def test_co2_split_in_time_order_drop_leaves_out_exactly_the_nan_windows(co2, window, stride, horizon):
    root, parts = co2
    kwargs = dict(window=window, stride=stride, horizon=horizon, return_index=True, batch_size=64)
    targets = ["co2"] if horizon else None
    ds = dw.WindowDataset(root, ["co2"], targets, series=None, nan="drop", **kwargs)
    want = oracle(parts, ["co2"], targets=targets, drop_nan=True, **kwargs_of(kwargs))
    every = oracle(parts, ["co2"], targets=targets, **kwargs_of(kwargs))
    assert 0 < len(want) < len(every)  # the gaps really cost windows
    assert ds.num_windows == len(want) and len(ds) == -(-len(want) // 64)
    check_epoch(epoch(ds), want)


def kwargs_of(kwargs: dict) -> dict:
    return {k: kwargs[k] for k in ("window", "stride", "horizon")}


def test_co2_nan_raise_names_a_real_missing_week(co2):
    root, parts = co2
    ds = dw.WindowDataset(root, ["co2"], series=None, window=16, shuffle=False, return_index=True)
    with pytest.raises(dw.DataError) as caught:
        epoch(ds)
    message = str(caught.value)
    found = re.search(r"column 'co2' of (\S+) at row (\d+) of that partition", message)
    assert found, message
    path, row = found.group(1), int(found.group(2))
    assert np.isnan(pq.read_table(path).column("co2").to_numpy()[row]), message
    first = next(i for i, p in enumerate(parts) if p["co2"].isna().any())
    assert os.path.basename(path) == f"part-{first}.parquet"
    assert row == int(np.flatnonzero(parts[first]["co2"].isna())[0])
    assert "nan='drop'" in message


def test_co2_stats_and_normalize_equal_numpys(co2, tmp_path):
    import dask

    from dask_windows.cli.stats import compute_stats

    root, parts = co2
    values = pd.concat(parts)["co2"].to_numpy()
    with dask.config.set(scheduler="sync"):
        doc = compute_stats(root, ["co2"], series=None, time="week")
    got = doc["features"]["co2"]
    assert got["nan_count"] == 59 and got["count"] == len(values) - 59
    assert got["mean"] == pytest.approx(np.nanmean(values), rel=1e-12)
    assert got["std"] == pytest.approx(np.nanstd(values), rel=1e-10)
    (tmp_path / "stats.json").write_text(json.dumps(doc))
    ds = dw.WindowDataset(
        root,
        ["co2"],
        series=None,
        window=32,
        stride=5,
        nan="drop",
        normalize=str(tmp_path / "stats.json"),
        return_index=True,
    )
    mean, std = np.float32(np.nanmean(values)), np.float32(np.nanstd(values))
    scaled = [p.assign(co2=(p["co2"].astype(np.float32) - mean) / std) for p in parts]
    check_epoch(epoch(ds), oracle(scaled, ["co2"], window=32, stride=5, drop_nan=True), atol=1e-5)
    sample = dw.WindowDataset(
        root, ["co2"], series=None, window=32, stride=5, nan="drop", normalize="sample", return_index=True
    )
    raw = oracle(parts, ["co2"], window=32, stride=5, drop_nan=True)
    per_window = {
        s: ((x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True), y) for s, (x, y) in raw.items()
    }
    check_epoch(epoch(sample), per_window, atol=1e-4)


# --- many channels, with targets, through every in-memory source ---------------------------------


@pytest.mark.parametrize("source", ["parquet", "arrays", "pandas", "dask"])
def test_macro_channels_and_targets_through_every_source(source, tmp_path):
    frame = macro_frame()
    features, targets = MACRO[:5], ["infl"]
    kwargs = dict(window=12, stride=2, horizon=4)
    parts = [frame]
    if source == "parquet":
        parts = write_parts(frame, tmp_path, [70, 141])
        data, cols = str(tmp_path), (features, targets)
    elif source == "arrays":
        data, cols = [frame[MACRO].to_numpy()], ([0, 1, 2, 3, 4], [5])
    elif source == "pandas":
        data, cols = frame, (features, targets)
    else:
        dd = pytest.importorskip("dask.dataframe")
        parts = write_parts(frame, tmp_path, [100])
        data, cols = dd.read_parquet(str(tmp_path)), (features, targets)
    ds = dw.WindowDataset(data, *cols, series=None, batch_size=16, return_index=True, **kwargs)
    want = oracle(parts, features, targets=targets, **kwargs)
    assert ds.num_windows == len(want)
    check_epoch(epoch(ds), want)


def test_macro_stats_and_normalize(tmp_path):
    import dask

    from dask_windows.cli.stats import compute_stats

    frame = macro_frame()
    write_parts(frame, tmp_path / "data", [101])
    with dask.config.set(scheduler="sync"):
        doc = compute_stats(str(tmp_path / "data"), MACRO, time="quarter")
    for name in MACRO:
        assert doc["features"][name]["mean"] == pytest.approx(frame[name].mean(), rel=1e-12)
        assert doc["features"][name]["std"] == pytest.approx(frame[name].std(ddof=0), rel=1e-10)
    (tmp_path / "stats.json").write_text(json.dumps(doc))
    ds = dw.WindowDataset(
        str(tmp_path / "data"), MACRO, series=None, window=8, normalize=str(tmp_path / "stats.json"), return_index=True
    )
    mean = frame[MACRO].mean().to_numpy(np.float32)
    std = frame[MACRO].std(ddof=0).to_numpy(np.float32)
    scaled = frame.assign(**{c: (frame[c].astype(np.float32) - mean[i]) / std[i] for i, c in enumerate(MACRO)})
    parts = [scaled.iloc[:101], scaled.iloc[101:]]
    check_epoch(epoch(ds), oracle(parts, MACRO, window=8), atol=1e-5)


# --- several series, grouped in an arbitrary order, cut across files ---------------------------


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    root = tmp_path_factory.mktemp("panel")
    frame = panel_frame()
    order = ["elnino", "nile", "co2", "sunspots", "cpi"]  # neither sorted by name nor by length
    grouped = pd.concat([frame[frame["sid"] == s] for s in order], ignore_index=True)
    cuts = [500, 1500, 2900]  # elnino and co2 each span two files
    return str(root), grouped, write_parts(grouped, root, cuts)


@pytest.mark.parametrize("source", ["parquet", "parquet-workers", "dask", "pandas", "arrays"])
def test_panel_grouped_unsorted_every_source(panel, source):
    root, grouped, parts = panel
    kwargs = dict(window=24, stride=3)
    data, features, series, want_parts, workers = root, ["value"], "sid", parts, 0
    if source == "parquet-workers":
        workers = 2
    elif source == "dask":
        dd = pytest.importorskip("dask.dataframe")
        data = dd.read_parquet(root)
    elif source == "pandas":
        data, want_parts = grouped, [grouped]
    elif source == "arrays":  # one (rows, 1) array per series, in the frame's order
        names = list(dict.fromkeys(grouped["sid"]))
        data = [grouped.loc[grouped["sid"] == s, ["value"]].to_numpy() for s in names]
        features, series, want_parts = None, None, [grouped[grouped["sid"] == s] for s in names]
    ds = dw.WindowDataset(data, features, series=series, nan="drop", batch_size=32, return_index=True, **kwargs)
    want = oracle(want_parts, ["value"], series="sid", drop_nan=True, **kwargs)
    assert ds.num_windows == len(want)
    check_epoch(epoch(ds, workers), want)


# --- interleaved by date: only convert makes it readable ---------------------------------------


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    """The panel as a long-format export: rows ordered by date across series, in three files."""
    root = tmp_path_factory.mktemp("export")
    frame = panel_frame()
    export = frame.sample(frac=1.0, random_state=1).sort_values("t", kind="stable").reset_index(drop=True)
    assert (export["sid"].to_numpy()[1:] != export["sid"].to_numpy()[:-1]).sum() > 1000  # really interleaved
    write_parts(export, root / "raw", [1200, 2400])
    done = cli(
        "convert", str(root / "raw"), str(root / "out"), "--series", "sid", "--time", "t",
        "--partition-size", "16KB", "--window", "24", "--workers", "1", "--no-progress", "--json",
    )  # fmt: skip
    return root, frame.sort_values(["sid", "t"], kind="stable").reset_index(drop=True), json.loads(done.stdout)


def test_interleaved_export_warns_and_convert_makes_every_window_readable(interleaved):
    from dask_windows.cli.layout import canonical_rows, read_converted

    root, canonical, report = interleaved
    kwargs = dict(window=24, stride=2)
    want = oracle([canonical], ["value"], series="sid", drop_nan=True, **kwargs)
    with pytest.warns(
        SeriesOrderWarning, match=r"not grouped.* runs of 5 series in all partitions.*dask-windows convert"
    ):
        raw = dw.WindowDataset(str(root / "raw"), ["value"], series="sid", nan="drop", **kwargs)
    assert raw.num_windows < len(want) / 10  # only the few windows inside short same-series runs
    with pytest.raises(dw.DataError, match="not grouped"):
        dw.WindowDataset(str(root / "raw"), ["value"], series="sid", nan="drop", strict=True, **kwargs)

    out = str(root / "out")
    assert report["rows_out"] == len(canonical) and report["files"] > 3
    back = read_converted(out)
    pd.testing.assert_frame_equal(back, canonical, check_dtype=False)
    manifest = json.load(open(os.path.join(out, "_dask_windows_manifest.json")))
    ds = dw.WindowDataset(out, ["value"], series="sid", nan="drop", batch_size=64, return_index=True, **kwargs)
    assert ds.num_windows == len(want)
    check_epoch(epoch(ds), want, rows_to_oracle=lambda rows: np.asarray(canonical_rows(manifest, rows)))


def test_inspect_counts_equal_the_oracle(interleaved, panel, capsys):
    from dask_windows.cli import main

    root, canonical, _ = interleaved
    for path, want_parts, extra in [
        (str(root / "out"), [canonical], []),
        (panel[0], panel[2], ["--series", "sid"]),
    ]:
        for window, stride, nan in [(24, 2, "drop"), (20, 1, "drop"), (12, 5, "raise")]:
            code = main(
                ["inspect", path, *extra, "--features", "value", "--window", str(window), "--stride", str(stride),
                 "--nan", nan, "--json"]
            )  # fmt: skip
            want = oracle(want_parts, ["value"], series="sid", window=window, stride=stride, drop_nan=nan == "drop")
            clean = oracle(want_parts, ["value"], series="sid", window=window, stride=stride, drop_nan=True)
            if nan == "raise" and len(clean) < len(want):  # a window holds NaN: the loader rejects it, so does inspect
                assert code == 1
                err = capsys.readouterr().err
                assert f"{len(want) - len(clean):,} of {len(want):,} windows hold NaN" in err, err
                continue
            assert code == 0
            report = json.loads(capsys.readouterr().out)
            assert report["windows"] == len(want), (path, window, stride, nan)
