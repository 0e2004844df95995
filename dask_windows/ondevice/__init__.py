"""Windows cut on the training device: rows cross once, every batch is gathered there.

``WindowDataset(..., device="cuda")`` (or ``"cpu"``, ``"auto"``) turns it on:
the host reads, decodes and plans as always, then sends the decoded rows to the
device once and cuts every batch there by index: a ``(B,)`` start vector
crosses per batch instead of ``B * C * L`` values. At stride 1 and ``L = 512``
that is hundreds of times fewer bytes over PCIe, and the host no longer copies
windows at all. Two orders, the host path's batches bit for bit in each:

* the pool order (the default, ``buffer_bytes``; ``pool.DevicePool``): each
  unit (a Parquet row group) is sent once per epoch, when it becomes resident,
  into a pool on the device within ``buffer_bytes``, and every batch is
  gathered from the resident units by the starts of the host's pool plan;
* the buffer orders (``pieces_per_partition``; ``feed.DeviceFeed.stage``):
  each buffer's rows are sent once, one buffer ahead, at most two on the device.

The trade-off: the resident rows live on the device (docs/device.md gives the
bounds), and the batches are made in the training process, so DataLoader
workers are refused (``feed.feed_for``); the reads and decoding still run on
the loader's background threads.

The package also holds what serves any loader's batches on the device, torch only:
``prefetcher`` (``DevicePrefetcher``: batches onto the device one step ahead; ``standardize``)
and ``masks`` (mask generators for masked-value pretraining, with their argument checks).
"""

from __future__ import annotations

from dask_windows.ondevice.feed import DeviceFeed, Traffic, feed_for, resolve_device
from dask_windows.ondevice.pool import DevicePool
from dask_windows.ondevice.rows import DeviceRows, standardize_windows, upload

__all__ = [
    "DeviceFeed",
    "DevicePool",
    "DeviceRows",
    "Traffic",
    "feed_for",
    "resolve_device",
    "standardize_windows",
    "upload",
]
