"""Pretrain a small patch-based masked model on a weighted mixture of a real corpus, packed and resumable.

    python examples/pretrain_foundation.py            # ~20-40 s on 2 CPU cores

The corpus is eleven data sets that ship inside statsmodels (sunspots, Nile, CO2, US
macro data, El Nino, fertility by country, ...: yearly to weekly, 1 to 12 channels,
16 to 2,284 steps, NaN and nulls), written on first use as list-column Parquet (one row
per series, ``target: list<float>`` or ``list<list<float>>``). Each data set is a
``CorpusDataset`` (channel-independent: a 12-channel series is 12 univariate items);
``dw.mix`` weights them LOTSA-style (``--weights``, exact quotas per epoch), and items
are packed into sequences of ``--tokens`` patches with a ``sample_id`` per token.

The model: patches projected to ``d``, a transformer encoder whose attention is
block-diagonal by ``sample_id`` (an item attends only to itself), a share of the
observed patches hidden (a learned mask token) and reconstructed; the loss counts
observed values only (``observed_mask``: NaN and left padding never count). Each
item is scaled by the mean and std of its own observed values.

After ``--stop-at`` steps the run saves a checkpoint (model, optimizer and the
corpus's ``state_dict``) and stops, as a preempted job would; a second process
loads it and trains on to ``--steps``: the epoch continues with the next batch, bit
for bit. Printed: the masked MSE beside the baseline that predicts each item's mean (0
once scaled), real tokens/s, the packing efficiency and the share of the time spent
waiting for data.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _real_corpus import write_corpus

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning

WEIGHTS = "co2=2,fertility=1,macrodata=2,sunspots=1,elnino=1,nile=0.5,danish=0.5,interest=0.5,copper=0.5,longley=0.5,grunfeld=1"


class PatchMasked(nn.Module):
    """Patches -> transformer with block-diagonal attention by ``sample_id`` -> reconstructed patches."""

    def __init__(self, patch: int, d: int = 64, layers: int = 2, num_datasets: int = 16, num_freqs: int = 8):
        super().__init__()
        self.embed = nn.Linear(2 * patch, d)  # values and their observed mask
        self.mask_token = nn.Parameter(torch.zeros(d))
        self.time = nn.Embedding(512, d)
        self.freq = nn.Embedding(num_freqs, d)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=2 * d, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, patch)

    def forward(self, x: torch.Tensor, observed: torch.Tensor, batch: dict, hidden: torch.Tensor) -> torch.Tensor:
        h = self.embed(torch.cat([x, observed.float()], dim=-1))
        h = torch.where(hidden[..., None], self.mask_token.expand_as(h), h)
        h = h + self.time(batch["time_id"].clamp(max=511)) + self.freq(batch["freq_id"].clamp(min=0))
        sid = batch["sample_id"]
        blocked = sid[:, :, None] != sid[:, None, :]  # (B, S, S): attend inside one item only
        blocked |= (sid == 0)[:, None, :]
        blocked &= ~torch.eye(sid.shape[1], dtype=torch.bool)[None]  # padding attends to itself
        mask = blocked.repeat_interleave(4, dim=0)  # one per head
        return self.head(self.encoder(h, mask=mask))


def scale(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each item's values standardised by its own observed mean and std (per sample id and variate)."""
    x, observed = batch["target"], batch["observed_mask"]
    key = batch["sample_id"] * 4096 + batch["variate_id"]  # (B, S): one group per item and channel
    flat = key + torch.arange(x.shape[0])[:, None] * (key.max() + 1)
    _, group = torch.unique(flat.reshape(-1), return_inverse=True)
    group = group.reshape(key.shape)
    groups = int(group.max()) + 1
    w = observed.float().sum(-1)
    s1 = torch.zeros(groups).index_add_(0, group.reshape(-1), (x * observed).sum(-1).reshape(-1))
    s2 = torch.zeros(groups).index_add_(0, group.reshape(-1), (x * x * observed).sum(-1).reshape(-1))
    n = torch.zeros(groups).index_add_(0, group.reshape(-1), w.reshape(-1)).clamp(min=1)
    mean = s1 / n
    std = (s2 / n - mean**2).clamp(min=1e-8).sqrt() + 1e-3
    z = (x - mean[group][..., None]) / std[group][..., None]
    return torch.where(observed, z, torch.zeros_like(z)), observed


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    paths = {name: os.path.join(args.data, name) for name in dict(w.split("=") for w in args.weights.split(","))}
    if not all(os.path.isdir(p) for p in paths.values()):
        write_corpus(args.data, "parquet", row_group_size=32)
    weights = {name: float(w) for name, w in (pair.split("=") for pair in args.weights.split(","))}
    settings = dict(
        patch_size=args.patch,
        max_length=args.patch * args.tokens,
        min_length=args.patch // 2,
        batch_size=args.batch_size,
        seed=0,
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {name: dw.CorpusDataset(path, **settings) for name, path in paths.items()}
    corpus = dw.mix(members, weights, items_per_epoch=args.items_per_epoch)
    model = PatchMasked(args.patch, num_freqs=len(corpus.freqs))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    if args.resume:
        checkpoint = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        corpus.load_state_dict(checkpoint["corpus"])
        step = checkpoint["step"]
        print(f"resumed at step {step}, epoch {checkpoint['corpus']['epoch']}, batch {checkpoint['corpus']['batches']}")
    stop = args.stop_at if not args.resume else args.steps
    generator = torch.Generator().manual_seed(step)
    real = total = 0
    losses: list[float] = []
    baselines: list[float] = []
    waiting = computing = 0.0
    t_start = time.perf_counter()
    while step < stop:
        it = iter(corpus)
        t = time.perf_counter()
        for batch in it:
            t_got = time.perf_counter()
            waiting += t_got - t
            x, observed = scale(batch)
            visible = observed.any(-1) & (batch["sample_id"] > 0)
            hidden = visible & (torch.rand(visible.shape, generator=generator) < args.mask_ratio)
            prediction = model(x, observed, batch, hidden)
            counted = observed & hidden[..., None]
            loss = ((prediction - x) ** 2 * counted).sum() / counted.sum().clamp(min=1)
            # the baseline: every hidden value predicted by its item's mean (0 once scaled)
            baselines.append(((x**2 * counted).sum() / counted.sum().clamp(min=1)).item())
            losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            real += int((batch["sample_id"] > 0).sum())
            total += batch["sample_id"].numel()
            if step % args.log_every == 0 or step == stop:
                recent = slice(-args.log_every, None)
                model_loss, mean_loss = (
                    sum(losses[recent]) / len(losses[recent]),
                    sum(baselines[recent]) / len(baselines[recent]),
                )
                print(
                    f"step {step:4d}  epoch {corpus.epoch}  masked MSE {model_loss:.4f}, "
                    f"predict-the-item's-mean baseline {mean_loss:.4f} (last {len(losses[recent])} steps)"
                )
            t = time.perf_counter()
            computing += t - t_got
            if step == stop:
                break
        if step == stop:
            state = corpus.state_dict()
            it.close()
            break
    elapsed = time.perf_counter() - t_start
    print(
        f"{real / elapsed:,.0f} real tokens/s, packing efficiency {real / max(total, 1):.3f}, "
        f"waiting for data {waiting / max(waiting + computing, 1e-9):.1%} of the time"
    )
    if not args.resume:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "corpus": state, "step": step},
            args.checkpoint,
        )
        print(f"checkpoint at step {step} (epoch {state['epoch']}, batch {state['batches']}): {args.checkpoint}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "dask-windows-real-corpus"))
    parser.add_argument("--weights", default=WEIGHTS, help="name=weight,... (a LOTSA-style weight map)")
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="patches per packed sequence")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--items-per-epoch", type=int, default=600)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stop-at", type=int, default=20, help="the first process stops here (preemption)")
    parser.add_argument("--mask-ratio", type=float, default=0.3)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "pretrain_foundation.pt"))
    parser.add_argument("--resume", action="store_true", help="(internal) the second process")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args)
    if not args.resume:  # the preempted job restarts in a fresh process
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--resume"], check=False)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
