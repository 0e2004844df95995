"""The pool order on the training device: each unit's rows cross once, every batch is gathered there.

Reads are the host pool's, but each unit is decoded into a one-unit staging array
(``DevicePool.staging``) and copied to its place in the device pool on the reader thread; each step
gets a view of the device pool (``stage``) and the batches are gathered there from the host's starts,
bit for bit. Memory: the device holds the plan's pool rows (within ``buffer_bytes``), the host one
unit's rows.

The trade-off on CUDA: each unit is copied from pinned memory on the stream the pass gathers on, so
stream order keeps every copy after the gathers from the rows it overwrites and before those from
it (a loop that moves to another stream continues the old one's order: ``follow``); the copies do
not overlap compute on that stream, which buys never racing a gather.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from dask_windows.ondevice.rows import DeviceRows
from dask_windows.planning.units import PoolUnits

__all__ = ["DevicePool"]


class DevicePool:
    """One pass's pool on the device for the reader's ``planning.pool.PoolPlan`` (made by ``DeviceFeed.pool``)."""

    def __init__(self, feed: Any, plan: Any) -> None:
        self.feed, self.plan = feed, plan
        units = PoolUnits.of(plan.units)
        most = int(units.num_rows.max()) if len(units) else 0
        #: the plan the host reads by: every unit decoded at row 0 of a staging array of one unit
        self.staging = dataclasses.replace(plan, units=units.with_offsets(0), pool_rows=most)
        self.rows: DeviceRows | None = None  # the device pool, made by ``landing``
        self.stream: Any = None  # CUDA: the stream the copies and the gathers are queued on
        self._lock = threading.Lock()  # a copy and a change of stream, one at a time

    def landing(self, pool: Any) -> Callable[[int], Any]:
        """``pool.read`` (a ``runtime.pool._Pool`` of ``staging``), each unit's rows then copied to the
        device; called on the consumer's thread when the pass starts (the device pool is allocated here)."""
        spec, feed = self.feed.spec, self.feed
        # the rows the plan places units in (at most ``plan.pool_rows``: a small dataset's pool is its size)
        units = PoolUnits.of(self.plan.units)
        size = int((units.offset + units.num_rows).max()) if len(units) else 0
        channels = len(spec.features)
        shape = (channels, size) if feed.channel_major else (size, channels)
        x = torch.empty(shape, dtype=torch.float32, device=feed.device)
        y = None
        if pool.y is not None:
            y = torch.empty((len(spec.targets), size), dtype=out_dtype(pool.y), device=feed.device)
        self.rows = DeviceRows(x, y, spec.window, spec.horizon, feed.channel_major)
        if feed.device.type == "cuda":
            self.stream = torch.cuda.current_stream(feed.device)
        feed.traffic.pooled(self.rows.nbytes)
        units = self.plan.units

        def read(i: int) -> Any:
            part = pool.read(i)
            if part is not None:
                self._land(units[i], pool.x, pool.y)
            return part

        return read

    def _land(self, unit: Any, x: np.ndarray, y: np.ndarray | None) -> None:
        """Copy ``unit``'s rows (row 0 on of the staging arrays ``x``, ``y``) to its place in the device pool."""
        n, at, rows = unit.num_rows, unit.offset, self.rows
        if n == 0 or rows is None:
            return
        if self.feed.channel_major:
            pairs = [(x[:, :n], rows.x[:, at : at + n])]
        else:
            pairs = [(x[:n], rows.x[at : at + n])]
        if y is not None and rows.y is not None:
            pairs.append((y[:, :n], rows.y[:, at : at + n]))
        started = time.perf_counter_ns()
        if self.stream is None:  # the CPU device: a plain copy
            for host, out in pairs:
                out.copy_(torch.from_numpy(host))
        else:
            staged = []
            for host, _ in pairs:  # the one host copy, into page-locked memory
                pinned = torch.empty(host.shape, dtype=out_dtype(host), pin_memory=True)
                staged.append(pinned.copy_(torch.from_numpy(host)))
            with self._lock, torch.cuda.stream(self.stream):
                for pinned, (_, out) in zip(staged, pairs):
                    out.copy_(pinned, non_blocking=True)
        self.feed.traffic.send_ns += time.perf_counter_ns() - started  # the device-copy stage (issue time on CUDA)
        self.feed.traffic.landed(sum(host.nbytes for host, _ in pairs))

    def stage(self, steps: Iterator[Any]) -> Iterator[Any]:
        """The builder's steps (``runtime.pool._steps``), each given its view of the device pool."""
        for built in steps:
            built.device = _Drawn(self)
            yield built
            del built  # the consumer alone holds it now

    def follow(self) -> None:
        """Before a gather (consumer's thread, CUDA): if the loop moved to another stream, it continues
        the pass's stream (its copies and gathers so far), and later copies are queued on it."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.feed.device)
        if current == self.stream:
            return
        with self._lock:
            current.wait_stream(self.stream)
            for tensor in (self.rows.x, self.rows.y) if self.rows is not None else ():
                if tensor is not None:
                    tensor.record_stream(current)
            self.stream = current

    def close(self) -> None:
        """The pass ended: the device pool is let go (once the steps' views still queued are gone)."""
        if self.rows is not None:
            self.rows = None
            self.feed.traffic.dropped()


def out_dtype(host: np.ndarray) -> torch.dtype:
    """The torch dtype of a numpy array's values."""
    return torch.from_numpy(np.empty(0, host.dtype)).dtype


class _Drawn:
    """One step's view of the device pool, as ``feed.DeviceFeed`` gathers from it (``ready``, ``features``,
    ``targets``)."""

    __slots__ = ("_pool", "_rows")

    def __init__(self, pool: DevicePool) -> None:
        self._pool = pool
        assert pool.rows is not None  # allocated before the first unit is read
        self._rows = pool.rows

    def ready(self) -> None:
        self._pool.follow()
        self._rows.ready()

    def features(self, starts: torch.Tensor) -> torch.Tensor:
        return self._rows.features(starts)

    def targets(self, starts: torch.Tensor) -> torch.Tensor:
        return self._rows.targets(starts)
