"""Windows cut on the training device: rows cross once, every batch is gathered there.

``WindowDataset(..., device="cuda")`` (or ``"cpu"``, ``"auto"``) turns it on:
the host reads, decodes and plans as always; each unit's rows are sent once
per epoch into a pool on the device (``pool.DevicePool``) and every batch is
gathered there from a ``(B,)`` start vector, the host path's batches bit for
bit. The trade-off: the resident rows live on the device (docs/device.md), and
batches are made in the training process, so DataLoader workers are refused
(``feed.feed_for``).

Also here, torch only: ``prefetcher`` (``DevicePrefetcher``, ``standardize``)
and ``masks`` (mask generators for masked-value pretraining).
"""

from __future__ import annotations

from dask_windows.ondevice.feed import DeviceFeed, Traffic, feed_for, resolve_device
from dask_windows.ondevice.pool import DevicePool
from dask_windows.ondevice.rows import DeviceRows, standardize_windows

__all__ = ["DeviceFeed", "DevicePool", "DeviceRows", "Traffic", "feed_for", "resolve_device", "standardize_windows"]
