"""A pass's batches gathered on the training device: rows sent once, batches cut by index.

``runtime.pool.pool_batches`` asks the feed for the pass's device pool (:meth:`DeviceFeed.pool`) and
hands :meth:`DeviceFeed.batches` the plan's steps; each batch is the host path's, gathered from a
``(B,)`` start vector. ``Traffic`` counts what crosses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dask_windows.errors import ConfigError
from dask_windows.ondevice.pool import DevicePool
from dask_windows.ondevice.rows import standardize_windows
from dask_windows.runtime.detect import in_worker

__all__ = ["DeviceFeed", "Traffic", "feed_for", "resolve_device"]


def resolve_device(device: Any) -> torch.device | None:
    """The device of ``WindowDataset(device=...)``: ``None`` (the host path), or a torch device
    (``"auto"``: CUDA when available, else ``None``).

    Raises:
        ConfigError: ``device`` is not a torch device, or is CUDA while CUDA is not available.
    """
    if device is None:
        return None
    if device == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(
            f"device={device!r} is not a torch device ({error}); pass 'cuda', 'cuda:1', 'cpu', 'auto' "
            "(CUDA when available) or None (batches gathered on the host)"
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} but CUDA is not available here; pass device='auto' (CUDA when available, "
            "else the host path), device='cpu' or None"
        )
    return resolved


@dataclass
class Traffic:
    """What a dataset's passes sent to the device, in this process.

    Attributes:
        row_bytes: Bytes of rows sent (features and targets).
        index_bytes: Bytes of the batches' start vectors (and ``return_index`` rows) sent.
        units: Units sent into device pools (each unit's rows once per epoch).
        batches: Batches gathered.
        resident: Pools on the device now; ``peak_resident``: the most at once.
        pool_bytes: The largest device pool a pass allocated (within ``buffer_bytes``).
    """

    row_bytes: int = 0
    index_bytes: int = 0
    units: int = 0
    batches: int = 0
    send_ns: int = 0  # time spent sending rows (the telemetry's ``device copy`` stage)
    resident: int = 0
    peak_resident: int = 0
    pool_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total_bytes(self) -> int:
        """Every byte sent: rows and start vectors."""
        return self.row_bytes + self.index_bytes

    def pooled(self, nbytes: int) -> None:
        """Count a pass's device pool (the pool order) allocated and resident."""
        with self._lock:
            self.pool_bytes = max(self.pool_bytes, nbytes)
            self.resident += 1
            self.peak_resident = max(self.peak_resident, self.resident)

    def landed(self, nbytes: int) -> None:
        """Count a unit's rows sent into a device pool."""
        with self._lock:
            self.row_bytes += nbytes
            self.units += 1

    def dropped(self) -> None:
        """Count a pool gone from the device."""
        with self._lock:
            self.resident -= 1

    def __getstate__(self) -> dict:  # (a dataset pickled for another process takes its counts, not the lock)
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def feed_for(ds: Any) -> DeviceFeed | None:
    """The feed of a pass over ``ds`` (a ``WindowDataset``), or ``None`` on the host path.

    Raises:
        ConfigError: In a DataLoader worker: device batches are gathered in the training process.
    """
    device = ds.spec.device
    if device is None:
        return None
    if in_worker():
        raise ConfigError(
            f"WindowDataset(device={str(device)!r}) gathers batches on the device in the training process, "
            "not in DataLoader workers; use DataLoader(ds, batch_size=None, num_workers=0) or iterate the "
            "dataset itself (reads and decoding already run on background threads), "
            "or pass device=None to gather on the host in workers"
        )
    return DeviceFeed(ds.spec, ds._per_batch_normalize() == "sample", ds.device_traffic)


class DeviceFeed:
    """One pass's device side: its pool there and the batches gathered from it; ``per_sample``:
    standardise each window and channel (``normalize="sample"``)."""

    def __init__(self, spec: Any, per_sample: bool, traffic: Traffic) -> None:
        self.device: torch.device = spec.device
        self.spec, self.per_sample, self.traffic = spec, per_sample, traffic
        self.channel_major = spec.layout == "NCL"

    def pool(self, plan: Any) -> DevicePool:
        """The device side of a pass over a pool plan."""
        return DevicePool(self, plan)

    def _index(self, values: np.ndarray) -> torch.Tensor:
        """An int64 vector of the host on the device (pinned, without blocking, on CUDA)."""
        host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        self.traffic.index_bytes += host.numel() * 8
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def _gather(self, built: Any, starts: np.ndarray) -> tuple:
        """``(x, y, rows)`` of the windows at buffer rows ``starts`` of ``built``, on the device."""
        rows = built.device
        rows.ready()
        index = self._index(starts)
        x = rows.features(index)
        y = rows.targets(index) if self.spec.targets else None
        where = self._index(built.buffer.global_rows(starts)) if self.spec.return_index else None
        return x, y, where

    def _emit(self, x: torch.Tensor, y: torch.Tensor | None, where: torch.Tensor | None) -> Any:
        """The batch as ``WindowDataset`` yields it: ``x``, or ``(x, y)``, ``(x, index)``, ``(x, y, index)``."""
        if self.per_sample:
            standardize_windows(x, self.channel_major)
        self.traffic.batches += 1
        out = [x] + ([y] if y is not None else []) + ([where] if where is not None else [])
        return out[0] if len(out) == 1 else tuple(out)

    def batches(self, source: Iterator[Any], num_windows: int, last: Callable[[], None] | None) -> Iterator[Any]:
        """The batches of a plan of ``num_windows`` windows from its steps, in the host path's order;
        ``last()`` once when the step holding the plan's final windows is taken."""
        batch, remaining = self.spec.batch_size, num_windows
        carry: list[tuple] = []  # pieces of a batch begun in the previous buffer, gathered already
        carried = 0
        for built in source:
            pos, total = built.skip, len(built.buffer.starts)
            if last is not None and remaining <= total - pos:  # the plan's last buffer: readers idle from now
                last()
                last = None
            while pos < total and remaining > 0:
                take = min(batch - carried, total - pos, remaining)
                piece = self._gather(built, built.buffer.starts[pos : pos + take])
                pos += take
                remaining -= take
                if carried or (take < batch and remaining > 0):
                    carry.append(piece)
                    carried += take
                    if carried < batch and remaining > 0:
                        continue  # the rest comes from the next buffer
                    piece = tuple(None if p[0] is None else torch.cat(p) for p in zip(*carry))
                    carry, carried = [], 0
                yield self._emit(*piece)
                del piece
            built.device = None  # its rows leave the device before the next buffer is taken
            del built
