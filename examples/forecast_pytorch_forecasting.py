"""Forecast weekly Mauna Loa CO2 with a PyTorch Forecasting model streamed from Parquet, beside PF's own pipeline.

    python examples/forecast_pytorch_forecasting.py                 # NHiTS, about a minute on 2 CPU cores
    python examples/forecast_pytorch_forecasting.py --model tft     # TemporalFusionTransformer

Data: statsmodels' ``co2`` (weekly ppm since 1958; its 59 missing weeks interpolated, so both
pipelines see the same rows), one series per decade, a season category and the month as sine and
cosine (known over the horizon). The first 70% of each decade trains, the rest is held out.

Streamed: a workflow (per-decade normalisation of the target, season codes) is fitted on the
training rows only, the rows are read from Parquet by ``WindowDataset`` and ``PFAdapter`` hands
PF's model its batches. In memory: PF's ``TimeSeriesDataSet`` on the training frame (its
``GroupNormalizer`` fitted there too), the same model and budget. Both are scored in ppm on the
same held-out windows (matched by decade and start week), beside the seasonal-naive forecast (the
value 52 weeks earlier).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dask_windows import WindowDataset
from dask_windows.integrations.pytorch_forecasting import PFAdapter
from dask_windows.workflow import Categorify, Normalize, Workflow

SEASON = 52  # weeks
VALID = 0.3  # held-out fraction of each decade


def write_data(out: str) -> tuple[str, pd.DataFrame]:
    """The co2 series as Parquet (one series per decade, in the file's row order) and the same frame."""
    import statsmodels.datasets as smd

    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["co2"] = df["co2"].interpolate().bfill()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    df["week"] = df.groupby("decade").cumcount()  # PF's time index, within each decade
    month = df["date"].dt.month.to_numpy()
    df["month_sin"], df["month_cos"] = np.sin(2 * np.pi * month / 12), np.cos(2 * np.pi * month / 12)
    df["season"] = np.array(["winter", "spring", "summer", "autumn"])[(month % 12) // 3]
    df = df.drop(columns=["date"])
    path = os.path.join(out, "co2.parquet")
    df.to_parquet(path, index=False, row_group_size=512)
    return path, df


def training_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The first ``1 - VALID`` of each decade: what ``ds.split(valid=VALID)``'s training windows read."""
    rows = df.groupby("decade")["week"].transform("size")
    return df[df["week"] < np.floor(rows * (1 - VALID))]


def model_class(name: str) -> type:
    from pytorch_forecasting import NHiTS, TemporalFusionTransformer

    return {"nhits": NHiTS, "tft": TemporalFusionTransformer}[name]


def hparams(name: str) -> dict:
    if name == "tft":
        return dict(hidden_size=16, attention_head_size=2, learning_rate=3e-3)
    return dict(learning_rate=3e-3, hidden_size=64)


def fit(model, loader, epochs: int) -> None:
    import lightning

    trainer = lightning.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", gradient_clip_val=0.1)  # fmt: skip
    trainer.fit(model, loader)


def scores(model, batches, keys) -> dict:
    """Per held-out window (by key): the model's and the seasonal-naive absolute errors, in ppm, averaged."""
    model.eval()
    out = {}
    with torch.no_grad():
        for x, (y, _) in batches:
            predicted = model.to_prediction(model(x))  # (B, H) in ppm
            window = x["encoder_target"].shape[1]
            naive = x["encoder_target"][:, window - SEASON : window - SEASON + y.shape[1]]
            for key, p, n, t in zip(keys(x), predicted, naive, y):
                out[key] = (float((p - t).abs().mean()), float((n - t).abs().mean()))
    return out


def main() -> None:
    try:
        import lightning  # noqa: F401
        import pytorch_forecasting  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"this example needs PyTorch Forecasting and Lightning ({exc}); install them without replacing torch: "
            'pip install -c .ci/constraints.txt "lightning>=2.2" && '
            'pip install --no-deps "pytorch-forecasting==1.8.0" "scikit-base==1.0.2"'
        ) from exc
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/forecast_pytorch_forecasting", help="output folder (data)")
    parser.add_argument("--model", choices=["nhits", "tft"], default="nhits")
    parser.add_argument("--window", type=int, default=2 * SEASON)
    parser.add_argument("--horizon", type=int, default=13)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # Lightning's and PF's advice on every run
    started = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    path, df = write_data(args.out)
    train_df = training_rows(df)
    cls = model_class(args.model)

    # Streamed: a workflow fitted on the training rows only, windows read from Parquet.
    wf = Workflow([Normalize(["co2"], per_series=True), Categorify(["season"])], series="decade",
                  continuous=["month_sin", "month_cos", "co2"], categorical=["season"], target=["co2"],
                  known=["month_sin", "month_cos", "season"]).fit(train_df, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, args.window, args.horizon, add_relative_time_idx=args.model == "tft")
    ds = WindowDataset(path, workflow=wf.named(index=True), window=args.window, horizon=args.horizon,
                       batch_size=args.batch_size, seed=0)  # fmt: skip
    train, valid = ds.split(valid=VALID)
    torch.manual_seed(0)
    ours = cls.from_dataset(adapter, **hparams(args.model))
    fit(ours, adapter.loader(train), args.epochs)
    decade, week = df["decade"].to_numpy(), df["week"].to_numpy()

    def our_keys(x: dict) -> list:
        first = x["decoder_time_idx"][:, 0].numpy() - args.window  # the window's first row in the file
        return list(zip(decade[first], week[first]))

    streamed = scores(ours, (adapter(b) for b in valid), our_keys)

    # In memory: PF's TimeSeriesDataSet on the training frame, the same model and budget.
    from pytorch_forecasting import GroupNormalizer, TimeSeriesDataSet

    tsd = TimeSeriesDataSet(
        train_df, time_idx="week", target="co2", group_ids=["decade"], max_encoder_length=args.window,
        max_prediction_length=args.horizon, time_varying_known_reals=["month_sin", "month_cos"],
        time_varying_known_categoricals=["season"], time_varying_unknown_reals=["co2"],
        target_normalizer=GroupNormalizer(groups=["decade"]), scalers={"month_sin": None, "month_cos": None},
        add_relative_time_idx=args.model == "tft",
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = cls.from_dataset(tsd, **hparams(args.model))
    fit(theirs, tsd.to_dataloader(train=True, batch_size=args.batch_size, num_workers=0), args.epochs)
    every = TimeSeriesDataSet.from_dataset(tsd, df, stop_randomization=True)
    names = {v: k for k, v in tsd._categorical_encoders["__group_id__decade"].classes_.items()}

    def their_keys(x: dict) -> list:
        first = x["decoder_time_idx"][:, 0].numpy() - args.window
        return [(names[int(g)], int(w)) for g, w in zip(x["groups"][:, 0], first)]

    in_memory = scores(theirs, every.to_dataloader(train=False, batch_size=256, num_workers=0), their_keys)

    held_out = sorted(streamed)
    missing = [k for k in held_out if k not in in_memory]
    if missing:
        raise SystemExit(f"{len(missing)} held-out windows are not among PF's windows, e.g. {missing[:3]}")
    ours_mae = np.mean([streamed[k][0] for k in held_out])
    naive_mae = np.mean([streamed[k][1] for k in held_out])
    theirs_mae = np.mean([in_memory[k][0] for k in held_out])
    print(f"held-out MAE over {len(held_out)} windows ({args.model}, {args.epochs} epochs): "
          f"streamed {ours_mae:.3f} ppm, PF in memory {theirs_mae:.3f} ppm, seasonal naive {naive_mae:.3f} ppm "
          f"({time.perf_counter() - started:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
