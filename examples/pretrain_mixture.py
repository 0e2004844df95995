"""Masked-value pretraining on a weighted mixture of two corpora, with an elastic restart from 2 ranks to 1.

    python examples/pretrain_mixture.py        # ~30 s on 2 CPU cores

Two synthetic corpora are written on first use (``--data``): ``sines`` (sums
of sinusoids with AR(1) noise, ``examples/_synthetic.py``) and ``walks``
(random walks), of different sizes. ``dask_windows.mix`` draws each epoch as
``--weights`` of them (0.7 / 0.3 by default: the small ``walks`` corpus
repeats, reshuffled, inside an epoch), every batch holding each corpus in its
share. Windows are standardised and hidden in runs by ``subsequence_mask``;
a small convolutional model is trained on the masked values (MVP / TST).

The run is preempted on purpose: two gloo ranks (CPU, ``torch.distributed``)
train ``--restart-at`` steps and save a checkpoint (model, optimizer and the
mixture's ``state_dict``), then one process loads it and trains on to
``--steps``. The mixture resumes elastically: the windows of the interrupted
epoch that the two ranks had not yet yielded are yielded by the single rank,
each once, and later epochs are those of a one-rank job. The loss before and
after the restart is printed: it continues where it was.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn

import dask_windows as dw
from dask_windows.ondevice.masks import subsequence_mask
from dask_windows.ondevice.prefetcher import standardize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _synthetic import make_dataset

CHANNELS = 4
FEATURES = [f"f{c}" for c in range(CHANNELS)]


def make_walks(path: str, num_files: int = 2, num_series: int = 8, rows: int = 1024, seed: int = 1) -> str:
    """Random walks (one per series, 4 correlated channels) as Parquet, unless already there."""
    if os.path.isdir(path) and any(n.endswith(".parquet") for n in os.listdir(path)):
        return path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    steps = rng.standard_normal((num_series, rows, CHANNELS)).astype(np.float32)
    steps[..., 1:] += 0.5 * steps[..., :1]  # the channels share the first one's steps
    walks = np.cumsum(steps, axis=1).reshape(-1, CHANNELS)  # axes: row, channel
    series = np.repeat(np.arange(num_series, dtype=np.int64), rows)
    per_file = num_series // num_files * rows
    for f in range(num_files):
        rows_of = slice(f * per_file, (f + 1) * per_file)
        columns = {"series_id": series[rows_of], **{n: walks[rows_of, c] for c, n in enumerate(FEATURES)}}
        pq.write_table(pa.table(columns), os.path.join(path, f"part-{f:05d}.parquet"))
    return path


class MaskedConv(nn.Module):
    """Dilated convolutions over the visible values and the mask; predicts every value."""

    def __init__(self, channels: int, width: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.project = nn.Conv1d(2 * channels, width, 1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(width, width, 5, padding=2 * 2**i, dilation=2**i), nn.GELU()) for i in range(layers)
        )
        self.head = nn.Conv1d(width, channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, C, L) -> (B, C, L)
        h = self.project(torch.cat([x.masked_fill(mask, 0.0), mask.to(x.dtype)], dim=1))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def open_mixture(args: argparse.Namespace, rank: int, world_size: int) -> dw.Mixture:
    def member(name: str) -> dw.WindowDataset:
        return dw.WindowDataset(
            os.path.join(args.data, name), features=FEATURES, series="series_id", window=args.window,
            stride=args.window // 4, batch_size=args.batch_size, seed=args.seed,
        )  # fmt: skip

    weights = dict(zip(("sines", "walks"), args.weights))
    return dw.mix(
        {"sines": member("sines"), "walks": member("walks")}, weights, batch_size=args.batch_size,
        return_source=True, rank=rank, world_size=world_size,
    )  # fmt: skip


def train(rank: int, world_size: int, args: argparse.Namespace, init: str) -> None:
    """Train from the checkpoint (if any) to ``stop`` steps on ``world_size`` gloo ranks; save at the end."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(MaskedConv(CHANNELS))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    mixture = open_mixture(args, rank, world_size)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    step, losses, stop = 0, [], args.restart_at
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        mixture.load_state_dict(saved["data"])  # saved by 2 ranks, loaded by 1: resumes elastically
        step, losses, stop = saved["step"], saved["losses"], args.steps
    baselines: list[float] = []  # the masked MSE of predicting each window's mean (0 once standardised)
    generator = torch.Generator().manual_seed(args.seed + 1000 * step + rank)
    loader = torch.utils.data.DataLoader(mixture, batch_size=None, num_workers=args.num_workers)
    epoch, shares = mixture.epoch, np.zeros(2)
    while step < stop:
        mixture.set_epoch(epoch)  # keeps a resumed epoch, then moves on
        taken = 0
        for x, source in loader:
            x = standardize(x)
            mask = subsequence_mask(x, r=0.15, lm=3, generator=generator)
            loss = (model(x, mask) - x).square().masked_select(mask).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            taken += 1
            step += 1
            losses.append(loss.item())
            baselines.append(x.square().masked_select(mask).mean().item())  # the window's mean (0) predicted
            shares += np.bincount(source.numpy(), minlength=2)
            if rank == 0 and (step % 10 == 0 or step == stop):
                print(
                    f"[{world_size} rank{'s' if world_size > 1 else ''}] step {step:4d}  epoch {epoch}  "
                    f"masked MSE {np.mean(losses[-10:]):.3f}, predict-the-mean baseline {np.mean(baselines[-10:]):.3f}",
                    flush=True,
                )
            if step == stop:
                break
        else:
            epoch += 1
            continue
        break
    if rank == 0:
        print(
            f"[{world_size} rank{'s' if world_size > 1 else ''}] windows per corpus on rank 0: "
            f"sines {shares[0] / shares.sum():.0%}, walks {shares[1] / shares.sum():.0%}",
            flush=True,
        )
        data = mixture.state_dict(batches=taken, num_workers=args.num_workers)  # the same on every rank
        torch.save(
            {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "losses": losses,
                "data": data,
            },
            checkpoint,
        )
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world_size: int, args: argparse.Namespace, init: str) -> None:
    """``train`` in a spawned rank, which then exits without interpreter finalisation.

    gloo's threads can abort a process's shutdown even after a clean ``destroy_process_group``
    ("terminate called without an active exception"; see ``examples/ddp_train.py``). The
    checkpoint is written by then, so the rank leaves with ``os._exit``.
    """
    train(rank, world_size, args, init)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="demo_data/mixture", help="folder of the two corpora, written if missing")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps in all")
    parser.add_argument("--restart-at", type=int, default=60, help="step at which the 2-rank job is preempted")
    parser.add_argument("--weights", type=float, nargs=2, default=[0.7, 0.3], help="sines, walks")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/mixture", help="folder of the checkpoint")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    make_dataset(os.path.join(args.data, "sines"), num_files=4, series_per_file=8, rows_per_series=1024,
                 channels=CHANNELS, seed=args.seed)  # fmt: skip
    make_walks(os.path.join(args.data, "walks"), seed=args.seed + 1)
    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    if os.path.exists(checkpoint):
        os.remove(checkpoint)
    print(open_mixture(args, 0, 1))
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_spawned, args=(2, args, f"file://{tmp}/two"), nprocs=2)  # preempted at restart_at
        before = torch.load(checkpoint, weights_only=False)["losses"]
        train(0, 1, args, f"file://{tmp}/one")  # the restart: one rank, same checkpoint
    losses = torch.load(checkpoint, weights_only=False)["losses"]
    k = min(10, len(before), len(losses) - len(before))
    print(
        f"masked MSE: first {k} steps {np.mean(losses[:k]):.3f}; last {k} before the restart "
        f"{np.mean(before[-k:]):.3f}; first {k} after it {np.mean(losses[len(before) : len(before) + k]):.3f}; "
        f"last {k} {np.mean(losses[-k:]):.3f} (predicting the mean scores about 1)"
    )


if __name__ == "__main__":
    main()
