"""GPU check: the MVP demo's model fed by dask_windows, device masks against CPU-built masks.

Run on a CUDA machine from the repository root (under 5 minutes with the defaults)::

    PYTHONPATH=. python benchmarks/gpu_check.py [--steps 300] [--num-workers 4] [--batch-size 64]

It trains ``examples/pretrain_mvp.py``'s transformer (its model, loss and
synthetic data) for ``--steps`` steps twice, after ``--warmup`` steps each:

* ``device masks``: batches go through ``DevicePrefetcher`` (pinned, copied
  one batch ahead on a side stream, standardised there) and
  ``subsequence_mask`` runs on the GPU with a CUDA generator;
* ``CPU masks``: the same, but the mask is built on the CPU from each batch
  before it is copied (``subsequence_mask`` on the host, as a loader-side
  transform would), and travels to the GPU beside the batch.

For each it prints the share of step time spent waiting for the next batch,
mask time per step (CUDA events on the device, wall time on the host), the
host-to-device bandwidth of one batch measured alone (pinned, GB/s) and the
bytes per step actually sent, and steps/s. Every step ends with
``torch.cuda.synchronize()`` so that step times are wall times of finished
work; this costs a little throughput and treats both runs alike.

On a machine without CUDA it prints that it needs CUDA and exits 0, so CPU
CI can run it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first (cuDNN, allocator, workers)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--r", type=float, default=0.15)
    parser.add_argument("--lm", type=float, default=3.0)
    parser.add_argument("--data", default=None, help="folder of the synthetic dataset (a temporary one if omitted)")
    return parser.parse_args(argv)


def bandwidth_h2d(shape: tuple[int, ...], repeats: int = 50) -> float:
    """GB/s of copying one pinned float32 batch of ``shape`` to the GPU, measured with CUDA events."""
    import torch

    host = torch.empty(shape, dtype=torch.float32).pin_memory()
    device = torch.empty(shape, dtype=torch.float32, device="cuda")
    for _ in range(5):
        device.copy_(host, non_blocking=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        device.copy_(host, non_blocking=True)
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1e3
    return host.numel() * 4 * repeats / seconds / 1e9


class CpuMasked:
    """A loader's batches with a mask built on the host from each: ``(x, mask)`` pairs."""

    def __init__(self, loader: Any, r: float, lm: float, seed: int, timings: list[float]) -> None:
        self.loader, self.r, self.lm, self.seed, self.timings = loader, r, lm, seed, timings

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        import torch

        from dask_windows.masks import subsequence_mask

        generator = torch.Generator().manual_seed(self.seed)
        for x in self.loader:
            start = time.perf_counter()
            mask = subsequence_mask(x, self.r, self.lm, generator=generator)
            self.timings.append(time.perf_counter() - start)
            yield x, mask


def run_mode(mode: str, args: argparse.Namespace, data: str) -> dict[str, float]:
    import torch
    from torch import nn

    import dask_windows as dw
    from dask_windows.device import DevicePrefetcher, standardize
    from dask_windows.masks import subsequence_mask

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from pretrain_mvp import CHANNELS, FEATURES, MaskedValueModel, TransformerEncoder, masked_mse

    torch.manual_seed(0)
    device = torch.device("cuda")
    dataset = dw.WindowDataset(
        data, features=FEATURES, series="series_id", window=args.window, batch_size=args.batch_size, seed=0
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=args.num_workers, pin_memory=True, persistent_workers=False
    )
    host_mask_times: list[float] = []
    source = CpuMasked(loader, args.r, args.lm, 0, host_mask_times) if mode == "cpu" else loader
    # standardize: the first element of a (x, mask) pair, or the batch itself
    prefetcher = DevicePrefetcher(source, device, transform=standardize)
    width = 64
    model = MaskedValueModel(TransformerEncoder(CHANNELS, args.window, width), width, CHANNELS).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(0)

    def forever() -> Iterator[Any]:
        epoch = 0
        while True:
            dataset.set_epoch(epoch)
            yield from prefetcher
            epoch += 1

    batches = forever()
    wait = step_time = mask_ms = 0.0
    sent = 0
    start_event, stop_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = args.warmup + args.steps
    for step in range(total):
        timed = step >= args.warmup
        began = time.perf_counter()
        batch = next(batches)
        asked = time.perf_counter() - began
        if mode == "cpu":
            x, mask = batch
        else:
            x = batch
            start_event.record()
            mask = subsequence_mask(x, args.r, args.lm, generator=generator)
            stop_event.record()
        loss = masked_mse(model(x, mask), x, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        torch.cuda.synchronize()
        if timed:
            wait += asked
            step_time += time.perf_counter() - began
            sent += x.numel() * x.element_size() + (mask.numel() * mask.element_size() if mode == "cpu" else 0)
            if mode != "cpu":
                mask_ms += start_event.elapsed_time(stop_event)
    batches.close()
    if mode == "cpu":
        mask_ms = 1e3 * sum(host_mask_times[-args.steps :])
    return {
        "wait_share": wait / step_time,
        "mask_ms": mask_ms / args.steps,
        "steps_s": args.steps / step_time,
        "sent_gb_s": sent / step_time / 1e9,
        "step_ms": 1e3 * step_time / args.steps,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check needs CUDA: no CUDA device is available here (torch "
            f"{torch.__version__}, cuda build {torch.version.cuda}); nothing measured"
        )
        return 0
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from _synthetic import make_dataset
    from pretrain_mvp import CHANNELS

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dw-gpu-check-") as tmp:
        data = make_dataset(args.data or os.path.join(tmp, "train"), channels=CHANNELS, seed=0)
        name = torch.cuda.get_device_name(0)
        print(
            f"{name}; torch {torch.__version__}; B={args.batch_size} C={CHANNELS} L={args.window}; "
            f"{args.steps} timed steps after {args.warmup}; {args.num_workers} DataLoader workers"
        )
        h2d = bandwidth_h2d((args.batch_size, CHANNELS, args.window))
        h2d_large = bandwidth_h2d((64 * args.batch_size, CHANNELS, args.window), repeats=20)
        print(f"H2D, one pinned batch: {h2d:.2f} GB/s ({h2d_large:.1f} GB/s for a batch 64x larger)")
        results = {mode: run_mode(mode, args, data) for mode in ("device", "cpu")}
    print(f"{'':<14}{'wait share':>12}{'mask ms/step':>14}{'steps/s':>10}{'step ms':>10}{'sent GB/s':>11}")
    for mode, label in (("device", "device masks"), ("cpu", "CPU masks")):
        r = results[mode]
        print(
            f"{label:<14}{r['wait_share']:>11.1%}{r['mask_ms']:>14.3f}{r['steps_s']:>10.1f}"
            f"{r['step_ms']:>10.2f}{r['sent_gb_s']:>11.3f}"
        )
    ratio = results["device"]["steps_s"] / results["cpu"]["steps_s"]
    print(f"device masks / CPU masks: {ratio:.2f}x steps/s; total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
