"""Windows cut on the training device: each buffer's rows cross once, every batch is gathered there.

``WindowDataset(..., device="cuda")`` (or ``"cpu"``, ``"auto"``) turns it on:
the host reads, decodes and permutes as always, then sends each buffer's
decoded rows to the device once (``feed.DeviceFeed.stage``, on the builder
thread, one buffer ahead) and cuts every batch there by index
(``rows.DeviceRows``): a ``(B,)`` start vector crosses per batch instead of
``B * C * L`` values. At stride 1 and ``L = 512`` that is hundreds of times
fewer bytes over PCIe, and the host no longer copies windows at all.

The trade-off: two buffers' rows live on the device (docs/device.md gives the
bound), and the batches are made in the training process, so DataLoader
workers are refused (``feed.feed_for``); the reads and decoding still run on
the loader's background threads (and ``read_workers`` processes).
"""

from __future__ import annotations

from dask_windows.ondevice.feed import DeviceFeed, Traffic, feed_for, resolve_device
from dask_windows.ondevice.rows import DeviceRows, standardize_windows, upload

__all__ = ["DeviceFeed", "DeviceRows", "Traffic", "feed_for", "resolve_device", "standardize_windows", "upload"]
