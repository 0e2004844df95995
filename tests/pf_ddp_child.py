"""A PyTorch Forecasting TFT trained through Lightning's DDP on two CPU ranks (gloo), on named batches.

Run as a script (``python pf_ddp_child.py CONFIG_JSON``): Lightning's ``ddp`` strategy starts the
other rank by running this script again. Each rank writes which windows it trained on (series code
and first horizon row) and a fingerprint of the weights after training.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)

import lightning.pytorch as pl  # noqa: E402
import pandas as pd  # noqa: E402
from pytorch_forecasting import TemporalFusionTransformer  # noqa: E402

import dask_windows as dw  # noqa: E402
from dask_windows.integrations.pytorch_forecasting import PFAdapter  # noqa: E402
from dask_windows.workflow import Normalize, Transform, Workflow  # noqa: E402


class Seen(pl.Callback):
    """``(series code, first horizon row)`` of every window each training step ran on."""

    def __init__(self) -> None:
        self.windows: list = []
        self.steps = 0

    def on_train_batch_start(self, trainer, module, batch, index):
        x, _ = batch
        self.windows += zip(x["groups"][:, 0].tolist(), x["decoder_time_idx"][:, 0].tolist())
        self.steps += 1


def main(config: dict) -> None:
    window, horizon = config["window"], config["horizon"]
    frame = pd.read_parquet(config["data"])
    wf = Workflow([Transform(["invest"], "log"), Normalize(["invest"], per_series=True), Normalize(["year"])],
                  series="firm", continuous=["year", "invest"], target=["invest"],
                  known=["year"]).fit(frame, scheduler="sync")  # fmt: skip
    adapter = PFAdapter(wf, window, horizon, add_relative_time_idx=True)
    ds = dw.WindowDataset(config["data"], workflow=wf.named(index=True), window=window, horizon=horizon,
                          batch_size=8, seed=5)  # fmt: skip
    torch.manual_seed(0)  # the same initial weights on both ranks (DDP also broadcasts rank 0's)
    model = TemporalFusionTransformer.from_dataset(adapter, hidden_size=8, learning_rate=0.03)
    seen = Seen()
    fit = pl.Trainer(max_epochs=1, accelerator="cpu", strategy="ddp", devices=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, callbacks=[seen])  # fmt: skip
    fit.fit(model, adapter.loader(ds))
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    out = {"rank": fit.global_rank, "steps": seen.steps, "windows": seen.windows, "num_windows": ds.num_windows,
           "weights": [float(weights.sum()), float(weights.abs().sum())],
           "loss": float(fit.callback_metrics["train_loss_step"])}  # fmt: skip
    path = os.path.join(config["out"], f"rank{fit.global_rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)  # whole or absent
    if fit.global_rank == 0:  # the test waits for rank 0: it exits once rank 1 has written its figures
        deadline = time.monotonic() + 300
        other = os.path.join(config["out"], "rank1.json")
        while not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
