"""The named batch beside PyTorch Forecasting's ``TimeSeriesDataSet`` on the same real panel (grunfeld).

Skipped where pytorch-forecasting is not installed: it pins ``pandas<3.1``, so it is not part of
the shared environment (see docs/workflows.md). The documented semantics compared: encoder
continuous inputs (the target scaled by ``GroupNormalizer``: group mean and ``std + eps``, the
other reals unscaled), known reals over the decoder, static categoricals and reals, and the
target scale; PF's ``eps`` (float16's) is the one difference, accounted for here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dask_windows import WindowDataset
from dask_windows.workflow import Normalize, Statics, Workflow

pf = pytest.importorskip("pytorch_forecasting")


def test_named_batch_equals_timeseriesdataset(tmp_path):
    from pytorch_forecasting.data import GroupNormalizer, TimeSeriesDataSet
    from test_workflow import gather, grunfeld

    df, table = grunfeld()
    df = df.drop(columns=["date"]).assign(time_idx=(df["year"] - 1935).astype(int))
    path = tmp_path / "g.parquet"
    df.to_parquet(path, index=False)
    statics = Statics(table, numeric=["size"], categorical=["sector"])
    wf = Workflow([Normalize(["invest"], per_series=True)], series="firm", continuous=["year", "invest", "value"],
                  target=["invest"], known=["year"], statics=statics).fit(df, scheduler="sync")  # fmt: skip
    got = gather(list(WindowDataset(str(path), workflow=wf.named(index=True), window=6, horizon=2, batch_size=64)))

    data = df.merge(table, on="firm")
    tsd = TimeSeriesDataSet(
        data, time_idx="time_idx", target="invest", group_ids=["firm"], min_encoder_length=6, max_encoder_length=6,
        min_prediction_length=2, max_prediction_length=2, static_categoricals=["sector"], static_reals=["size"],
        time_varying_known_reals=["year"], time_varying_unknown_reals=["invest", "value"],
        target_normalizer=GroupNormalizer(groups=["firm"]), scalers={"size": None, "year": None, "value": None},
    )  # fmt: skip
    x, _ = next(iter(tsd.to_dataloader(train=False, batch_size=1000, num_workers=0)))
    groups = {v: k for k, v in tsd._categorical_encoders["__group_id__firm"].classes_.items()}
    firm = np.array([groups[int(g)] for g in x["groups"][:, 0]])
    start = x["decoder_time_idx"][:, 0].numpy() - 6 + 1935
    # Our windows in the same order: by (firm, first year).
    ours = pd.DataFrame({"firm": np.array(wf.series_keys)[got["series"]], "year": got["past_cont"][:, 0, 0]})
    key = ours.reset_index().set_index(["firm", "year"])["index"]
    at = key.loc[list(zip(firm, start.astype(float)))].to_numpy()
    assert len(at) == len(got["index"]) == 11 * 13

    eps = np.finfo(np.float16).eps
    scale = got["target_scale"][at, 0]
    center, pf_scale = x["target_scale"][:, 0].numpy(), x["target_scale"][:, 1].numpy()
    np.testing.assert_allclose(got["target_loc"][at, 0], center, rtol=1e-5)
    np.testing.assert_allclose(scale + eps, pf_scale, rtol=1e-5)
    reals = list(tsd.reals)  # static reals, known reals, unknown reals
    enc = x["encoder_cont"].numpy()  # (B, L, C)
    in_units = got["past_cont"][at, 1] * scale[:, None] + got["target_loc"][at, 0][:, None]
    np.testing.assert_allclose(enc[..., reals.index("invest")] * pf_scale[:, None] + center[:, None], in_units,
                               rtol=1e-4, atol=1e-3)  # fmt: skip
    np.testing.assert_allclose(enc[..., reals.index("value")], got["past_cont"][at, 2], rtol=1e-6)
    np.testing.assert_allclose(x["decoder_cont"][..., reals.index("year")].numpy(), got["future_cont"][at, 0])
    np.testing.assert_allclose(enc[:, 0, reals.index("size")], got["static_cont"][at, 0], rtol=1e-6)
    sectors = {v: k for k, v in tsd._categorical_encoders["sector"].classes_.items()}
    vocab = wf.statics.state["vocabulary"]["sector"]
    theirs = [sectors[int(c)] for c in x["encoder_cat"][:, 0, 0]]
    assert theirs == [vocab[c - 2] for c in got["static_cat"][at, 0]]
