"""Train a small forecaster on windows streamed from a synthetic partitioned Parquet dataset.

    python examples/train_forecast.py               # ~1 minute on 2 CPU cores

Uses the demo's data folder (``--data``): ``train/`` (written on first use,
or reused, e.g. after ``pretrain_mvp.py``); it never writes anything else, so
running the examples in any order never duplicates data. It streams shuffled
windows of ``--window`` steps with ``WindowDataset`` through a ``DataLoader``
and fits a small 1-d CNN to predict the next ``--horizon`` values of ``f0``.
The progress bar shows the loss and the windows/s the loop consumes; the
script ends by comparing the held-out MSE with the persistence baseline
(repeat the last observed value).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _synthetic import demo_dataset

import dask_windows as dw

FEATURES = [f"f{c}" for c in range(4)]


class Forecaster(nn.Module):
    """Dilated 1-d CNN over a standardised window -> the next ``horizon`` values of channel 0."""

    def __init__(self, channels: int, horizon: int, width: int = 48) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(channels, width, 5, padding=2),
            nn.GELU(),
            nn.Conv1d(width, width, 5, padding=4, dilation=2),
            nn.GELU(),
            nn.Conv1d(width, width, 5, padding=8, dilation=4),
            nn.GELU(),
            nn.AdaptiveAvgPool1d(8),
        )
        self.head = nn.Linear(8 * width, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, L) -> (B, H)
        return self.head(self.body(x).flatten(1))


def scaled(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardise each window and channel; express the targets in channel 0's scale."""
    mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True).clamp_min(1e-5)
    return (x - mean) / std, (y[:, 0] - mean[:, 0]) / std[:, 0], x[:, 0, -1:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--data", default="demo_data", help="the demo's data folder; its train/ is written if missing")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    parser.add_argument("--window", type=int, default=128, help="steps per window L")
    parser.add_argument("--horizon", type=int, default=16, help="steps to forecast H")
    parser.add_argument("--batch-size", type=int, default=128, help="windows per batch B")
    parser.add_argument("--num-workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--eval-batches", type=int, default=10, help="held-out batches for the final evaluation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - args.num_workers))

    train_path, _ = demo_dataset(args.data, channels=len(FEATURES), seed=args.seed)
    ds = dw.WindowDataset(
        train_path,
        features=FEATURES,
        targets=["f0"],
        series="series_id",
        window=args.window,
        horizon=args.horizon,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
    )
    train, valid = ds.split(valid=0.1, embargo=args.window)  # the last 10% of each series, unseen
    print(
        f"{ds.num_windows:,} windows in {len(ds.partitions)} partitions; "
        f"train {train.num_windows:,}, valid {valid.num_windows:,}"
    )
    model = Forecaster(len(FEATURES), args.horizon)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    step, epoch, seen, start = 0, 0, 0, time.perf_counter()
    bar = tqdm(total=args.steps, unit="step")
    while step < args.steps:
        train.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(train, batch_size=None, num_workers=args.num_workers)
        for x, y in loader:
            x, y, _ = scaled(x, y)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            seen += len(x)
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", windows_per_s=f"{seen / (time.perf_counter() - start):,.0f}")
            if step == args.steps:
                break
        epoch += 1
    bar.close()
    model.eval()
    model_mse = persistence_mse = 0.0
    with torch.no_grad():
        for k, (x, y) in enumerate(valid):
            if k == args.eval_batches:
                break
            xs, ys, _ = scaled(x, y)
            model_mse += nn.functional.mse_loss(model(xs), ys).item()
            persistence_mse += nn.functional.mse_loss(xs[:, 0, -1:].expand_as(ys), ys).item()
    n = min(args.eval_batches, len(valid))
    print(f"held-out MSE (standardised): persistence baseline {persistence_mse / n:.3f}, model {model_mse / n:.3f}")


if __name__ == "__main__":
    main()
