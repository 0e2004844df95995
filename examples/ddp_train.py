"""Train a small forecaster with DistributedDataParallel on dask_windows batches, and resume it.

Runs unchanged on CPUs (gloo) and on GPUs (nccl, one GPU per process; with fewer GPUs than
processes on a node it falls back to gloo on the CPU)::

    torchrun --nproc_per_node=2 examples/ddp_train.py --steps 60
    torchrun --nproc_per_node=2 examples/ddp_train.py --steps 30              # stop mid-epoch ...
    torchrun --nproc_per_node=2 examples/ddp_train.py --steps 60 --resume     # ... and go on

Without ``--data`` it writes a small synthetic Parquet dataset first, under ``--out/data``
(series span files, files differ in size); the checkpoint goes to ``--out/checkpoint.pt``.
``--resume`` with a checkpoint already at ``--steps`` trains nothing more. DataLoader workers
start with ``forkserver``: forking a process that runs gloo/nccl threads can deadlock a worker
(about 1 run in 14 hung with fork under Lightning DDP), a fresh server process cannot.
Each rank reads its own exact share of every epoch; rank 0 saves a checkpoint
holding the model, the optimiser and the loader position (``ds.state_dict``), which resumes
every rank after exactly the batches already trained on.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from dask_windows.dataset import WindowDataset


def make_data(root: str, num_series: int = 24, seed: int = 0) -> None:
    """Noisy sines of random length and period, laid end to end and cut into uneven files."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    frames = []
    for s in range(num_series):
        n = int(rng.integers(300, 900))
        t = np.arange(n)
        period = rng.uniform(20, 80)
        a = np.sin(2 * np.pi * t / period) + 0.1 * rng.standard_normal(n)
        b = np.cos(2 * np.pi * t / period) + 0.1 * rng.standard_normal(n)
        y = np.sin(2 * np.pi * (t + 1) / period)  # what the model forecasts
        frame = pd.DataFrame({"sid": s, "t": t, "a": a, "b": b, "y": y})
        frames.append(frame.astype({"a": "f4", "b": "f4", "y": "f4"}))
    table = pd.concat(frames, ignore_index=True)
    cuts = np.sort(rng.choice(np.arange(1, len(table)), 5, replace=False))
    os.makedirs(root, exist_ok=True)
    for i, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(table)])):
        table.iloc[lo:hi].to_parquet(os.path.join(root, f"part-{i:03d}.parquet"), index=False)


class Forecaster(nn.Module):
    """Two dilated convolutions and a linear head: ``(B, C, L)`` -> ``(B, 1, H)``."""

    def __init__(self, channels: int, window: int, horizon: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(channels, width, 5, padding=2),
            nn.GELU(),
            nn.Conv1d(width, width, 5, padding=4, dilation=2),
            nn.GELU(),
        )
        self.head = nn.Linear(width * window, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1)).unsqueeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="Parquet dataset (default: a synthetic one under --out)")
    parser.add_argument("--out", default="runs/ddp_demo", help="checkpoint folder")
    parser.add_argument("--steps", type=int, default=60, help="train until this many optimiser steps in total")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if on_gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)

    data = args.data or os.path.join(args.out, "data")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if not args.data and not os.path.isdir(data):
            make_data(data)
    dist.barrier()

    # Opened after init_process_group: rank and world size come from torch.distributed.
    ds = WindowDataset(
        data, features=["a", "b"], targets=["y"], series="sid",
        window=args.window, horizon=args.horizon, batch_size=args.batch_size, drop_last=True, seed=0,
    )  # fmt: skip
    train, valid = ds.split(valid=0.2, embargo=args.window)
    # forkserver, not fork: forking a process whose process group already runs threads can deadlock
    context = "forkserver" if args.num_workers else None
    loader = DataLoader(
        train, batch_size=None, num_workers=args.num_workers, pin_memory=on_gpu, multiprocessing_context=context
    )

    torch.manual_seed(0)
    model = Forecaster(2, args.window, args.horizon).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # the same tensors DDP wraps below
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    step = 0
    if args.resume and os.path.exists(checkpoint):
        saved = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        train.load_state_dict(saved["data"])  # sets train.epoch; that epoch resumes mid-way
        step = saved["step"]
        if rank == 0:
            print(f"resumed at step {step}, epoch {train.epoch}, {saved['data']['batches']} batches into it")

    if rank == 0:
        print(
            f"{dist.get_world_size()} ranks on {device.type}: {len(train)} train batches per rank per epoch; "
            f"data {data}, checkpoint {checkpoint}"
        )
        if step >= args.steps:
            print(f"the checkpoint is already at step {step} >= --steps {args.steps}: nothing to train")
    # Wrapped only when there is training to do: a DDP model that never runs backward made a rank
    # abort at exit ("terminate called without an active exception") about 1 run in 5 here.
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if on_gpu else None) if step < args.steps else None
    for epoch in range(train.epoch, args.epochs if step < args.steps else train.epoch):
        train.set_epoch(epoch)  # keeps a resumed epoch's position; a new epoch starts over
        for taken, (x, y) in enumerate(loader, start=1):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.mse_loss(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and (step % args.save_every == 0 or step == args.steps):
                # Every rank has taken the same batches: rank 0's state resumes them all.
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "data": train.state_dict(batches=taken, num_workers=args.num_workers),
                }
                torch.save(state, checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)
                print(f"step {step} epoch {epoch} loss {loss.item():.5f} (checkpoint saved)")
            if step >= args.steps:
                break
        if step >= args.steps:
            break

    model.eval()
    total = torch.zeros(4, device=device)  # squared errors, values, and their sum and sum of squares
    with torch.no_grad():
        for x, y in DataLoader(valid, batch_size=None, num_workers=0):
            x, y = x.to(device), y.to(device)
            total[0] += F.mse_loss(model(x), y, reduction="sum")
            total[1] += y.numel()
            total[2] += y.sum()
            total[3] += y.square().sum()
    dist.all_reduce(total)
    if rank == 0:
        mse, n = (total[0] / total[1]).item(), total[1].item()
        mean = total[2].item() / n
        baseline = total[3].item() / n - mean**2  # every forecast the validation targets' mean
        print(
            f"done at step {step}: validation mse {mse:.5f}, predict-the-mean baseline {baseline:.5f} "
            f"({mse / baseline:.1%} of the baseline)"
        )
    dist.barrier()  # every rank is done with gloo before any tears it down (else a rank may abort at exit)
    dist.destroy_process_group()
    # Even after a clean destroy_process_group, a rank sometimes aborts while the interpreter shuts
    # down ("terminate called without an active exception": a C++ thread of torch's distributed
    # stack destroyed during finalisation; 2 runs in 40 of the nothing-to-train path on a loaded
    # 2-core machine, none with this exit). Everything is saved and printed by now: leave without
    # finalisation, so that torchrun sees the exit code this script meant.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
