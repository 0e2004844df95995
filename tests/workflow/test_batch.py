"""The named batch's fields against pandas where the fast path takes shortcuts.

The emitter makes the fields without values once per batch size, casts the categorical codes
into arrays it reuses once the caller drops a batch, reads the series code from the targets,
and looks the per-series target scales up in a table built once (the global row for a series
the fit did not see). Each shortcut is checked here on statsmodels' co2 against pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd
import torch

from dask_windows import WindowDataset
from dask_windows.workflow import Categorify, Normalize, Workflow, invert_target

SEASONS = np.array(["winter", "spring", "summer", "autumn"])


@pytest.fixture(scope="module")
def co2(tmp_path_factory):
    root = tmp_path_factory.mktemp("co2named")
    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    df["season"] = SEASONS[(df["date"].dt.month.to_numpy() % 12) // 3]
    df["co2"] = df.groupby("decade")["co2"].ffill().bfill()  # no NaN: every window is yielded
    df.to_parquet(root / "co2.parquet", row_group_size=200, index=False)
    return str(root / "co2.parquet"), df


def starts(df: pd.DataFrame, window: int, horizon: int) -> np.ndarray:
    """Every window start row: per decade, whole window and horizon inside it."""
    out = []
    for rows in df.groupby("decade", sort=False).indices.values():
        out += list(rows[: max(0, len(rows) - window - horizon + 1)])
    return np.array(sorted(out))


@pytest.mark.parametrize("horizon", [0, 2])
def test_fields_without_values_keep_their_shapes_and_dtypes(co2, horizon):
    path, df = co2
    wf = Workflow([], series="decade", continuous=["co2"]).fit(df, scheduler="sync")
    ds = WindowDataset(path, workflow=wf.named(index=True), window=5, horizon=horizon, batch_size=100)
    batches = list(ds)
    index = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(index), starts(df, 5, horizon))
    per_target = (0, horizon) if horizon else (0,)
    want = {"past_cont": ((1, 5), torch.float32), "past_cat": ((0, 5), torch.int64),
            "static_cont": ((0,), torch.float32), "static_cat": ((0,), torch.int64),
            "future_cont": ((0, horizon), torch.float32), "future_cat": ((0, horizon), torch.int64),
            "target": (per_target, torch.float32), "target_loc": ((0,), torch.float32),
            "target_scale": ((0,), torch.float32), "series": ((), torch.int64), "index": ((), torch.int64)}  # fmt: skip
    for b in batches:
        assert list(b) == list(want)
        for key, (shape, dtype) in want.items():
            assert tuple(b[key].shape) == (len(b["index"]), *shape) and b[key].dtype == dtype, key
    series = np.concatenate([b["series"].numpy() for b in batches])
    np.testing.assert_array_equal(np.array(wf.series_keys)[series], df["decade"].to_numpy()[index])
    values = np.concatenate([b["past_cont"].numpy() for b in batches])[:, 0]
    np.testing.assert_array_equal(values, df["co2"].to_numpy(np.float32)[index[:, None] + np.arange(5)])


def test_batches_kept_by_the_caller_are_never_overwritten(co2):
    """Codes are cast into pooled arrays: a batch held while later ones are made keeps its values."""
    path, df = co2
    wf = Workflow([Categorify(["season"])], series="decade", categorical=["season"]).fit(df, scheduler="sync")
    ds = WindowDataset(path, workflow=wf.named(index=True), window=7, batch_size=64, seed=3)
    kept = [b for k, b in enumerate(ds) if k % 3 == 0]  # the others dropped at once: their arrays are reused
    assert len(kept) >= 10
    codes = df["season"].map({v: i + 2 for i, v in enumerate(sorted(SEASONS))}).to_numpy()
    for b in kept:
        index = b["index"].numpy()
        np.testing.assert_array_equal(b["past_cat"].numpy()[:, 0], codes[index[:, None] + np.arange(7)])
    assert len({b["past_cat"].data_ptr() for b in kept}) == len(kept)


@pytest.mark.parametrize("scale_target", [True, False])
def test_per_series_target_scales_and_the_global_ones_of_an_unseen_series(co2, scale_target):
    path, df = co2
    seen = df[df["decade"] != "1990s"]
    wf = Workflow([Normalize(["co2"], per_series=True)], series="decade", continuous=["co2"], target=["co2"])
    wf.fit(seen, scheduler="sync")
    ds = WindowDataset(path, workflow=wf.named(index=True, scale_target=scale_target), window=6, horizon=3,
                       batch_size=128)  # fmt: skip
    batches = list(ds)
    got = {
        k: np.concatenate([b[k].numpy() for b in batches]) for k in ("index", "target", "target_loc", "target_scale")
    }
    index = got["index"]
    decade = df["decade"].to_numpy()[index]
    stats = seen.groupby("decade")["co2"].agg(["mean", "std"])
    loc = stats["mean"].reindex(decade).fillna(seen["co2"].mean()).to_numpy()  # the 1990s: global statistics
    scale = stats["std"].reindex(decade).fillna(seen["co2"].std()).to_numpy()
    assert (decade == "1990s").sum() > 100
    units = df["co2"].to_numpy()[index[:, None] + 6 + np.arange(3)]  # (B, H)
    if scale_target:
        np.testing.assert_allclose(got["target_loc"][:, 0], loc, rtol=1e-6)
        np.testing.assert_allclose(got["target_scale"][:, 0], scale, rtol=1e-6)
        np.testing.assert_allclose(got["target"][:, 0], (units - loc[:, None]) / scale[:, None], rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got["target_loc"], 0.0)
        np.testing.assert_array_equal(got["target_scale"], 1.0)
        np.testing.assert_allclose(got["target"][:, 0], units, rtol=1e-6)
    back = invert_target(torch.from_numpy(got["target"]), {k: torch.from_numpy(v) for k, v in got.items()})
    np.testing.assert_allclose(back.numpy()[:, 0], units, rtol=1e-6)


@pytest.mark.parametrize("named", [False, True])
def test_device_mode_is_refused_saying_what_to_do(co2, named):
    path, df = co2
    wf = Workflow([], series="decade", continuous=["co2"]).fit(df, scheduler="sync")
    with pytest.raises(ValueError, match=r"device='cpu' cannot be combined yet.*Pass device=None and move the batches "
                       r"with dw\.DevicePrefetcher\(DataLoader\(ds, batch_size=None, pin_memory=True\), device\)"):  # fmt: skip
        WindowDataset(path, workflow=wf.named() if named else wf, window=4, device="cpu")
