"""A small Lightning run over a WindowDataModule; records which windows each step trained on.

Run as a script (``python lightning_child.py CONFIG_JSON``) for DDP: Lightning's ``ddp`` strategy
starts the other rank by running this script again.
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

import dask_windows as dw  # noqa: E402
from dask_windows.integrations.lightning import WindowDataModule  # noqa: E402


class Recorder(pl.LightningModule):
    """A linear model; ``seen`` holds ``(epoch, step, window start rows)`` of every training step."""

    def __init__(self, window: int, stop_at: int | None = None, save_to: str | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(window, 1)
        self.seen: list = []
        self.validated: list = []
        self.stop_at, self.save_to = stop_at, save_to

    def training_step(self, batch, index):
        x, y, start = batch
        self.seen.append((self.current_epoch, index, start.numpy().copy()))
        return torch.nn.functional.mse_loss(self.net(x[:, 0, :]), y)

    def on_train_batch_end(self, outputs, batch, index):
        if self.stop_at is not None and self.trainer.global_step == self.stop_at:
            self.trainer.save_checkpoint(self.save_to)
            raise Interrupted(self.stop_at)

    def validation_step(self, batch, index):
        self.validated.append((self.current_epoch, batch[-1].numpy().copy()))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


class Interrupted(Exception):
    """Stands for a preempted job."""


def dataset(data: str, window: int, **kwargs) -> dw.WindowDataset:
    args = dict(features=["f0"], targets=["y"], series="sid", window=window, batch_size=8, return_index=True, seed=3)
    return dw.WindowDataset(data, **{**args, **kwargs})


def trainer(epochs: int, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, **kwargs,
    )  # fmt: skip


def main(config: dict) -> None:
    """DDP on CPU ranks: each rank saves what it trained and validated on."""
    ds = dataset(config["data"], config["window"])
    workers = config["num_workers"]
    # workers start once per loader (persistent), by fork: forkserver's fresh interpreters cost minutes here
    extra = {"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}
    module = WindowDataModule(ds, split={"valid": 0.25}, num_workers=workers, **extra)
    model = Recorder(config["window"])
    fit = trainer(2, strategy="ddp", devices=2)
    fit.fit(model, module)
    out = {"len": len(module.train_set), "rank": fit.global_rank, "windows": module.train_set.num_windows}
    for epoch in range(2):
        out[f"train{epoch}"] = [s.tolist() for e, _, s in model.seen if e == epoch]
        out[f"valid{epoch}"] = [s.tolist() for e, s in model.validated if e == epoch]
    path = os.path.join(config["out"], f"rank{fit.global_rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)  # whole or absent
    if fit.global_rank == 0:
        # Rank 1 is a process Lightning started by running this script again, and the test waits for
        # rank 0 only: rank 0 exits once every rank has written its figures (rank 1 could be later).
        deadline = time.monotonic() + 300
        others = [os.path.join(config["out"], f"rank{r}.json") for r in range(1, fit.world_size)]
        while not all(map(os.path.exists, others)) and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
