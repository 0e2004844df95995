"""Forecast weekly Mauna Loa CO2 with covariates fitted on the training period only, and a PyTorch Forecasting model.

    OMP_NUM_THREADS=1 python examples/forecast_covariates.py     # about 20 s on 2 CPU cores

Data: statsmodels' ``co2`` (weekly ppm since 1958, 59 missing weeks), shipped with statsmodels;
nothing is downloaded. It is written as Parquet (one series per decade, its week counted from 0,
a season category) into ``--out``, and a workflow is fitted on it with Dask: forward fill (at most
18 weeks, the longest gap) with an observed mask, per-series normalisation of the target, season
codes, month as sine/cosine, a static table per decade (its first year, numeric, and an era,
categorical). The 1950s and 2000s are shorter than a window: the loader says so and leaves them
out. The loader streams named batches: the past 2 years (``past_cont``, ``past_cat``),
the statics, the calendar over the next ``--horizon`` weeks (``future_cont``, ``future_cat``)
and the target with its scale.

The first 7 years of each decade train, the rest is held out. The workflow's statistics (each
decade's mean and std, the vocabularies) are fitted on the training weeks only,
``wf.fit(path, at=TRAIN_WEEKS, time="week")``: the rows of ``ds.split(at=TRAIN_WEEKS, time="week")``'s
train part, so nothing about the held-out weeks leaks into the inputs. A held-out window reads no
training week either: it starts after the fill's 18 look-back rows.

Scored in ppm on the same held-out windows:

* a small model of ours on the named batches (season and era embeddings, an MLP correcting the
  seasonal-naive forecast; its predictions inverted with the per-window scale);
* PyTorch Forecasting's ``NHiTS`` (it reads the statics and the known calendar too) trained with
  Lightning on the same streamed batches through ``PFAdapter``, and the same model, seed and number
  of steps on PF's own in-memory ``TimeSeriesDataSet`` built with pandas from the same rows and
  windows (its ``GroupNormalizer`` fitted on the training weeks too). The two differ in their
  shuffles, so the gap between them is noise. Without PyTorch Forecasting and Lightning this part
  is skipped, with the reason and the install line printed;
* the seasonal-naive forecast (the value 52 weeks earlier).

A plot of a few held-out forecasts of our model in ppm is written to ``--out/forecasts.png``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings

import numpy as np
import pandas as pd
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dask_windows import WindowDataset
from dask_windows.workflow import Categorify, FillMissing, Normalize, Statics, TimeFeatures, Workflow, invert_target

SEASON = 52  # weeks
TRAIN_WEEKS = 365  # the first 7 years of each decade train; the weeks from 365 on are held out
FILL_LIMIT = 18  # weeks: the longest gap in the data (1964), so every week of a window has a value


def write_data(out: str) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """The co2 series as Parquet (one series per decade), the same rows as a frame, and the decades' statics."""
    import statsmodels.datasets as smd

    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    df["week"] = df.groupby("decade").cumcount()  # the time that the split and the fit compare with
    seasons = np.array(["winter", "spring", "summer", "autumn"])
    df["season"] = seasons[(df["date"].dt.month.to_numpy() % 12) // 3]
    path = os.path.join(out, "co2.parquet")
    df.to_parquet(path, index=False, row_group_size=256)
    first = df.groupby("decade")["date"].min().dt.year
    table = pd.DataFrame({"decade": first.index, "first_year": (first.to_numpy() - 1990) / 30.0})
    table["era"] = np.where(first.to_numpy() < 1980, "early", "late")
    return path, df, table


def workflow(table: pd.DataFrame) -> Workflow:
    return Workflow(
        [
            FillMissing(["co2"], method="ffill", limit=FILL_LIMIT, mask=True),
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


# -- our model, on the named batches -------------------------------------------------------------


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


def train_ours(wf: Workflow, train: WindowDataset, window: int, horizon: int, epochs: int, seed: int) -> Forecaster:
    torch.manual_seed(seed)
    model = Forecaster(wf, window, horizon)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    for epoch in range(epochs):
        total = 0.0
        for b in train:
            loss = nn.functional.mse_loss(model(b), b["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b["target"])
        if epoch % 4 == 0 or epoch == epochs - 1:
            print(f"epoch {epoch:>3}  train MSE (scaled) {total / train.num_windows:.4f}", flush=True)
    return model


def score_ours(model: Forecaster, valid: WindowDataset, key, window: int, horizon: int) -> tuple[dict, list]:
    """Per held-out window (keyed by decade and first week): our and the seasonal-naive absolute errors in
    ppm; and a few windows to plot."""
    model.eval()
    errors, shown = {}, []
    with torch.no_grad():
        for b in valid:
            truth = invert_target(b["target"], b)  # ppm (the forward-filled values)
            pred = invert_target(model(b), b)
            past = invert_target(b["past_cont"][:, :1], b)  # the window's co2 in ppm, (B, 1, L)
            naive = past[..., window - SEASON : window - SEASON + horizon]  # 52 weeks earlier
            model_error, naive_error = (pred - truth).abs().mean((1, 2)), (naive - truth).abs().mean((1, 2))
            for row, e, n in zip(b["index"].tolist(), model_error.tolist(), naive_error.tolist()):
                errors[key(row)] = (e, n)  # b["index"]: the window's first row in the file
            if len(shown) < 4:
                shown.append((past[0, 0].numpy(), truth[0, 0].numpy(), pred[0, 0].numpy()))
    return errors, shown


# -- PyTorch Forecasting's NHiTS: streamed through PFAdapter, and on PF's own TimeSeriesDataSet ---


def pf_missing() -> str | None:
    """Why the PF part cannot run here (``None`` when it can)."""
    try:
        import lightning  # noqa: F401
        import pytorch_forecasting  # noqa: F401
    except ImportError as exc:
        return (
            f"{exc}; install them without replacing torch: "
            'pip install -c .ci/constraints.txt "lightning>=2.2" && '
            'pip install --no-deps "pytorch-forecasting==1.8.0" "scikit-base==1.0.2"'
        )
    return None


def nhits(dataset, seed: int):
    """The same small NHiTS (MLPs, fast on a CPU) from a ``TimeSeriesDataSet`` or a ``PFAdapter``: both give
    ``from_dataset`` the same variables, lengths and target normaliser."""
    from pytorch_forecasting import NHiTS

    # The same embedding widths in both: the workflow's codes have two more rows than PF's (null and
    # unseen), from which PF's sizing rule would make the streamed model's embeddings wider.
    encoders = dataset.get_parameters()["categorical_encoders"]
    embedding_sizes = {name: (len(encoders[name].classes_), 3) for name in ("era", "season")}
    torch.manual_seed(seed)  # the same seed in both pipelines
    return NHiTS.from_dataset(dataset, hidden_size=64, learning_rate=3e-3, embedding_sizes=embedding_sizes)


def fit_steps(model, loader, steps: int) -> None:
    import lightning

    trainer = lightning.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", gradient_clip_val=0.1)  # fmt: skip
    trainer.fit(model, loader)


def score_pf(model, batches, keys) -> dict:
    """Per held-out window (by key): the model's mean absolute error in ppm."""
    model.eval()
    errors = {}
    with torch.no_grad():
        for x, (y, _) in batches:
            predicted = model.to_prediction(model(x))  # (B, H), in ppm: PF undoes the target's scale
            errors.update(zip(keys(x), (predicted - y).abs().mean(1).tolist()))
    return errors


def in_memory_frame(df: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """What PF's ``TimeSeriesDataSet`` reads: the workflow's inputs computed with pandas, in ppm."""
    frame = df.merge(table, on="decade")
    frame["co2_observed"] = frame["co2"].notna().astype("float32")
    frame["co2"] = frame.groupby("decade")["co2"].ffill(limit=FILL_LIMIT)
    month = frame["date"].dt.month.to_numpy()
    frame["date_month_sin"] = np.sin(2 * np.pi * (month - 1) / 12)  # TimeFeatures' cyclic month
    frame["date_month_cos"] = np.cos(2 * np.pi * (month - 1) / 12)
    return frame


def pf_in_memory(frame: pd.DataFrame, window: int, horizon: int, steps: int, batch_size: int, seed: int) -> dict:
    """PF's own pipeline: a ``TimeSeriesDataSet`` on the training weeks, the same model and steps."""
    from pytorch_forecasting import GroupNormalizer, TimeSeriesDataSet

    reals = ["first_year", "date_month_sin", "date_month_cos", "co2_observed"]
    tsd = TimeSeriesDataSet(
        frame[frame["week"] < TRAIN_WEEKS], time_idx="week", target="co2", group_ids=["decade"],
        max_encoder_length=window, max_prediction_length=horizon, static_categoricals=["era"],
        static_reals=["first_year"], time_varying_known_reals=["date_month_sin", "date_month_cos"],
        time_varying_known_categoricals=["season"], time_varying_unknown_reals=["co2", "co2_observed"],
        target_normalizer=GroupNormalizer(groups=["decade"]),  # the workflow's per-decade Normalize
        scalers=dict.fromkeys(reals),  # the other reals unscaled, as the workflow gives them
        min_prediction_idx=FILL_LIMIT + window,  # the streamed windows start after the fill's look-back rows
    )  # fmt: skip
    model = nhits(tsd, seed)
    fit_steps(model, tsd.to_dataloader(train=True, batch_size=batch_size, num_workers=0), steps)
    # The split's held-out windows start after the fill's look-back rows too: they read no training week.
    held_out = TimeSeriesDataSet.from_dataset(tsd, frame, min_prediction_idx=TRAIN_WEEKS + FILL_LIMIT + window,
                                              stop_randomization=True)  # fmt: skip
    decades = {code: name for name, code in tsd._categorical_encoders["__group_id__decade"].classes_.items()}

    def keys(x: dict) -> list:
        first = (x["decoder_time_idx"][:, 0] - window).tolist()  # the window's first week
        return [(decades[int(g)], w) for g, w in zip(x["groups"][:, 0], first)]

    return score_pf(model, held_out.to_dataloader(train=False, batch_size=256, num_workers=0), keys)


def pf_streamed(wf: Workflow, train: WindowDataset, valid: WindowDataset, key, window: int, horizon: int,
                steps: int, seed: int) -> dict:  # fmt: skip
    """The same model on the streamed batches: ``PFAdapter`` is what ``from_dataset`` reads and the collate."""
    from dask_windows.integrations.pytorch_forecasting import PFAdapter

    adapter = PFAdapter(wf, window, horizon)
    model = nhits(adapter, seed)
    fit_steps(model, adapter.loader(train), steps)

    def keys(x: dict) -> list:
        return [key(row) for row in (x["decoder_time_idx"][:, 0] - window).tolist()]  # global first row

    return score_pf(model, (adapter(b) for b in valid), keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/forecast_covariates", help="output folder (data, workflow, plot)")
    parser.add_argument("--window", type=int, default=2 * SEASON)
    parser.add_argument("--horizon", type=int, default=13)
    parser.add_argument("--epochs", type=int, default=12, help="our model's epochs")
    parser.add_argument("--pf-steps", type=int, default=150, help="NHiTS' optimizer steps, in each pipeline")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="of the initial weights and the shuffles")
    args = parser.parse_args()
    started = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    path, df, table = write_data(args.out)
    # Statistics from the training weeks only; a LocalCluster without scheduler=: see docs/workflows.md.
    wf = workflow(table).fit(path, at=TRAIN_WEEKS, time="week", scheduler="threads")
    wf.save(os.path.join(args.out, "workflow.json"))
    ds = WindowDataset(path, workflow=Workflow.load(os.path.join(args.out, "workflow.json")).named(index=True),
                       window=args.window, horizon=args.horizon, batch_size=args.batch_size, seed=args.seed)  # fmt: skip
    train, valid = ds.split(at=TRAIN_WEEKS, time="week")  # the same weeks as the fit
    decade, week = df["decade"].to_numpy(), df["week"].to_numpy()

    def key(row: int) -> tuple:
        return decade[row], int(week[row])  # a window's global first row -> (decade, first week)

    model = train_ours(wf, train, args.window, args.horizon, args.epochs, args.seed)
    errors, shown = score_ours(model, valid, key, args.window, args.horizon)
    mae, naive_mae = (float(np.mean([e[i] for e in errors.values()])) for i in (0, 1))
    print(f"held-out MAE: model {mae:.3f} ppm, seasonal naive {naive_mae:.3f} ppm (ratio {mae / naive_mae:.2f}), "
          f"{valid.num_windows} windows")  # fmt: skip
    plot(shown, args.window, os.path.join(args.out, "forecasts.png"))

    missing = pf_missing()
    if missing:
        print(f"NHiTS skipped: PyTorch Forecasting and Lightning are needed ({missing})")
    else:
        warnings.filterwarnings("ignore")  # Lightning's and PF's advice on every run
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        streamed = pf_streamed(wf, train, valid, key, args.window, args.horizon, args.pf_steps, args.seed)
        frame = in_memory_frame(df, table)
        in_memory = pf_in_memory(frame, args.window, args.horizon, args.pf_steps, args.batch_size, args.seed)
        if set(streamed) != set(errors) or set(in_memory) != set(errors):
            raise SystemExit(f"the pipelines scored other windows: {sorted(set(in_memory) ^ set(errors))[:3]}")
        print(f"held-out MAE: NHiTS ({args.pf_steps} steps) streamed through PFAdapter "
              f"{np.mean(list(streamed.values())):.3f} ppm, on PF's TimeSeriesDataSet in memory "
              f"{np.mean(list(in_memory.values())):.3f} ppm, seasonal naive {naive_mae:.3f} ppm, "
              f"the same {len(errors)} windows")  # fmt: skip
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
