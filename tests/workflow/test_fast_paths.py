"""The workflow's cheaper paths (issue 35) give the values of the plain ones, each against an oracle.

* ``Categorify`` of string columns read from Parquet as Arrow dictionaries (``dictionary_columns``):
  the same codes as through numpy arrays of Python strings, nulls, unseen values and row groups
  with different dictionaries included; every batch of a dataset equal to the batches read the
  plain way, same seed.
* Targets over a horizon gathered as runs (``Gatherer.targets``): the rows after each window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dask_windows import WindowDataset
from dask_windows.workflow import Categorify, FillMissing, Normalize, TimeFeatures, Workflow
from dask_windows.workflow import apply as workflow_apply


def categories_frame(series: int = 6, rows: int = 90, seed: int = 0) -> pd.DataFrame:
    """Hourly series with two string categories (nulls in one), a value, a zoned timestamp."""
    rng = np.random.default_rng(seed)
    n = series * rows
    color = np.array(["red", "green", "blue", "teal"], dtype=object)[rng.integers(0, 4, n)]
    color[rng.random(n) < 0.1] = None
    return pd.DataFrame({
        "series": np.repeat(np.arange(series), rows),
        "time": np.tile(pd.date_range("2021-03-27", periods=rows, freq="h", tz="Europe/Berlin"), series),
        "value": rng.standard_normal(n),
        "color": color,
        "shop": np.array([f"shop{i % 4}" for i in range(series)], dtype=object)[np.repeat(np.arange(series), rows)],
    })  # fmt: skip


def categories_workflow() -> Workflow:
    return Workflow(
        [FillMissing(["value"], value=0.0), Normalize(["value"], per_series=True), Categorify(["color", "shop"]),
         TimeFeatures("time", ["hour", "dayofyear", "weekofyear"])],
        series="series", continuous=["value", "time_hour", "time_dayofyear", "time_weekofyear"],
        categorical=["color", "shop"], target=["value"],
    )  # fmt: skip


@pytest.fixture
def parquet_categories(tmp_path):
    """A file of small row groups (each its own dictionary); the fit saw neither the color "teal" nor
    the shop of the last series (unseen in the data read)."""
    frame = categories_frame()
    fitted = frame[frame["color"] != "teal"].copy()
    last = frame["series"] == frame["series"].max()
    frame.loc[last, "shop"] = "shop9"
    (tmp_path / "fit").mkdir()
    fitted.to_parquet(tmp_path / "fit" / "part.parquet", index=False)
    wf = categories_workflow().fit(str(tmp_path / "fit"), scheduler="sync")
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "data" / "part.parquet",
                   row_group_size=100)  # fmt: skip
    return str(tmp_path / "data"), frame, wf


def test_categories_read_as_dictionaries_take_the_codes_of_their_strings(parquet_categories):
    root, frame, wf = parquet_categories
    ds = WindowDataset(root, workflow=wf, window=8, horizon=2, batch_size=16, seed=0)
    source = ds.source
    assert source.inner.dictionary_columns == {"color", "shop"}
    raw = source.inner.read(0, ["color", "shop"])
    assert all(isinstance(raw[c], pa.ChunkedArray) for c in ("color", "shop"))  # not numpy strings
    got = source.read(0, ["color", "shop"])
    want = wf.transform_frame(frame[wf.inputs])  # pandas columns of Python strings: the plain path
    for col in ("color", "shop"):
        vocabulary = {v: k + 2 for k, v in enumerate(wf.ops[2].vocabulary(col))}
        oracle = [0 if pd.isna(v) else vocabulary.get(v, 1) for v in frame[col]]  # 0 null, 1 unseen
        np.testing.assert_array_equal(got[col], np.asarray(oracle, np.float32), err_msg=col)
        np.testing.assert_array_equal(got[col], want[col].to_numpy(np.float32), err_msg=col)
    assert {0, 1} <= set(got["color"].tolist()) and 1 in set(got["shop"].tolist())


@pytest.mark.parametrize("named", [False, True])
def test_batches_from_dictionaries_equal_batches_from_strings(parquet_categories, monkeypatch, named):
    root, _, wf = parquet_categories
    kw = dict(window=8, horizon=3, batch_size=16, seed=4, workflow=wf.named(index=True) if named else wf)

    def batches() -> list:
        out = []
        for batch in WindowDataset(root, **kw):
            out.append(dict(batch) if isinstance(batch, dict) else dict(enumerate(batch)))
        return out

    fast = batches()
    monkeypatch.setattr(workflow_apply, "dictionary_inputs", lambda wf: [])  # the strings read as before
    plain = batches()
    assert len(fast) == len(plain) > 3
    for a, b in zip(fast, plain):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype, key
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=str(key))


@pytest.mark.parametrize("horizon", [1, 5])
def test_targets_over_the_horizon_are_the_rows_after_each_window(horizon):
    from dask_windows.runtime.batch import Gatherer

    rng = np.random.default_rng(1)
    rows, window = 300, 16
    x = rng.standard_normal((3, rows)).astype(np.float32)
    y = rng.standard_normal((2, rows)).astype(np.float32)
    gatherer = Gatherer(x, y, window, horizon, "NCL")
    starts = rng.integers(0, rows - window - horizon + 1, 64)
    want = np.stack([y[:, s + window : s + window + horizon] for s in starts])  # (B, T, H)
    got = gatherer.targets(starts)
    assert got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
