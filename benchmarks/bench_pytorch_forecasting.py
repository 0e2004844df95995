"""PyTorch Forecasting's own ``TimeSeriesDataSet`` against named batches streamed through ``PFAdapter``.

Two measurements, each pipeline in the same run:

* **loss** (``--part loss``): a ``TemporalFusionTransformer`` trained for the same budget
  (``--steps`` optimiser steps, batch 16) on statsmodels' grunfeld (11 firms x 20 years) by each
  pipeline, for each seed in ``--seeds`` (the seed sets the initial weights and each pipeline's
  shuffle). Training windows lie in the first 16 years; the workflow and PF's normalisers are
  fitted on those rows only. The validation windows are those whose horizon starts in the last
  4 years (PF's ``min_prediction_idx=16``; here a file of each firm's last ``window + 4`` rows):
  the same 33 windows on both sides. Each model's quantile loss on its own pipeline's validation
  batch is printed, then the mean and spread over the seeds: the two differ by their shuffles,
  so the gap between the means is judged against the spread.
* **memory** (``--part memory``): peak resident memory (``ru_maxrss``) of a fresh process that
  builds each pipeline over a synthetic panel (``--series`` x ``--rows`` rows, 2 reals and a
  target) in Parquet and draws ``--batches`` batches of 128 windows through PF's layout: PF's
  ``TimeSeriesDataSet`` over the frame read with pandas, against ``WindowDataset`` (the pool
  budget ``--buffer-mib``, stride ``--stride`` so that the batches drawn cover the whole file)
  through ``PFAdapter``. The workflow is fitted (one Dask pass) and saved beforehand in its own
  process, whose peak is printed too; the import-only process is the baseline.

    python benchmarks/bench_pytorch_forecasting.py [--part loss memory] [--seeds 0 1 2] [--steps 60]
        [--series 32] [--rows 50000] [--buffer-mib 8] [--stride 64] [--batches 200]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WINDOW, HORIZON, TRAIN_YEARS = 6, 2, 16


# -- loss after a fixed budget ----------------------------------------------------------------


def grunfeld():
    import statsmodels.datasets as smd

    df = smd.grunfeld.load_pandas().data
    df["firm"] = df["firm"].astype(str)
    df["time_idx"] = (df["year"] - 1935).astype(int)
    return df


def trainer(steps: int):
    import lightning

    return lightning.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                             num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip


def quantile_loss(model, x, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        return float(model.loss(model(x)["prediction"], y))


def pf_run(df, seed: int, steps: int) -> float:
    """PF's own pipeline: ``TimeSeriesDataSet`` on the training years, validation from the same encoders."""
    import lightning
    from pytorch_forecasting import GroupNormalizer, TemporalFusionTransformer, TimeSeriesDataSet

    train = df[df["time_idx"] < TRAIN_YEARS]
    tsd = TimeSeriesDataSet(
        train, time_idx="time_idx", target="invest", group_ids=["firm"], min_encoder_length=WINDOW,
        max_encoder_length=WINDOW, min_prediction_length=HORIZON, max_prediction_length=HORIZON,
        time_varying_known_reals=["year"], time_varying_unknown_reals=["invest", "value"],
        target_normalizer=GroupNormalizer(groups=["firm"]), add_relative_time_idx=True,
    )  # fmt: skip
    valid = TimeSeriesDataSet.from_dataset(tsd, df, min_prediction_idx=TRAIN_YEARS)
    lightning.seed_everything(seed, verbose=False)
    model = TemporalFusionTransformer.from_dataset(tsd, hidden_size=8, learning_rate=0.03)
    trainer(steps).fit(model, tsd.to_dataloader(train=True, batch_size=16, num_workers=0))
    x, y = next(iter(valid.to_dataloader(train=False, batch_size=1000, num_workers=0)))
    assert len(x["groups"]) == 33, len(x["groups"])
    return quantile_loss(model, x, y)


def streamed_run(df, seed: int, steps: int, folder: str) -> float:
    """Named batches through ``PFAdapter``: the workflow fitted on the training years' rows."""
    import lightning
    from pytorch_forecasting import TemporalFusionTransformer

    from dask_windows import WindowDataset
    from dask_windows.integrations.pytorch_forecasting import PFAdapter
    from dask_windows.workflow import Normalize, Workflow

    train = df[df["time_idx"] < TRAIN_YEARS]
    held_out = df[df["time_idx"] >= TRAIN_YEARS - WINDOW]  # each firm's encoder rows, then its 4 held-out years
    train.to_parquet(f"{folder}/train.parquet", index=False)
    held_out.to_parquet(f"{folder}/valid.parquet", index=False)
    wf = Workflow([Normalize(["invest"], per_series=True), Normalize(["year", "value"])], series="firm",
                  continuous=["year", "invest", "value"], target=["invest"],
                  known=["year"]).fit(train, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, WINDOW, HORIZON, add_relative_time_idx=True)
    lightning.seed_everything(seed, verbose=False)
    model = TemporalFusionTransformer.from_dataset(adapter, hidden_size=8, learning_rate=0.03)
    ds = WindowDataset(f"{folder}/train.parquet", workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON,
                       batch_size=16, seed=seed, drop_last=True)  # fmt: skip
    trainer(steps).fit(model, adapter.loader(ds))
    valid = WindowDataset(f"{folder}/valid.parquet", workflow=wf.named(index=True), window=WINDOW,
                          horizon=HORIZON, batch_size=1000, shuffle=False)  # fmt: skip
    x, y = adapter(next(iter(valid)))
    assert len(x["groups"]) == 33, len(x["groups"])
    return quantile_loss(model, x, y)


def loss_part(args) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # Lightning's and PF's advice on every fit
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    df = grunfeld()
    found: dict = {"PF TimeSeriesDataSet": [], "streamed PFAdapter": []}
    with tempfile.TemporaryDirectory() as folder:
        for seed in args.seeds:
            start = time.perf_counter()
            found["PF TimeSeriesDataSet"].append(pf_run(df, seed, args.steps))
            middle = time.perf_counter()
            found["streamed PFAdapter"].append(streamed_run(df, seed, args.steps, folder))
            print(f"seed {seed}: PF {found['PF TimeSeriesDataSet'][-1]:.3f} ({middle - start:.1f} s), "
                  f"streamed {found['streamed PFAdapter'][-1]:.3f} ({time.perf_counter() - middle:.1f} s)",
                  flush=True)  # fmt: skip
    print(f"\nvalidation quantile loss after {args.steps} steps (batch 16), TFT hidden 8, grunfeld, 33 windows")
    print("| pipeline | per seed | mean | std |")
    print("|---|---|---:|---:|")
    for name, values in found.items():
        per_seed = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"| {name} | {per_seed} | {np.mean(values):.3f} | {np.std(values, ddof=1) if len(values) > 1 else 0:.3f} |"
        )
    gap = np.mean(found["streamed PFAdapter"]) - np.mean(found["PF TimeSeriesDataSet"])
    spread = np.sqrt(sum(np.var(v, ddof=1) for v in found.values()) / len(args.seeds)) if len(args.seeds) > 1 else 0
    print(f"gap of the means {gap:+.3f}, its standard error {spread:.3f}")


# -- memory -----------------------------------------------------------------------------------


def write_panel(folder: str, series: int, rows: int) -> str:
    """``series`` x ``rows`` rows: a random walk target and two reals, 8 files (series in order)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    path = f"{folder}/panel"
    os.makedirs(path, exist_ok=True)
    for part, ids in enumerate(np.array_split(np.arange(series), 8)):
        n = len(ids) * rows
        frame = pd.DataFrame({
            "sid": np.repeat([f"s{i:03d}" for i in ids], rows),
            "time_idx": np.tile(np.arange(rows), len(ids)),
            "y": np.cumsum(rng.normal(size=n)).astype(np.float64) + 100.0,
            "a": rng.normal(size=n),
            "b": rng.normal(size=n),
        })  # fmt: skip
        frame.to_parquet(f"{path}/part-{part}.parquet", index=False, row_group_size=rows // 4)
    return path


def child(kind: str, config: dict) -> dict:
    """One pipeline in this (fresh) process; returns its figures."""
    import torch

    start = time.perf_counter()
    figures: dict = {}
    if kind == "imports":
        import pytorch_forecasting  # noqa: F401

        from dask_windows.integrations.pytorch_forecasting import PFAdapter  # what the streamed process imports
    elif kind == "fit":
        from dask_windows.workflow import Normalize, Workflow

        wf = Workflow([Normalize(["y"], per_series=True), Normalize(["a", "b"])], series="sid",
                      continuous=["a", "b", "y"], target=["y"], known=["a"])  # fmt: skip
        wf.fit(config["data"], scheduler="sync")
        wf.save(config["workflow"])
    elif kind == "pf":
        import pandas as pd
        from pytorch_forecasting import GroupNormalizer, TimeSeriesDataSet

        frame = pd.read_parquet(config["data"])
        tsd = TimeSeriesDataSet(
            frame, time_idx="time_idx", target="y", group_ids=["sid"], min_encoder_length=config["window"],
            max_encoder_length=config["window"], max_prediction_length=config["horizon"],
            min_prediction_length=config["horizon"], time_varying_known_reals=["a"],
            time_varying_unknown_reals=["b", "y"], target_normalizer=GroupNormalizer(groups=["sid"]),
        )  # fmt: skip
        del frame
        figures["built_s"] = time.perf_counter() - start
        loader = tsd.to_dataloader(train=True, batch_size=128, num_workers=0)
        figures["windows"] = len(tsd)
        for i, _batch in enumerate(loader):
            if i + 1 == config["batches"]:
                break
    elif kind == "streamed":
        from dask_windows import WindowDataset
        from dask_windows.integrations.pytorch_forecasting import PFAdapter
        from dask_windows.workflow import Workflow

        wf = Workflow.load(config["workflow"])
        adapter = PFAdapter(wf, config["window"], config["horizon"])
        ds = WindowDataset(config["data"], workflow=wf.named(index=True), window=config["window"],
                           horizon=config["horizon"], batch_size=128, stride=config["stride"],
                           buffer_bytes=config["buffer_mib"] << 20)  # fmt: skip
        figures["built_s"] = time.perf_counter() - start
        figures["windows"] = ds.num_windows
        for i, batch in enumerate(ds):
            adapter(batch)
            if i + 1 == config["batches"]:
                break
        figures["drawn"] = (i + 1) * 128
    del torch
    figures["seconds"] = time.perf_counter() - start
    figures["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return figures


def memory_part(args) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = write_panel(folder, args.series, args.rows)
        size = sum(os.path.getsize(f"{data}/{f}") for f in os.listdir(data))
        config = {"data": data, "workflow": f"{folder}/wf.json", "window": 96, "horizon": 24,
                  "stride": args.stride, "buffer_mib": args.buffer_mib, "batches": args.batches}  # fmt: skip
        rows = args.series * args.rows
        print(
            f"{args.series} series x {args.rows} rows = {rows:,} rows ({rows * 8 * 3 / 2**20:.0f} MiB of float64 "
            f"values, {size / 2**20:.0f} MiB of Parquet), window 96, horizon 24, batch 128, "
            f"{args.batches} batches; pool {args.buffer_mib} MiB, stride {args.stride}"
        )
        print("| process | peak RSS (MiB) | seconds | windows |")
        print("|---|---:|---:|---:|")
        for kind in ("imports", "fit", "pf", "streamed"):
            out = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(config)], capture_output=True,
                                 text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {kind} | {got['peak_rss_mib']:.0f} | {got['seconds']:.1f} | {got.get('windows', '')} |",
                  flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", nargs="+", default=["loss", "memory"], choices=["loss", "memory"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--series", type=int, default=32)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--buffer-mib", type=int, default=8)
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "CONFIG"))
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(child(args.child[0], json.loads(args.child[1]))))
        return
    if "loss" in args.part:
        loss_part(args)
    if "memory" in args.part:
        memory_part(args)


if __name__ == "__main__":
    main()
