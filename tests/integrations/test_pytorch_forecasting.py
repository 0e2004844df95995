"""PyTorch Forecasting's models on named batches (``integrations.pytorch_forecasting``), on statsmodels' grunfeld.

Skipped where pytorch-forecasting cannot be imported (it pins ``pandas<3.1``; ``.ci/extras`` installs it
``--no-deps``). The oracles: PF's own ``TimeSeriesDataSet`` on the same frame (the same windows, matched by
series and start, and the same loss of one model on both), and pandas/numpy for the encoder normaliser,
the shorter encoders and the last windows.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd
import torch

from dask_windows import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.workflow import Categorify, Normalize, Statics, Workflow

pf = pytest.importorskip("pytorch_forecasting", reason="pytorch-forecasting is not installed (see .ci/extras)")

from dask_windows.integrations.pytorch_forecasting import PFAdapter, last_windows  # noqa: E402

WINDOW, HORIZON = 6, 2


@pytest.fixture(scope="module")
def grunfeld(tmp_path_factory):
    """Grunfeld's 11 firms x 20 years in Parquet, a static table, and ``time_idx`` for PF."""
    df = smd.grunfeld.load_pandas().data
    df["firm"] = df["firm"].astype(str)
    df["era"] = np.where(df["year"] < 1945, "war", "post")
    df["time_idx"] = (df["year"] - 1935).astype(int)
    path = tmp_path_factory.mktemp("grunfeld") / "g.parquet"
    df.to_parquet(path, index=False, row_group_size=64)
    table = pd.DataFrame({"firm": sorted(df["firm"].unique())})
    table["size"] = table["firm"].map(df.groupby("firm")["capital"].first())
    table["kind"] = np.where(table["size"] > 50, "big", "small")
    return str(path), df, table


def workflow(df, table, continuous=("year", "invest", "value"), **kwargs):
    statics = Statics(table, numeric=["size"], categorical=["kind"])
    ops = [Normalize(["invest"], per_series=True), Normalize(["value", "year"]), Categorify(["era"])]
    return Workflow(ops, series="firm", continuous=list(continuous), categorical=["era"], target=["invest"],
                    known=["year", "era"], statics=statics, **kwargs).fit(df, scheduler="sync")  # fmt: skip


def joined(dataset, adapter=None) -> dict:
    """Every named batch of ``dataset`` as one batch (in start-row order), or PF's ``x`` of it."""
    batches = list(dataset)
    batch = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    order = torch.argsort(batch["index"])
    batch = {k: v[order] for k, v in batch.items()}
    return batch if adapter is None else adapter(batch)[0]


def train(model, loader, valid=None, steps=2):
    import lightning

    trainer = lightning.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", limit_val_batches=1,
                                num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, loader, valid)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.parametrize("model", ["TemporalFusionTransformer", "DeepAR", "NHiTS"])
def test_each_model_trains_from_parquet_through_window_dataset(grunfeld, model):
    path, df, table = grunfeld
    cls = getattr(pf, model)
    settings = {
        "TemporalFusionTransformer": dict(add_relative_time_idx=True, add_target_scales=True, min_encoder_length=3),
        "DeepAR": dict(target_normalizer="encoder", add_relative_time_idx=True),
        "NHiTS": {},
    }[model]
    # DeepAR wants the same inputs in encoder and decoder apart from the target: no unknown reals besides it
    wf = workflow(df, table, continuous=("year", "invest") if model == "DeepAR" else ("year", "invest", "value"))
    adapter = PFAdapter(wf, WINDOW, HORIZON, **settings)
    torch.manual_seed(0)
    net = cls.from_dataset(adapter, **({} if model == "NHiTS" else {"hidden_size": 8}))
    ds = WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=32)
    fitting, held_out = ds.split(valid=0.45)  # 4 training and 2 held-out windows a firm
    before = [p.detach().clone() for p in net.parameters()]
    metrics = train(net, adapter.loader(fitting), adapter.loader(held_out), steps=2)
    assert np.isfinite(metrics["train_loss_step"]) and np.isfinite(metrics["val_loss"])
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, net.parameters()))  # it learned something


@pytest.mark.parametrize("transformation", [None, "log"])
def test_same_windows_and_first_loss_as_timeseriesdataset(grunfeld, transformation):
    """One TFT's loss on PF's batch of every window equals its loss on ours (same weights, loaded across);
    with ``log``, PF's ``GroupNormalizer(transformation="log")`` against the workflow's ``Transform``."""
    from pytorch_forecasting import GroupNormalizer, TemporalFusionTransformer, TimeSeriesDataSet

    from dask_windows.workflow import Transform

    path, df, table = grunfeld
    statics = Statics(table, numeric=["size"])
    ops = [Transform(["invest"], transformation)] if transformation else []
    wf = Workflow([*ops, Normalize(["invest"], per_series=True)], series="firm", continuous=["year", "invest", "value"],
                  target=["invest"], known=["year"], statics=statics).fit(df, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, WINDOW, HORIZON, add_relative_time_idx=True)
    ds = WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=64)
    ours = joined(ds, adapter)

    tsd = TimeSeriesDataSet(
        df.merge(table, on="firm"), time_idx="time_idx", target="invest", group_ids=["firm"],
        min_encoder_length=WINDOW, max_encoder_length=WINDOW, min_prediction_length=HORIZON,
        max_prediction_length=HORIZON, static_reals=["size"], time_varying_known_reals=["year"],
        time_varying_unknown_reals=["invest", "value"], target_normalizer=GroupNormalizer(groups=["firm"], transformation=transformation),
        scalers={"size": None, "year": None, "value": None}, add_relative_time_idx=True,
    )  # fmt: skip
    x, y = next(iter(tsd.to_dataloader(train=False, batch_size=1000, num_workers=0)))
    firms = {v: k for k, v in tsd._categorical_encoders["__group_id__firm"].classes_.items()}
    theirs_key = [(firms[int(g)], int(t) - WINDOW) for g, t in zip(x["groups"][:, 0], x["decoder_time_idx"][:, 0])]
    # ours by (firm, first time_idx): the window's first row holds its year
    first_year = ours["encoder_cont"][:, 0, adapter.reals.index("year")].numpy()
    our_key = [(wf.series_keys[int(g)], int(np.rint(t)) - 1935) for g, t in zip(ours["groups"][:, 0], first_year)]
    assert sorted(our_key) == sorted(theirs_key) and len(our_key) == 11 * 13
    at = [our_key.index(k) for k in theirs_key]
    ours = {k: v[at] for k, v in ours.items()}

    assert adapter.reals == list(tsd.reals) and adapter.categoricals == list(tsd.categoricals)
    eps = float(np.finfo(np.float16).eps)  # PF's GroupNormalizer adds it to each series' std
    np.testing.assert_allclose(ours["target_scale"][:, 0], x["target_scale"][:, 0], rtol=1e-5)
    np.testing.assert_allclose(ours["target_scale"][:, 1] + eps, x["target_scale"][:, 1], rtol=1e-5)
    invest = adapter.reals.index("invest")
    for key in ("encoder_cont", "decoder_cont"):
        # over the decoder, unknown reals besides the target are zeros here (no model reads them there)
        unread = {"value"} if key == "decoder_cont" else set()
        others = [i for i, name in enumerate(adapter.reals) if name not in unread | {"invest"}]
        np.testing.assert_allclose(ours[key][..., others], x[key][..., others], rtol=1e-6)
        # the scaled target, back in units with each side's own scale
        in_units = [
            b[key][..., invest] * b["target_scale"][:, 1, None] + b["target_scale"][:, 0, None] for b in (ours, x)
        ]
        np.testing.assert_allclose(*in_units, rtol=1e-5, atol=1e-3)
    for key in ("encoder_target", "decoder_target", "encoder_lengths", "decoder_lengths"):
        np.testing.assert_allclose(ours[key], x[key], rtol=1e-6)

    # PF's eps in each series' std is the one difference (under log, ~0.3% of a std of ~0.4): with it added
    # to ours, and the scaled target scaled by it, one model's losses on both agree
    center, spread = ours["target_scale"][:, 0, None], ours["target_scale"][:, 1, None]
    for key in ("encoder_cont", "decoder_cont"):
        ours[key] = ours[key].clone()
        ours[key][..., invest] = ours[key][..., invest] * spread / (spread + eps)
    ours["target_scale"] = torch.cat([center, spread + eps], dim=1)

    torch.manual_seed(0)
    theirs_model = TemporalFusionTransformer.from_dataset(tsd, hidden_size=8)
    our_model = TemporalFusionTransformer.from_dataset(adapter, hidden_size=8)
    our_model.load_state_dict(theirs_model.state_dict())  # the same architecture: every weight fits
    theirs_model.eval(), our_model.eval()
    with torch.no_grad():
        theirs_loss = theirs_model.loss(theirs_model(x)["prediction"], y)
        our_loss = our_model.loss(our_model(ours)["prediction"], (ours["decoder_target"], None))
    assert float(theirs_loss) > 0
    np.testing.assert_allclose(float(our_loss), float(theirs_loss), rtol=1e-4)


def test_encoder_normaliser_is_each_windows_encoder_mean_and_std(grunfeld):
    path, df, table = grunfeld
    wf = workflow(df, table)
    adapter = PFAdapter(wf, WINDOW, HORIZON, target_normalizer="encoder", add_target_scales=True)
    x = joined(WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=64),
               adapter)  # fmt: skip
    invest = df.groupby("firm", sort=True)["invest"]
    units = np.stack([s.to_numpy()[i : i + WINDOW] for _, s in invest for i in range(20 - WINDOW - HORIZON + 1)])
    found = x["encoder_target"].numpy()
    # match each window by its encoder values (all distinct here)
    order = [int(np.flatnonzero(np.abs(units - row).max(1) < 1e-3)[0]) for row in found]
    units = units[order]
    center, scale = units.mean(1), units.std(1, ddof=1) + np.finfo(np.float32).eps
    np.testing.assert_allclose(x["target_scale"][:, 0], center, rtol=1e-5)
    np.testing.assert_allclose(x["target_scale"][:, 1], scale, rtol=1e-4)
    invest_at = adapter.reals.index("invest")
    np.testing.assert_allclose(x["encoder_cont"][..., invest_at], (units - center[:, None]) / scale[:, None],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    np.testing.assert_allclose(x["encoder_cont"][:, 0, adapter.reals.index("invest_scale")], scale, rtol=1e-4)


def test_shorter_encoders_keep_their_last_rows_and_are_drawn_per_window(grunfeld):
    path, df, table = grunfeld
    wf = workflow(df, table)
    full = PFAdapter(wf, WINDOW, HORIZON, add_relative_time_idx=True)
    short = PFAdapter(wf, WINDOW, HORIZON, min_encoder_length=2, add_relative_time_idx=True, seed=3)
    batch = joined(WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON,
                                 batch_size=64))  # fmt: skip
    a, b = full(batch)[0], short(batch)[0]
    lengths = b["encoder_lengths"].numpy()
    assert lengths.min() >= 2 and lengths.max() <= WINDOW and len(set(lengths.tolist())) > 2
    np.testing.assert_array_equal(short(batch)[0]["encoder_lengths"], lengths)  # drawn from (seed, start row)
    rel = short.reals.index("relative_time_idx")
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(b["encoder_cont"][i, :n], a["encoder_cont"][i, WINDOW - n :])
        assert not b["encoder_cont"][i, n:].any() and not b["encoder_cat"][i, n:].any()  # padded behind, as PF pads
        np.testing.assert_array_equal(b["encoder_target"][i, :n], a["encoder_target"][i, WINDOW - n :])
        # relative_time_idx: -n .. -1 over the encoder (max_encoder_length apart), 0 .. H-1 over the decoder
        np.testing.assert_allclose(b["encoder_cont"][i, :n, rel], np.arange(-n, 0) / WINDOW)
    np.testing.assert_array_equal(b["decoder_cont"], a["decoder_cont"])


def test_last_windows_are_each_series_last_rows(grunfeld):
    path, df, table = grunfeld
    wf = workflow(df, table)
    ds = WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=64,
                       shuffle=False)  # fmt: skip
    adapter = PFAdapter(wf, WINDOW, HORIZON)
    x = joined(last_windows(ds), adapter)
    firms = [wf.series_keys[int(g)] for g in x["groups"][:, 0]]
    assert sorted(firms) == sorted(df["firm"].unique())
    tails = df.groupby("firm")["invest"].apply(lambda s: s.to_numpy()[-WINDOW - HORIZON :])
    for firm, enc, dec in zip(firms, x["encoder_target"].numpy(), x["decoder_target"].numpy()):
        np.testing.assert_allclose(np.concatenate([enc, dec]), tails[firm], rtol=1e-5)
    index = adapter.x_to_index(x)
    assert list(index["firm"]) == firms


def test_what_the_adapter_refuses(grunfeld):
    path, df, table = grunfeld
    wf = workflow(df, table)
    with pytest.raises(ConfigError, match="continuous, unknown output"):
        PFAdapter(workflow(df, table, continuous=("year", "value")), WINDOW, HORIZON)
    with pytest.raises(ConfigError, match="min_encoder_length=9"):
        PFAdapter(wf, WINDOW, HORIZON, min_encoder_length=9)
    adapter = PFAdapter(wf, WINDOW, HORIZON)
    with pytest.raises(ConfigError, match="named batches"):
        adapter((torch.zeros(2, 3, WINDOW), torch.zeros(2, 1, HORIZON)))
    wide = WindowDataset(path, workflow=wf.named(), window=WINDOW + 1, horizon=HORIZON, batch_size=8)
    with pytest.raises(ConfigError, match="window=7, horizon=2 does not match"):
        adapter(next(iter(wide)))
    from dask_windows.workflow import Transform

    scaled_first = Workflow([Normalize(["invest"], per_series=True), Transform(["invest"], "relu")], series="firm",
                            continuous=["invest"], target=["invest"]).fit(df, scheduler="sync")  # fmt: skip
    with pytest.raises(ConfigError, match="transformations .* first and one Normalize last"):
        PFAdapter(scaled_first, WINDOW, HORIZON)
    short = PFAdapter(wf, WINDOW, HORIZON, min_encoder_length=2)
    with pytest.raises(ConfigError, match="index=True"):
        short(next(iter(WindowDataset(path, workflow=wf.named(), window=WINDOW, horizon=HORIZON, batch_size=8))))


def test_two_targets_give_pf_lists_and_a_multiloss_model(grunfeld):
    path, df, table = grunfeld
    statics = Statics(table, numeric=["size"])
    wf = Workflow([Normalize(["invest", "value"], per_series=True)], series="firm",
                  continuous=["year", "invest", "value"], target=["invest", "value"], known=["year"],
                  statics=statics).fit(df, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, WINDOW, HORIZON)
    batch = next(iter(WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON,
                                    batch_size=16)))  # fmt: skip
    x, (y, weight) = adapter(batch)
    assert weight is None and isinstance(y, list) and len(y) == len(x["target_scale"]) == 2
    for j, name in enumerate(["invest", "value"]):
        units = batch["target"][:, j] * batch["target_scale"][:, j, None] + batch["target_loc"][:, j, None]
        np.testing.assert_allclose(y[j], units, rtol=1e-6)
        np.testing.assert_allclose(x["target_scale"][j][:, 1], batch["target_scale"][:, j])
    model = pf.TemporalFusionTransformer.from_dataset(adapter, hidden_size=8)
    assert isinstance(model.loss, pf.MultiLoss)
    with torch.no_grad():
        assert np.isfinite(float(model.loss(model(x)["prediction"], (y, weight))))


def test_narrow_codes_give_the_same_pf_batch_as_int64_codes(grunfeld):
    """``wf.named(code_dtype="narrow")`` (int8 codes, not widened on the host): the adapter widens them in its
    own copy, and PF's batch equals the one of int64 codes, value for value, its categoricals int64."""
    path, df, table = grunfeld
    wf = workflow(df, table)
    adapter = PFAdapter(wf, WINDOW, HORIZON, min_encoder_length=2, add_target_scales=True)
    kw = dict(window=WINDOW, horizon=HORIZON, batch_size=64)
    wide = joined(WindowDataset(path, workflow=wf.named(index=True), **kw))
    narrow = joined(WindowDataset(path, workflow=wf.named(index=True, code_dtype="narrow"), **kw))
    assert {narrow[k].dtype for k in ("past_cat", "static_cat", "future_cat")} == {torch.int8}
    assert narrow["future_cat"].shape[1] == 1 and narrow["static_cat"].shape[1] == 1  # era over the horizon, kind
    ours, theirs = adapter(narrow)[0], adapter(wide)[0]
    assert list(ours) == list(theirs) and ours["encoder_cat"].dtype == torch.long
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    # the categoricals, column by column: the static over every row, the known one over both parts
    full = torch.cat([ours["encoder_cat"], ours["decoder_cat"]], dim=1).numpy()  # (B, L + H, Q), unshortened
    assert adapter.categoricals == ["kind", "era"]
    np.testing.assert_array_equal(full[:, WINDOW:, 0], np.repeat(wide["static_cat"].numpy(), HORIZON, axis=1))
    np.testing.assert_array_equal(full[:, WINDOW:, 1], wide["future_cat"][:, 0].numpy())


def test_the_adapter_pickles_for_dataloader_workers(grunfeld):
    import pickle

    path, df, table = grunfeld
    wf = workflow(df, table)
    adapter = PFAdapter(wf, WINDOW, HORIZON, min_encoder_length=2, add_target_scales=True)
    batch = next(iter(WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON,
                                    batch_size=16)))  # fmt: skip
    again = pickle.loads(pickle.dumps(adapter))
    for key, value in adapter(batch)[0].items():
        assert torch.equal(value, again(batch)[0][key]), key


@pytest.mark.parametrize(
    "steps, pf_name",
    [([("log",)], "log"), ([("log1p",)], "log1p"), ([("logit",)], "logit"), ([("softplus",)], "softplus"),
     ([("relu",)], "relu"), (["Log1p"], "log1p"), ([("boxcox", 0.5)], None), ([("relu",), ("log",)], None)],
    ids=["log", "log1p", "logit", "softplus", "relu", "Log1p-op", "boxcox", "relu-then-log"],
)  # fmt: skip
def test_workflow_target_transformations_are_pfs_transformation(grunfeld, steps, pf_name):
    """Targets in the data's units, the scale in the transformed units, and PF's normaliser (what
    ``transform_output`` calls) mapping a perfect scaled forecast back to the data: all against numpy."""
    from dask_windows.workflow import Log1p, Transform
    from dask_windows.workflow.transforms import forward

    path, df, table = grunfeld
    frame = df.assign(invest=df["invest"] / (1.5 * df["invest"].max()))  # in (0, 1): every transformation's domain
    share_path = path.replace(".parquet", "-share.parquet")
    frame.to_parquet(share_path, index=False, row_group_size=64)
    ops = [Log1p(["invest"]) if step == "Log1p" else Transform(["invest"], *step) for step in steps]
    wf = Workflow([*ops, Normalize(["invest"], per_series=True)], series="firm", continuous=["year", "invest"],
                  target=["invest"], known=["year"]).fit(frame, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, WINDOW, HORIZON)
    transformation = adapter.target_normalizer.transformation
    assert transformation == pf_name if pf_name else set(transformation) == {"forward", "reverse"}
    batch = joined(WindowDataset(share_path, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON,
                                 batch_size=64))  # fmt: skip
    x, (y, _) = adapter(batch)

    # numpy: each window's rows of its firm, from its first row
    firms = [wf.series_keys[int(g)] for g in x["groups"][:, 0]]
    first_row = frame.groupby("firm").apply(lambda g: g.index.min())
    values = frame.groupby("firm")["invest"].apply(lambda s: s.to_numpy())
    starts = batch["index"].numpy() - first_row[firms].to_numpy()
    span = np.stack([values[f][i : i + WINDOW + HORIZON] for f, i in zip(firms, starts)])  # (B, L + H)
    np.testing.assert_allclose(x["encoder_target"], span[:, :WINDOW], rtol=1e-5)
    np.testing.assert_allclose(y, span[:, WINDOW:], rtol=1e-5)

    # the scale and the scaled target are in the transformed units (where PF's GroupNormalizer fits them)
    transformed = span.astype(np.float64)
    for op in ops:
        transformed = forward(op.name, transformed, op.lmbda)
    loc, scale = x["target_scale"][:, 0].double().numpy(), x["target_scale"][:, 1].double().numpy()
    scaled = x["decoder_cont"][..., adapter.reals.index("invest")]
    np.testing.assert_allclose(scaled.double().numpy() * scale[:, None] + loc[:, None], transformed[:, WINDOW:],
                               rtol=1e-4, atol=1e-5)  # fmt: skip

    # PF maps a perfect scaled forecast back to the data (its log1p with exp: one more); invert_target too
    back = adapter.target_normalizer({"prediction": scaled, "target_scale": x["target_scale"]}).numpy()
    np.testing.assert_allclose(back, span[:, WINDOW:] + (pf_name == "log1p"), rtol=1e-4)
    np.testing.assert_allclose(wf.invert_target(batch["target"], batch)[:, 0], span[:, WINDOW:], rtol=1e-4)


@pytest.mark.slow  # about 10 s: moto's server, a Dask fit over S3 and a short Lightning run
def test_a_model_fits_its_workflow_and_trains_from_parquet_on_s3(grunfeld):
    """Parquet on S3 (moto's server on 127.0.0.1, s3fs as a user configures it): the workflow fitted on the
    bucket, a TFT trained a few steps from it, and the streamed windows the same as from the local file."""
    from helpers import s3_endpoint, skip_unless_installed

    skip_unless_installed("s3fs", "moto")
    path, df, table = grunfeld
    frames = [df.iloc[:120].reset_index(drop=True), df.iloc[120:].reset_index(drop=True)]  # 6 and 5 firms, in order
    s3 = s3_endpoint("panel", frames)
    try:
        url, options = "s3://panel/data/", s3.storage_options()
        statics = Statics(table, numeric=["size"], categorical=["kind"])
        wf = Workflow([Normalize(["invest"], per_series=True), Normalize(["value", "year"]), Categorify(["era"])],
                      series="firm", continuous=["year", "invest", "value"], categorical=["era"],
                      target=["invest"], known=["year", "era"], statics=statics)  # fmt: skip
        wf.fit(url, storage_options=options, scheduler="sync")
        local = workflow(df, table)
        assert wf.series_keys == local.series_keys
        adapter = PFAdapter(wf, WINDOW, HORIZON, add_relative_time_idx=True)
        ds = WindowDataset(url, storage_options=options, workflow=wf.named(index=True), window=WINDOW,
                           horizon=HORIZON, batch_size=32)  # fmt: skip
        ours = joined(ds, adapter)
        theirs = joined(WindowDataset(path, workflow=local.named(index=True), window=WINDOW, horizon=HORIZON,
                                      batch_size=32), adapter)  # fmt: skip
        for key in ("encoder_cont", "decoder_cont", "encoder_target", "decoder_target", "target_scale"):
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6)
        torch.manual_seed(0)
        net = pf.TemporalFusionTransformer.from_dataset(adapter, hidden_size=8)
        before = [p.detach().clone() for p in net.parameters()]
        metrics = train(net, adapter.loader(ds), steps=3)
        assert np.isfinite(metrics["train_loss_step"])
        assert any(not torch.equal(a, b.detach()) for a, b in zip(before, net.parameters()))
    finally:
        s3.close()


@pytest.mark.slow  # two DDP processes on gloo, each starting Lightning
def test_ddp_two_gloo_ranks_train_a_tft_each_on_its_share(grunfeld, tmp_path):
    """Each rank trains on its own windows (disjoint, as many batches on both, all windows between them)
    and DDP keeps the weights in step: the same fingerprint on both ranks after training."""
    import forkrun

    path, df, table = grunfeld
    child = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pf_ddp_child.py")
    config = {"data": path, "window": WINDOW, "horizon": HORIZON, "out": str(tmp_path)}
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(child)), OMP_NUM_THREADS="1")
    out = forkrun.run([sys.executable, child, json.dumps(config)], env=env, timeout=600, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = sorted((json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0  # as many batches on each: DDP cannot hang
    shares = [{tuple(w) for w in r["windows"]} for r in ranks]
    assert not shares[0] & shares[1] and all(len(s) == len(r["windows"]) for s, r in zip(shares, ranks))
    windows = ranks[0]["num_windows"]
    assert windows == 11 * (20 - WINDOW - HORIZON + 1)
    assert len(shares[0] | shares[1]) == windows - windows % 2  # every window once, less what does not divide
    assert np.isfinite(ranks[0]["loss"]) and np.isfinite(ranks[1]["loss"])
    np.testing.assert_allclose(ranks[0]["weights"], ranks[1]["weights"], rtol=1e-6)  # gradients all-reduced


def test_a_model_trained_on_batches_cut_on_two_lanes_learns_exactly_as_on_one_thread(grunfeld, monkeypatch):
    """Named batches cut on two lanes (``speedups.lanes.made_batches``: each batch made on either thread) under
    Lightning train NHiTS to the same parameters as batches cut on one thread. Lanes are forced at this small
    size (by default they start at 1 MiB a batch, B=256 L=512 and up) and every run seen going through them."""
    import lightning

    from dask_windows.runtime import batch as gathering
    from dask_windows.speedups import lanes

    path, df, table = grunfeld
    wf = workflow(df, table)
    adapter = PFAdapter(wf, WINDOW, HORIZON)

    def fitted(on_lanes: bool) -> tuple[list[torch.Tensor], int]:
        made = 0
        real, choice = lanes.made_batches, lanes.LaneChoice

        def counted(*args, **kwargs):
            nonlocal made
            made += 1
            return real(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(lanes, "lanes_wanted", lambda batch_bytes, made=True: on_lanes)
            patch.setattr(lanes, "MIN_UNITS", 1)
            patch.setattr(lanes, "UNIT_BYTES", 1)  # a unit a batch: the helper makes every other batch
            patch.setattr(lanes, "LaneChoice", lambda: choice(probes=0))  # both lanes, no timing
            patch.setattr(gathering, "_LANE_RATIO", 0)
            patch.setattr(lanes, "made_batches", counted)
            torch.manual_seed(0)
            net = pf.NHiTS.from_dataset(adapter, hidden_size=8)
            ds = WindowDataset(path, workflow=wf.named(), window=WINDOW, horizon=HORIZON, batch_size=8, seed=3)
            trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
            trainer.fit(net, adapter.loader(ds))
        return [p.detach().clone() for p in net.parameters()], made

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two, runs = fitted(True)
        one, none = fitted(False)
    finally:
        torch.set_num_threads(threads)
    assert runs >= 1 and none == 0  # the epoch's runs went through the lanes, and none without them
    assert all(torch.equal(a, b) for a, b in zip(two, one))
    torch.manual_seed(0)
    start = [p.detach() for p in pf.NHiTS.from_dataset(adapter, hidden_size=8).parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(two, start))  # it learned something
