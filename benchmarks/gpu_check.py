"""GPU check: windows cut on the GPU against the host gather + copy, and the MVP demo's model fed by each.

Run on one CUDA GPU from the repository root (it prints its own estimate first: about 45 s for the
defaults at ``RATES``, rates assumed for an H100 and not yet measured on one; it stops at
``--timeout``, 480 s)::

    PYTHONPATH=. python benchmarks/gpu_check.py --json $OUT/gpu_check.json [--batches 600] [--steps 300]
    PYTHONPATH=. python benchmarks/gpu_check.py --dry-run   # tiny, on the CPU device: checks the script

Exit status: 0 when every check holds; 1 when any equality check fails (the first batches, the
whole epoch bit for bit, the mid-epoch resume, the non-default stream), when the byte count's pool is not smaller than the data, or the run passes ``--timeout`` (a stack dump
of every thread goes to stderr first: ``faulthandler``); 2 without CUDA, unless ``--allow-cpu``
(the same run on the CPU device) or ``--dry-run`` (tiny sizes on the CPU device). ``--json PATH``
writes every figure, the failures and the exit status.

It needs torch, numpy, pyarrow, pandas and fsspec, and imports nothing else
(no dask: ``tests/ondevice/test_gpu_check.py`` runs the dry run with dask, tqdm and the
other extras blocked). On the synthetic data of ``examples/_synthetic.py``
(8 files, 128 series of 4,096 rows, 4 channels) it prints one run, side by side:

1. **The loader alone** at stride 1, ``L = --gather-window`` (512),
   ``B = --gather-batch-size`` (256), in the default (pool) order: windows/s of the host path
   (batches gathered on the CPU, in this process and in ``--num-workers`` DataLoader workers, then
   copied by ``DevicePrefetcher``: pinned, one batch ahead) against ``WindowDataset(device="cuda")``
   (each row group's rows sent once into a pool on the GPU, every batch gathered there:
   ``dask_windows/ondevice/pool.py``); the bytes per step sent over PCIe; the loader's peak device
   memory and its pool; whether the first batches are equal (the gathers must be). Then one whole
   epoch at ``--equal-stride`` under a small pool budget (``--equal-budget``: units overwrite pool
   rows many times, so a copy racing a gather would show) compared bit for bit with the host pool
   order, with the rows sent against the dataset's rows (1.00: each row once; a little more where
   windows across a unit's cut send their rows with both units, most on tiny units). Then the bytes
   sent over whole epochs (``--bytes-epochs``) at the loader-alone settings, on a pool smaller than
   the data (``--bytes-budget``, a quarter of it by default: units are overwritten and every one is
   sent once an epoch), against what the host path sends (every batch); the timed steps above
   under-count the device path's bytes (a small dataset's rows are all sent before them). Then, at the
   whole-epoch check's stride and budget, on the device: a **mid-epoch resume** (half an epoch taken,
   ``state_dict()``, a fresh dataset given ``load_state_dict``: the taken batches and the resumed rest
   against one uninterrupted epoch, bit for bit) and a **non-default CUDA stream** (an epoch consumed
   inside ``with torch.cuda.stream(torch.cuda.Stream()):`` against the default stream's, bit for bit: a
   missing stream sync shows); both compared on the host. Without CUDA the stream check is reported
   "skipped: no CUDA" (no failure); the resume check runs on the CPU device.
2. **The MVP demo's transformer** (``examples/pretrain_mvp.py``: its model, loss,
   ``L = --window`` (128), ``B = --batch-size`` (64)) trained ``--steps`` steps after ``--warmup`` by each
   loader: the share of step time spent waiting for the next batch (target for
   the device loader: under 1%), steps/s, this process's CPU milliseconds per step (the host path's
   DataLoader workers not included) and the device-copy stage of the telemetry (the device path: the
   rows sent; not seen for the host path's workers), and each loader's verdict. Every step ends with
   ``torch.cuda.synchronize()``, so a step's time is finished work.
3. **Masks**: ``subsequence_mask`` per step on the GPU (CUDA events) against the
   same mask built on the CPU (wall time; it then has to be copied too).

Without CUDA (and without ``--allow-cpu`` or ``--dry-run``) it says so and exits 2: a run that
measured nothing must not read as a pass.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=600, help="timed batches of the loader alone, per loader")
    parser.add_argument("--steps", type=int, default=300, help="timed training steps per loader")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps (and batches) first")
    parser.add_argument("--batch-size", type=int, default=64, help="B of the model's batches (the MVP demo's)")
    parser.add_argument("--window", type=int, default=128, help="L of the model's windows (the MVP demo's)")
    parser.add_argument("--gather-batch-size", type=int, default=256, help="B of the loader alone")
    parser.add_argument("--gather-window", type=int, default=512, help="L of the loader alone (stride 1)")
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers of the host path")
    parser.add_argument("--equal-stride", type=int, default=8, help="stride of the whole-epoch equality check")
    parser.add_argument("--equal-budget", type=int, default=4 << 20, help="buffer_bytes of the equality check")
    parser.add_argument("--r", type=float, default=0.15)
    parser.add_argument("--lm", type=float, default=3.0)
    parser.add_argument("--data", default=None, help="folder of the synthetic dataset (a temporary one if omitted)")
    parser.add_argument("--bytes-epochs", type=int, default=1, help="whole epochs whose device bytes are counted")
    parser.add_argument(
        "--bytes-budget", type=int, default=None, help="buffer_bytes of the byte count (default: a quarter of the data)"
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU device (checks the script)")
    parser.add_argument(
        "--allow-cpu", action="store_true", help="without CUDA, run on the CPU device (exit 0 if equal)"
    )
    parser.add_argument(
        "--timeout", type=float, default=480.0, help="seconds before a stack dump of every thread and exit 1"
    )
    parser.add_argument("--json", default=None, help="write the results (and failures) to this file")
    return parser.parse_args(argv)


#: Seconds per item assumed for one H100 (rough and meant to be high; not yet measured on a GPU, the CPU device is
#: slower): the estimate printed first. Correct them from the first run's JSON (``seconds`` against the estimate).
RATES = {
    "start": 25.0,  # imports, the synthetic data, DataLoader workers started per loader
    "batch_host": 4e-3,  # one batch of the loader alone (L=512, B=256) on the host path, copied
    "batch_device": 1e-3,  # the same gathered on the device
    "window": 4e-6,  # one window of a whole epoch compared or counted (host pool order, device)
    "step": 12e-3,  # one training step of the MVP transformer (L=128, B=64)
    "mask": 2e-3,  # one subsequence_mask, on the device and on the CPU
}


def estimate_seconds(args: argparse.Namespace, windows_per_series: int, series: int) -> float:
    """What the run should take at ``RATES``: printed before it starts, so a slow run is noticed early."""
    scale = (args.gather_batch_size * args.gather_window) / (256 * 512)
    host_modes = 2 if args.num_workers else 1
    alone = (args.warmup + args.batches) * scale * (host_modes * RATES["batch_host"] + RATES["batch_device"])
    # host and device epochs; then two each for the resume (whole, taken + resumed) and the stream checks
    equal_windows = (2 + 2 + 2) * series * windows_per_series / max(args.equal_stride, 1)
    bytes_windows = args.bytes_epochs * series * windows_per_series
    train_steps = 2 * (args.warmup + args.steps) * RATES["step"]
    return (
        RATES["start"] + alone + (equal_windows + bytes_windows) * RATES["window"] + train_steps + 400 * RATES["mask"]
    )


class Clock:
    """Seconds of finished work on ``device``: synchronises CUDA before reading the time."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self._sync = torch.cuda.synchronize if self.cuda else (lambda: None)

    def now(self) -> float:
        self._sync()
        return time.perf_counter()


def _batches_forever(loader: Any, dataset: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        dataset.set_epoch(epoch)
        yield from loader
        epoch += 1


def _first(batch: Any) -> Any:
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def loader_alone(args: argparse.Namespace, data: str, device: Any) -> dict[str, dict[str, float]]:
    """Section 1: windows/s, bytes per step and peak device memory of each loader, at stride 1."""
    import torch

    import dask_windows as dw
    from dask_windows.ondevice.prefetcher import DevicePrefetcher

    clock = Clock(device)
    settings = dict(
        features=FEATURES,
        series="series_id",
        window=args.gather_window,
        batch_size=args.gather_batch_size,
        seed=0,  # the default (pool) order on both paths: the same batches
    )
    results: dict[str, dict[str, float]] = {}
    modes: list[tuple[str, int]] = [("host", 0), ("device", 0)]
    if args.num_workers:
        modes.insert(1, ("host", args.num_workers))
    first_batches: dict[str, list] = {}
    for mode, workers in modes:
        ds = dw.WindowDataset(data, device=device if mode == "device" else None, **settings)
        if mode == "device":
            loader: Any = ds
        else:
            plain = torch.utils.data.DataLoader(
                ds, batch_size=None, num_workers=workers, pin_memory=clock.cuda, persistent_workers=False
            )
            loader = DevicePrefetcher(plain, device)
        if clock.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if clock.cuda else 0
        batches = _batches_forever(loader, ds)
        kept = first_batches.setdefault(mode, [])
        sent = 0
        for i in range(args.warmup + args.batches):
            if i == args.warmup:
                began = clock.now()
            x = _first(next(batches))
            if len(kept) < 3 and workers == 0:
                kept.append(x.cpu())
            if mode == "host" and i >= args.warmup:
                sent += x.numel() * x.element_size()
            del x
        seconds = clock.now() - began
        if mode == "device":  # over the whole run: a buffer's rows serve many steps (sent ahead, once)
            sent = ds.device_traffic.total_bytes * args.batches / (args.warmup + args.batches)
        batches.close()
        peak = (torch.cuda.max_memory_allocated(device) - base) if clock.cuda else float("nan")
        label = f"{mode} ({workers} workers)" if mode == "host" else "device"
        results[label] = {
            "windows_s": args.batches * args.gather_batch_size / seconds,
            "bytes_step": sent / args.batches,
            "peak_mib": peak / 2**20,
        }
        if mode == "device":
            traffic = ds.device_traffic
            results[label]["pool_mib"] = traffic.pool_bytes / 2**20
            results[label]["units"] = traffic.units
            results[label]["resident"] = traffic.peak_resident
    equal = all(torch.equal(a, b) for a, b in zip(first_batches["host"], first_batches["device"]))
    results["equal"] = {"first_batches_equal": float(equal and len(first_batches["device"]) > 0)}
    results["equal"].update(epoch_equal(args, data, device, settings))
    return results


def epoch_equal(args: argparse.Namespace, data: str, device: Any, settings: dict) -> dict[str, float]:
    """One whole epoch of the device pool against the host pool order, bit for bit, under a small budget."""
    import torch

    import dask_windows as dw

    kw = dict(settings, stride=args.equal_stride, buffer_bytes=args.equal_budget, return_index=True)
    with warnings.catch_warnings():  # a budget of few units on purpose (PoolWarning)
        warnings.simplefilter("ignore")
        host = dw.WindowDataset(data, **kw)
        on_device = dw.WindowDataset(data, device=device, **kw)
    batches = same = 0
    for (hx, hi), (dx, di) in zip(host, on_device):
        batches += 1
        same += int(torch.equal(hx.to(device), dx) and torch.equal(hi.to(device), di))
    traffic = on_device.device_traffic
    rows = sum(p.num_rows for p in on_device.partitions)
    row_bytes = 4 * len(on_device.spec.features)
    return {
        "epoch_equal": float(batches == same == len(host) > 0),
        "stride": float(args.equal_stride),
        "epoch_batches": float(batches),
        "rows_sent": traffic.row_bytes / row_bytes / rows,
        "units": float(traffic.units),
        "pool_mib": traffic.pool_bytes / 2**20,
    }


def _check_settings(args: argparse.Namespace, settings: dict) -> dict:
    """The whole-epoch checks' settings: the equality check's stride and small pool budget, indices returned."""
    return dict(settings, stride=args.equal_stride, buffer_bytes=args.equal_budget, return_index=True)


def _open_quietly(data: str, **kw: Any) -> Any:
    import dask_windows as dw

    with warnings.catch_warnings():  # a budget of few units on purpose (PoolWarning)
        warnings.simplefilter("ignore")
        return dw.WindowDataset(data, **kw)


def _same_batch(a: Any, b: Any) -> bool:
    """Two ``(windows, index)`` batches bit for bit, compared on the host (CUDA: after every queued copy and gather)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return len(a) == len(b) and all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


def resume_equal(args: argparse.Namespace, data: str, device: Any, settings: dict) -> dict[str, float]:
    """A mid-epoch resume on the device: ``k`` batches taken, ``state_dict()``, a fresh dataset given
    ``load_state_dict``; the taken batches and the resumed rest against one uninterrupted epoch, bit for bit."""
    kw = dict(_check_settings(args, settings), device=device)
    whole = _open_quietly(data, **kw)
    whole.set_epoch(1)  # not the first epoch: the state carries it
    interrupted = _open_quietly(data, **kw)
    interrupted.set_epoch(1)
    taken = max(len(whole) // 2, 1)
    reference = iter(whole)
    batches = same = 0
    part = iter(interrupted)
    for _ in range(taken):
        batches += 1
        same += int(_same_batch(next(reference), next(part)))
    state = interrupted.state_dict()
    del part
    resumed = _open_quietly(data, **kw)
    resumed.load_state_dict(state)
    rest = iter(resumed)
    for batch in rest:
        batches += 1
        same += int(_same_batch(next(reference, ()), batch))
    left = sum(1 for _ in reference)  # batches of the uninterrupted epoch the resume never yielded
    return {
        "resume_equal": float(batches == same == len(whole) > 0 and left == 0),
        "taken": float(taken),
        "epoch_batches": float(len(whole)),
        "resumed_batches": float(batches - taken),
        "units_resumed": float(resumed.device_traffic.units),
    }


def stream_equal(args: argparse.Namespace, data: str, device: Any, settings: dict) -> dict[str, Any]:
    """An epoch consumed while the current stream is a non-default ``torch.cuda.Stream()`` against the same epoch
    on the default stream, bit for bit (a missing stream sync shows as different values). CUDA only."""
    import torch

    if device.type != "cuda":
        return {"stream_equal": float("nan"), "skipped": "no CUDA"}
    kw = dict(_check_settings(args, settings), device=device)
    default, side = _open_quietly(data, **kw), _open_quietly(data, **kw)
    reference = iter(default)
    stream = torch.cuda.Stream(device)
    batches = same = 0
    with torch.cuda.stream(stream):
        for batch in side:  # gathered while ``stream`` is current
            with torch.cuda.stream(torch.cuda.default_stream(device)):
                expected = next(reference, ())
            batches += 1
            same += int(_same_batch(expected, batch))
    left = sum(1 for _ in reference)
    return {"stream_equal": float(batches == same == len(default) > 0 and left == 0), "epoch_batches": float(batches)}


def epoch_bytes(args: argparse.Namespace, data: str, device: Any, settings: dict) -> dict[str, float]:
    """Bytes sent to the device over ``--bytes-epochs`` whole epochs, the pool smaller than the data,
    against the host path's (every batch copied: the batches' own bytes)."""
    import dask_windows as dw

    probe = dw.WindowDataset(data, **settings)
    rows = sum(p.num_rows for p in probe.partitions)
    data_bytes = rows * 4 * len(probe.spec.features)
    budget = args.bytes_budget or max(data_bytes // 4, 1)
    with warnings.catch_warnings():  # a budget of few units on purpose (PoolWarning)
        warnings.simplefilter("ignore")
        ds = dw.WindowDataset(data, device=device, buffer_bytes=budget, **settings)
    host_bytes = batches = 0
    for epoch in range(args.bytes_epochs):
        ds.set_epoch(epoch)
        for batch in ds:
            x = _first(batch)
            host_bytes += x.numel() * x.element_size()
            batches += 1
    traffic = ds.device_traffic
    return {
        "epochs": float(args.bytes_epochs),
        "batches": float(batches),
        "budget_bytes": float(budget),
        "data_bytes": float(data_bytes),
        "pool_bytes": float(traffic.pool_bytes),
        "host_bytes": float(host_bytes),
        "device_bytes": float(traffic.total_bytes),
        "fewer_bytes": host_bytes / max(traffic.total_bytes, 1),
        "rows_sent": traffic.row_bytes / (4 * len(ds.spec.features)) / rows / args.bytes_epochs,
    }


def train(mode: str, args: argparse.Namespace, data: str, device: Any) -> dict[str, float]:
    """Section 2: the MVP transformer fed by the host path or by device batches."""
    import torch
    from torch import nn

    import dask_windows as dw
    from dask_windows.ondevice.masks import subsequence_mask
    from dask_windows.ondevice.prefetcher import DevicePrefetcher, standardize

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from pretrain_mvp import CHANNELS, MaskedValueModel, TransformerEncoder, masked_mse

    torch.manual_seed(0)
    clock = Clock(device)
    window, batch = args.window, args.batch_size
    ds = dw.WindowDataset(
        data, features=FEATURES, series="series_id", window=window, batch_size=batch, seed=0,
        device=device if mode == "device" else None,
    )  # fmt: skip
    if mode == "device":
        loader: Any = ds
    else:
        plain = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=args.num_workers, pin_memory=clock.cuda, persistent_workers=False
        )
        loader = DevicePrefetcher(plain, device)
    width = 64
    model = MaskedValueModel(TransformerEncoder(CHANNELS, window, width), width, CHANNELS).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(0)
    batches = _batches_forever(loader, ds)
    wait = step_time = cpu = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            cpu = time.process_time()  # this process's CPU seconds over the timed steps (not its workers')
        began = clock.now()
        x = next(batches)
        asked = time.perf_counter() - began  # host time until the batch is there (its gather is queued)
        x = standardize(x)  # per window and channel, on the device, as the demo does
        mask = subsequence_mask(x, args.r, args.lm, generator=generator)
        loss = masked_mse(model(x, mask), x, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= args.warmup:
            step_time += clock.now() - began
            wait += asked
    cpu = time.process_time() - cpu
    batches.close()
    stats = ds.stats()  # the device path's stages (the host path's run in its DataLoader workers: not seen here)
    return {
        "wait_share": wait / step_time,
        "steps_s": args.steps / step_time,
        "step_ms": 1e3 * step_time / args.steps,
        "host_cpu_ms": 1e3 * cpu / args.steps,
        "device_copy_s": stats.device_copy_seconds if stats.stages_seen else float("nan"),
        "verdict": str(stats.verdict),
    }


def mask_times(args: argparse.Namespace, device: Any, repeats: int) -> dict[str, float]:
    """Section 3: ms per step of ``subsequence_mask`` on the device and on the CPU, the MVP batch shape."""
    import torch

    from dask_windows.ondevice.masks import subsequence_mask

    shape = (args.batch_size, len(FEATURES), args.window)
    on_device = torch.empty(shape, device=device)
    on_host = torch.empty(shape)
    out: dict[str, float] = {}
    for label, x in (("device", on_device), ("cpu", on_host)):
        clock = Clock(x.device)
        generator = torch.Generator(device=x.device).manual_seed(0)
        for _ in range(5):
            subsequence_mask(x, args.r, args.lm, generator=generator)
        began = clock.now()
        for _ in range(repeats):
            mask = subsequence_mask(x, args.r, args.lm, generator=generator)
        out[label] = 1e3 * (clock.now() - began) / repeats
        out["mask_bytes"] = mask.numel() * mask.element_size()
    return out


FEATURES = [f"f{c}" for c in range(4)]
DRY_SIZES = dict(num_files=2, series_per_file=2, rows_per_series=300)  # the synthetic data of a dry run


def dry_run(args: argparse.Namespace) -> None:
    """Tiny sizes for ``--dry-run`` (and the tests), on the CPU device."""
    args.batches, args.steps, args.warmup, args.num_workers = 4, 3, 1, 0
    args.batch_size, args.window, args.gather_batch_size, args.gather_window = 8, 16, 8, 32
    args.equal_stride, args.equal_budget = 4, 40_000  # the dry run's 1,200 rows: a pool of a few units


NO_CUDA, UNEQUAL = 2, 1  # exit statuses besides 0


def failures(alone: dict, counted: dict, checks: dict) -> list[str]:
    """Each equality check that failed, in words (empty: all hold; a skipped check is no failure)."""
    equal, out = alone["equal"], []
    if equal["first_batches_equal"] != 1.0:
        out.append("the first batches of the device loader differ from the host path's")
    if equal["epoch_equal"] != 1.0:
        out.append(f"the whole epoch at stride {equal.get('stride', '?')} differs from the host pool order")
    if counted["pool_bytes"] >= counted["data_bytes"]:  # else every row was sent once, up front: nothing counted
        out.append(
            f"the byte count's pool ({counted['pool_bytes']:,.0f} bytes) is not smaller than the data "
            f"({counted['data_bytes']:,.0f} bytes); pass a smaller --bytes-budget"
        )
    if checks["resume"]["resume_equal"] != 1.0:
        out.append(
            f"the epoch resumed after {checks['resume'].get('taken', 0):.0f} batches (state_dict / load_state_dict) "
            "differs from the uninterrupted epoch"
        )
    if "skipped" not in checks["stream"] and checks["stream"]["stream_equal"] != 1.0:
        out.append("the epoch consumed on a non-default CUDA stream differs from the default stream's")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # a hang (a stuck worker, a device sync that never returns) ends with every thread's stack on stderr
    try:
        sys.stderr.fileno()
        dump = sys.stderr
    except (AttributeError, OSError, ValueError):  # a captured stderr (pytest): the process's own
        dump = sys.__stderr__
    faulthandler.dump_traceback_later(args.timeout, exit=True, file=dump)
    try:
        return _run(args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _run(args: argparse.Namespace) -> int:
    import torch

    result: dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "cuda_build": torch.version.cuda}
    if args.dry_run:
        dry_run(args)
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.allow_cpu:
        device = torch.device("cpu")
    else:
        message = (
            "gpu_check needs CUDA: no CUDA device is available here (torch "
            f"{torch.__version__}, cuda build {torch.version.cuda}); nothing measured. Pass --allow-cpu "
            "(or --dry-run) to run it on the CPU device"
        )
        print(message)
        _write(args, {**result, "ok": False, "exit": NO_CUDA, "failures": [message]})
        return NO_CUDA
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from _synthetic import make_dataset

    began = time.perf_counter()
    sizes = DRY_SIZES if args.dry_run else {}
    rows, series = sizes.get("rows_per_series", 4096), sizes.get("num_files", 8) * sizes.get("series_per_file", 16)
    estimate = estimate_seconds(args, rows - args.gather_window + 1, series)
    print(f"estimate: about {estimate:.0f} s at one H100's rates (stopped with a stack dump at {args.timeout:.0f} s)")
    result["estimate_seconds"] = estimate
    with tempfile.TemporaryDirectory(prefix="dw-gpu-check-") as tmp:
        data = make_dataset(args.data or os.path.join(tmp, "train"), channels=len(FEATURES), seed=0, **sizes)
        name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU (dry run)"
        print(f"{name}; torch {torch.__version__}; {args.num_workers} DataLoader workers on the host path")
        alone = loader_alone(args, data, device)
        settings = dict(
            features=FEATURES, series="series_id", window=args.gather_window, batch_size=args.gather_batch_size, seed=0
        )
        counted = epoch_bytes(args, data, device, settings)
        checks = {
            "resume": resume_equal(args, data, device, settings),
            "stream": stream_equal(args, data, device, settings),
        }
        trained = {mode: train(mode, args, data, device) for mode in ("host", "device")}
        masks = mask_times(args, device, 3 if args.dry_run else 200)
    seconds = time.perf_counter() - began
    failed = failures(alone, counted, checks)
    result.update(
        device=name, seconds=seconds, loader_alone=alone, epoch_bytes=counted, checks=checks, train=trained, masks=masks
    )
    _report(args, alone, counted, checks, trained, masks, seconds)
    status = UNEQUAL if failed else 0
    for problem in failed:
        print(f"FAILED: {problem}")
    _write(args, {**result, "ok": not failed, "exit": status, "failures": failed})
    return status


def _write(args: argparse.Namespace, result: dict) -> None:
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1, default=str)


def _report(
    args: argparse.Namespace, alone: dict, counted: dict, checks: dict, trained: dict, masks: dict, seconds: float
) -> None:
    row: Callable[..., str] = lambda *cells: "".join(f"{c:>16}" if i else f"{c:<22}" for i, c in enumerate(cells))
    alone = dict(alone)
    equal = alone.pop("equal")
    print(
        f"\n1. loader alone: stride 1, L={args.gather_window}, B={args.gather_batch_size}, C={len(FEATURES)}, "
        f"{args.batches} batches"
    )
    print(row("", "windows/s", "bytes/step", "peak device MiB"))
    for label, r in alone.items():
        print(row(label, f"{r['windows_s']:,.0f}", f"{r['bytes_step']:,.0f}", f"{r['peak_mib']:.1f}"))
    device = alone["device"]
    host = alone["host (0 workers)"]
    print(
        f"device / host (0 workers): {device['windows_s'] / host['windows_s']:.2f}x windows/s, "
        f"{host['bytes_step'] / max(device['bytes_step'], 1):.0f}x fewer bytes per step; "
        f"device pool {device['pool_mib']:.1f} MiB ({device['units']:.0f} units sent); "
        f"first batches equal: {'yes' if equal['first_batches_equal'] else 'NO'}"
    )
    print(
        f"whole epoch at stride {args.equal_stride}, buffer_bytes={args.equal_budget:,} (pool "
        f"{equal['pool_mib']:.2f} MiB, {equal['units']:.0f} units): {equal['epoch_batches']:.0f} batches "
        f"{'bit for bit the host pool order' if equal['epoch_equal'] else 'NOT EQUAL to the host pool order'}; "
        f"rows sent / rows: {equal['rows_sent']:.3f}"
    )
    print(
        f"{counted['epochs']:.0f} whole epoch(s), {counted['batches']:.0f} batches, pool {counted['pool_bytes'] / 2**20:.2f} "
        f"MiB for {counted['data_bytes'] / 2**20:.2f} MiB of data: host path {counted['host_bytes'] / 1e6:,.1f} MB, "
        f"device {counted['device_bytes'] / 1e6:,.2f} MB ({counted['fewer_bytes']:.0f}x fewer); rows sent / rows per "
        f"epoch {counted['rows_sent']:.3f}"
    )
    resume, stream = checks["resume"], checks["stream"]
    print(
        f"mid-epoch resume after {resume['taken']:.0f} of {resume['epoch_batches']:.0f} batches (a fresh dataset, "
        f"load_state_dict): {resume['resumed_batches']:.0f} batches "
        f"{'bit for bit the uninterrupted epoch' if resume['resume_equal'] else 'NOT EQUAL to the uninterrupted epoch'}"
    )
    if "skipped" in stream:
        print(f"non-default CUDA stream: skipped: {stream['skipped']}")
    else:
        print(
            f"non-default CUDA stream: {stream['epoch_batches']:.0f} batches "
            f"{'bit for bit the default stream' if stream['stream_equal'] else 'NOT EQUAL to the default stream'}"
        )
    print(f"\n2. MVP transformer (L={args.window}, B={args.batch_size}; {args.steps} steps after {args.warmup})")
    print(row("", "wait share", "steps/s", "step ms", "CPU ms/step", "copy s"))
    for mode, r in trained.items():
        print(
            row(
                f"{mode} loader", f"{r['wait_share']:.2%}", f"{r['steps_s']:.1f}", f"{r['step_ms']:.2f}",
                f"{r['host_cpu_ms']:.2f}", f"{r['device_copy_s']:.3f}",
            )
        )  # fmt: skip
    for mode, r in trained.items():
        print(f"{mode} loader's verdict: {r['verdict']}")
    print("\n3. subsequence_mask per step (MVP batch)")
    print(row("", "ms/step", "bytes to send"))
    print(row("on the device", f"{masks['device']:.3f}", "0"))
    print(row("on the CPU", f"{masks['cpu']:.3f}", f"{masks['mask_bytes']:,}"))
    print(f"\ntotal {seconds:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
