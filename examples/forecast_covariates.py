"""Forecast weekly Mauna Loa CO2 with categorical embeddings, static and known-future covariates.

    python examples/forecast_covariates.py            # about 30 s on 2 idle CPU cores

Data: statsmodels' ``co2`` (weekly ppm since 1958, 59 missing weeks), shipped with statsmodels;
nothing is downloaded. It is written as Parquet (one series per decade, a season category) into
``--out``, and a workflow is fitted on it with Dask: forward fill (limit 3 weeks) with an
observed mask, per-series normalisation of the target, season codes, month as sine/cosine, a
static table per decade (its first year, numeric, and an era, categorical). The loader streams
named batches: the past 2 years (``past_cont``, ``past_cat``), the statics, the calendar over
the next ``--horizon`` weeks (``future_cont``, ``future_cat``) and the target with its scale.

A small model (season and era embeddings, an MLP correcting the seasonal-naive forecast) trains on the first 70% of each decade and
is scored on the rest in ppm (its predictions inverted with the per-window scale) against the
seasonal-naive forecast (the value 52 weeks earlier). A plot of a few held-out forecasts in ppm
is written to ``--out/forecasts.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pandas as pd
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dask_windows import WindowDataset
from dask_windows.workflow import Categorify, FillMissing, Normalize, Statics, TimeFeatures, Workflow, invert_target

SEASON = 52  # weeks


def write_data(out: str) -> tuple[str, pd.DataFrame]:
    """The co2 series as Parquet (one series per decade) and the static table of the decades."""
    import statsmodels.datasets as smd

    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    seasons = np.array(["winter", "spring", "summer", "autumn"])
    df["season"] = seasons[(df["date"].dt.month.to_numpy() % 12) // 3]
    path = os.path.join(out, "co2.parquet")
    df.to_parquet(path, index=False, row_group_size=256)
    first = df.groupby("decade")["date"].min().dt.year
    table = pd.DataFrame({"decade": first.index, "first_year": (first.to_numpy() - 1990) / 30.0})
    table["era"] = np.where(first.to_numpy() < 1980, "early", "late")
    return path, table


def workflow(table: pd.DataFrame) -> Workflow:
    return Workflow(
        [
            FillMissing(["co2"], method="ffill", limit=3, mask=True),
            Normalize(["co2"], per_series=True),
            Categorify(["season"]),
            TimeFeatures("date", ["month"], cyclic=True),
        ],
        series="decade",
        continuous=["co2", "co2_observed", "date_month_sin", "date_month_cos"],
        categorical=["season"],
        target=["co2"],
        known=["date_month_sin", "date_month_cos", "season"],
        statics=Statics(table, numeric=["first_year"], categorical=["era"]),
    )


class Forecaster(nn.Module):
    """Embeddings of the season (past and future) and the era; an MLP over everything -> ``horizon`` values."""

    def __init__(self, wf: Workflow, window: int, horizon: int, width: int = 128, dim: int = 4) -> None:
        super().__init__()
        self.season = nn.Embedding(wf.cardinality("season"), dim)
        self.era = nn.Embedding(wf.cardinality("era"), dim)
        inputs = window * (len(wf.continuous) + dim) + horizon * (2 + dim) + 1 + dim
        self.mlp = nn.Sequential(nn.Linear(inputs, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, horizon))  # fmt: skip

    def forward(self, b: dict) -> torch.Tensor:
        """The seasonal-naive forecast (the scaled value 52 weeks earlier) plus a learned correction."""
        past = torch.cat([b["past_cont"], self.season(b["past_cat"][:, 0]).transpose(1, 2)], 1)  # (B, C+d, L)
        future = torch.cat([b["future_cont"], self.season(b["future_cat"][:, 0]).transpose(1, 2)], 1)  # (B, 2+d, H)
        static = torch.cat([b["static_cont"], self.era(b["static_cat"][:, 0])], 1)  # (B, 1+d)
        flat = torch.cat([past.flatten(1), future.flatten(1), static], 1)
        window, horizon = b["past_cont"].shape[-1], b["future_cont"].shape[-1]
        naive = b["past_cont"][:, 0, window - SEASON : window - SEASON + horizon]  # (B, H)
        return (naive + self.mlp(flat))[:, None, :]  # (B, 1, H) like the target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/forecast_covariates", help="output folder (data, workflow, plot)")
    parser.add_argument("--window", type=int, default=2 * SEASON)
    parser.add_argument("--horizon", type=int, default=13)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    path, table = write_data(args.out)
    wf = workflow(table).fit(path, scheduler="threads")  # a LocalCluster without scheduler=: see docs/workflows.md
    wf.save(os.path.join(args.out, "workflow.json"))
    ds = WindowDataset(path, workflow=Workflow.load(os.path.join(args.out, "workflow.json")).named(),
                       window=args.window, horizon=args.horizon, batch_size=args.batch_size, nan="drop", seed=0)  # fmt: skip
    train, valid = ds.split(valid=0.3)
    model = Forecaster(wf, args.window, args.horizon)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    for epoch in range(args.epochs):
        total = 0.0
        for b in train:
            loss = nn.functional.mse_loss(model(b), b["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b["target"])
        if epoch % 4 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:>3}  train MSE (scaled) {total / train.num_windows:.4f}", flush=True)
    model.eval()
    errors, naive_errors, shown = [], [], []
    with torch.no_grad():
        for b in valid:
            truth = invert_target(b["target"], b)  # ppm (the forward-filled values)
            pred = invert_target(model(b), b)
            past = invert_target(b["past_cont"][:, :1], b)  # the window's co2 in ppm, (B, 1, L)
            naive = past[..., args.window - SEASON : args.window - SEASON + args.horizon]  # 52 weeks earlier
            errors.append((pred - truth).abs().flatten())
            naive_errors.append((naive - truth).abs().flatten())
            if len(shown) < 4:
                shown.append((past[0, 0].numpy(), truth[0, 0].numpy(), pred[0, 0].numpy()))
    mae, naive_mae = float(torch.cat(errors).mean()), float(torch.cat(naive_errors).mean())
    print(f"held-out MAE: model {mae:.3f} ppm, seasonal naive {naive_mae:.3f} ppm (ratio {mae / naive_mae:.2f}), "
          f"{valid.num_windows} windows")  # fmt: skip
    plot(shown, args.window, os.path.join(args.out, "forecasts.png"))
    print(f"plot: {os.path.join(args.out, 'forecasts.png')}  ({time.perf_counter() - started:.0f} s)")


def plot(shown: list, window: int, where: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 2.2 * len(shown)), squeeze=False)
    for ax, (past, truth, pred) in zip(axes[:, 0], shown):
        ahead = np.arange(window, window + len(truth))
        ax.plot(np.arange(window), past, color="0.4", lw=1, label="past")
        ax.plot(ahead, truth, color="k", lw=1.5, label="truth")
        ax.plot(ahead, pred, color="tab:red", lw=1.5, label="forecast")
        ax.set_ylabel("CO2 (ppm)")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("week of the window")
    fig.tight_layout()
    fig.savefig(where, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    main()
