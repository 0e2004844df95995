"""Masked-value pretraining (MVP / TST, Zerveas et al. 2021) streamed from partitioned Parquet.

    python examples/pretrain_mvp.py                 # transformer, ~1-3 min on 2 CPU cores
    python examples/pretrain_mvp.py --model cnn     # a small dilated convolutional encoder

A synthetic dataset of 128 multi-channel series in 8 Parquet files is
written on first use (``--data``), plus 16 held-out series for the final
evaluation. Shuffled windows stream through ``dask_windows.WindowDataset``
and a ``DataLoader``; ``DevicePrefetcher`` moves them to the device (on CUDA
one batch ahead, on a side stream); each window and channel is standardised
and hidden in runs by ``subsequence_mask``, on the training device. The
model sees the masked values as zeros plus the mask itself and is trained
with the MSE on the hidden values only.

Predicting the mean of a standardised window is predicting 0, so the
baseline masked MSE is about 1; the script prints it beside the model's
masked MSE on held-out series, and saves the encoder and a loss curve.

Writes: the data under ``--data`` (``train/`` and ``valid/``, shared with
``train_forecast.py``, reused when present) and the run under ``--out``
(default ``runs/mvp/<model>``, so the CNN never replaces the transformer's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

import dask_windows as dw
from dask_windows.ondevice.masks import subsequence_mask
from dask_windows.ondevice.prefetcher import DevicePrefetcher, standardize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _synthetic import demo_dataset

CHANNELS = 4
FEATURES = [f"f{c}" for c in range(CHANNELS)]


class TransformerEncoder(nn.Module):
    """TST-style encoder: learned positions and pre-norm transformer layers over the steps.

    The input projection is a short convolution rather than TST's per-step
    linear map: every token then sees its neighbours, which a model that must
    fill gaps learns to use in far fewer steps.
    """

    def __init__(self, channels: int, window: int, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.project = nn.Conv1d(2 * channels, width, 5, padding=2)  # values and mask of every channel
        self.position = nn.Parameter(torch.randn(1, window, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2C, L) -> (B, L, width)
        h = self.project(x).transpose(1, 2) + self.position[:, : x.shape[-1]]
        return self.norm(self.layers(h))


class ConvEncoder(nn.Module):
    """Residual stack of dilated 1-d convolutions (receptive field ~ 2 * 7 * 2**layers steps)."""

    def __init__(self, channels: int, window: int, width: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.project = nn.Conv1d(2 * channels, width, 1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(width, width, 7, padding=3 * 2**i, dilation=2**i), nn.BatchNorm1d(width), nn.GELU())
            for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2C, L) -> (B, L, width)
        h = self.project(x)
        for block in self.blocks:
            h = h + block(h)
        return h.transpose(1, 2)


class MaskedValueModel(nn.Module):
    """Encoder plus a linear head that predicts every channel at every step."""

    def __init__(self, encoder: nn.Module, width: int, channels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(width, channels)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, C, L) -> (B, C, L)
        visible = torch.cat([x.masked_fill(mask, 0.0), mask.to(x.dtype)], dim=1)
        return self.head(self.encoder(visible)).transpose(1, 2)


def masked_mse(prediction: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (prediction - x).square().masked_select(mask).mean()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--data", default="demo_data", help="folder of the synthetic dataset, written if missing")
    parser.add_argument("--model", choices=["transformer", "cnn"], default="transformer", help="encoder")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps")
    parser.add_argument("--window", type=int, default=128, help="steps per window L")
    parser.add_argument("--batch-size", type=int, default=64, help="windows per batch B")
    parser.add_argument("--num-workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--device", default=None, help="'cuda', 'cpu', ...; None picks cuda when available")
    parser.add_argument("--r", type=float, default=0.15, help="share of hidden values")
    parser.add_argument("--lm", type=float, default=3.0, help="mean length of a hidden run")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (one-cycle schedule)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads; None: the cores not used by workers, at most 8"
    )
    parser.add_argument("--eval-batches", type=int, default=20, help="held-out batches for the final evaluation")
    parser.add_argument("--out", default=None, help="folder for encoder.pt and loss.png (default: runs/mvp/MODEL)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the shuffle, the masks and the model")
    return parser.parse_args()


def batches_forever(loader: DevicePrefetcher, dataset: dw.WindowDataset):
    """Yields batches epoch after epoch, reshuffling through ``set_epoch``; ``dataset.watch`` measures
    the loop's wait for each batch (read back with ``dataset.stats()``)."""
    epoch = 0
    while True:
        dataset.set_epoch(epoch)
        yield from dataset.watch(loader)
        epoch += 1


def main() -> None:
    from tqdm import tqdm  # here: benchmarks/gpu_check.py imports the model on machines without tqdm

    args = parse_args()
    torch.manual_seed(args.seed)
    cores = os.cpu_count() or 1
    torch.set_num_threads(args.threads or max(1, min(8, cores - args.num_workers)))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    train_path, valid_path = demo_dataset(args.data, channels=CHANNELS, seed=args.seed)
    out = args.out or os.path.join("runs", "mvp", args.model)  # one folder per encoder: no run overwrites another
    previous = os.path.join(out, "encoder.pt")
    if os.path.exists(previous):
        kind = torch.load(previous, map_location="cpu", weights_only=True).get("model", "?")
        print(f"note: {out} holds an earlier {kind} run; it is replaced at the end (pass --out to keep it)")

    def loader_for(path: str, seed: int) -> tuple[dw.WindowDataset, DevicePrefetcher]:
        dataset = dw.WindowDataset(
            path,
            features=FEATURES,
            series="series_id",
            window=args.window,
            batch_size=args.batch_size,
            shuffle=True,
            seed=seed,
        )
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=args.num_workers, pin_memory=device.type == "cuda"
        )  # not persistent_workers: workers keep their own copy of the dataset, set_epoch would not reach it
        return dataset, DevicePrefetcher(loader, device)

    train_set, train_loader = loader_for(train_path, args.seed)
    width = 64
    encoder = (TransformerEncoder if args.model == "transformer" else ConvEncoder)(CHANNELS, args.window, width)
    model = MaskedValueModel(encoder, width, CHANNELS).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=args.steps, pct_start=0.1)
    mask_generator = torch.Generator(device=device).manual_seed(args.seed)
    print(
        f"{args.model} encoder, {sum(p.numel() for p in model.parameters()):,} parameters, on {device}; "
        f"{train_set.num_windows:,} training windows of {args.window} steps x {CHANNELS} channels"
    )

    losses, baselines = [], []
    started = time.perf_counter()
    batches = batches_forever(train_loader, train_set)
    progress = tqdm(range(args.steps), desc="pretraining", unit="step", dynamic_ncols=True)
    for step in progress:
        x = next(batches)
        x = standardize(x)  # per window and channel, on the device
        mask = subsequence_mask(x, args.r, args.lm, generator=mask_generator)
        loss = masked_mse(model(x, mask), x, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 10 == 0 or step == args.steps - 1:  # .item() waits for the device: not every step
            losses.append((step, loss.item()))
            baselines.append((step, x.square().masked_select(mask).mean().item()))
            elapsed = time.perf_counter() - started
            progress.set_postfix(
                loss=f"{losses[-1][1]:.3f}",
                windows_s=f"{(step + 1) * args.batch_size / elapsed:,.0f}",
                data_wait=f"{train_set.stats().verdict.wait_share:.0%}",  # this epoch, after its first batch
            )
    progress.close()
    batches.close()  # stops the loader's workers
    elapsed = time.perf_counter() - started
    stats = train_set.stats()  # the last epoch's figures (dask_windows.telemetry)
    print(
        f"trained {args.steps} steps in {elapsed:.0f} s: {args.steps * args.batch_size / elapsed:,.0f} windows/s; "
        f"data: {stats.verdict}"
    )

    model_loss, mean_loss = evaluate(model, loader_for(valid_path, args.seed + 1)[1], args, device)
    print(
        f"held-out masked MSE: predict-the-mean baseline {mean_loss:.3f}, model {model_loss:.3f} "
        f"({model_loss / mean_loss:.1%} of the baseline)"
    )

    os.makedirs(out, exist_ok=True)
    torch.save(
        {
            "model": args.model,
            "channels": CHANNELS,
            "window": args.window,
            "width": width,
            "encoder": model.encoder.state_dict(),
            "head": model.head.state_dict(),
        },
        os.path.join(out, "encoder.pt"),
    )
    plot(losses, baselines, model_loss, os.path.join(out, "loss.png"), args)
    print(f"saved {os.path.join(out, 'encoder.pt')} and {os.path.join(out, 'loss.png')}")


@torch.no_grad()
def evaluate(model: nn.Module, loader: DevicePrefetcher, args: argparse.Namespace, device: torch.device):
    """Masked MSE of the model and of predicting the mean (0) on held-out windows, same masks."""
    model.eval()
    generator = torch.Generator(device=device).manual_seed(args.seed + 1)
    model_sum = mean_sum = 0.0
    count = 0
    for i, x in enumerate(loader):
        if i == args.eval_batches:
            break
        x = standardize(x)
        mask = subsequence_mask(x, args.r, args.lm, generator=generator)
        hidden = int(mask.sum())
        model_sum += masked_mse(model(x, mask), x, mask).item() * hidden
        mean_sum += x.square().masked_select(mask).mean().item() * hidden
        count += hidden
    model.train()
    return model_sum / count, mean_sum / count


def plot(losses, baselines, final: float, path: str, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, values = zip(*losses)
    smooth, level = [], 0.0
    for n, value in enumerate(values, 1):  # exponential moving average, corrected for its zero start
        level = 0.8 * level + 0.2 * value
        smooth.append(level / (1.0 - 0.8**n))
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(steps, values, color="tab:blue", alpha=0.3, label="training batch")
    axes.plot(steps, smooth, color="tab:blue", label="training (moving average)")
    axes.plot(*zip(*baselines), color="tab:gray", alpha=0.5, label="predict the mean (0)")
    axes.axhline(final, color="tab:red", linestyle="--", label=f"held-out, final: {final:.3f}")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("MSE on hidden values")
    axes.set_title(f"Masked-value pretraining, {args.model}, r={args.r}, lm={args.lm:g}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
