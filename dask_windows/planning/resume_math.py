"""The pure arithmetic of mid-epoch resume: a dataset's fingerprint and each worker's share.

``fingerprint`` is what a state records to identify a dataset's epochs
(partition rows, window grid and the settings that decide the order, in
``ORDER_SETTINGS``); ``round_robin`` is each DataLoader worker's share of the
batches an in-order loader has yielded. ``resume`` (the ``Resumer``) uses both
and re-exports them, so ``from dask_windows.planning.resume import round_robin`` keeps
working.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.plan import PIECE_ORDER
from dask_windows.planning.pool import POOL_ORDER
from dask_windows.spec import WindowSpec

__all__ = ["ORDER_SETTINGS", "fingerprint", "round_robin"]

# Settings that decide which windows form which batch, in which order.
ORDER_SETTINGS = (
    "features", "targets", "series", "window", "stride", "horizon",
    "batch_size", "drop_last", "shuffle", "seed", "buffer_partitions",
    "pieces_per_partition", "buffer_bytes",
)  # fmt: skip


def fingerprint(grid: WindowGrid, rows_per_partition: np.ndarray, spec: WindowSpec, files: str | None = None) -> dict:
    """What identifies a dataset's epochs: partition rows, window grid and ordering settings.

    Args:
        grid: The dataset's window grid (after any split or NaN filter).
        rows_per_partition: ``(P,)`` rows of each partition.
        spec: Window settings.
        files: The source's file identity hash (``sources.identity.digest``: sizes and footers),
            so a state of swapped or rewritten same-shape files is rejected; ``None`` if it has none.

    Returns:
        A dict of plain values; two datasets with equal fingerprints yield the same batches.
    """
    digest = hashlib.sha256(np.asarray(rows_per_partition, np.int64).tobytes())
    for first, counts in zip(grid.first, grid.counts):
        digest.update(np.asarray(first, np.int64).tobytes())
        digest.update(np.asarray(counts, np.int64).tobytes())
    out: dict[str, Any] = {
        "partitions": len(grid.counts),
        "rows": int(np.sum(rows_per_partition)),
        "num_windows": int(sum(int(c.sum()) for c in grid.counts)),
        "grid": digest.hexdigest()[:24],
    }
    for name in ORDER_SETTINGS:
        value = getattr(spec, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    if files is not None:
        out["files"] = files
    if spec.buffer_bytes is not None:  # the pool order (a state of the piece order is refused)
        out["order"] = POOL_ORDER
    elif spec.pieces_per_partition > 1:  # how pieces are ordered (a state of another order is refused)
        out["piece_order"] = PIECE_ORDER
    return out


def round_robin(batches_per_worker: Sequence[int], taken: int) -> tuple[np.ndarray, int]:
    """Each worker's share of the first ``taken`` batches of an in-order DataLoader.

    The loader asks workers ``0, 1, ..., W-1, 0, ...`` in turn and skips a worker that
    has no batches left, so after round ``r`` every worker has yielded ``min(n_w, r)``.

    Args:
        batches_per_worker: ``(W,)`` batches each worker yields in the epoch.
        taken: Batches the loader has yielded, ``0 <= taken <= sum``.

    Returns:
        ``(consumed, next_worker)``: ``(W,)`` batches each worker had yielded, and the worker
        that yields the next batch (``0`` once every batch is taken).
    """
    n = np.asarray(batches_per_worker, dtype=np.int64)
    total = int(n.sum())
    if not 0 <= taken <= total:
        raise ConfigError(f"batches={taken} must be in [0, {total}], the batches of this rank's epoch")
    lo, hi = 0, int(n.max(initial=0))
    while lo < hi:  # largest round r with sum(min(n, r)) <= taken
        mid = (lo + hi + 1) // 2
        if int(np.minimum(n, mid).sum()) <= taken:
            lo = mid
        else:
            hi = mid - 1
    consumed = np.minimum(n, lo)
    active = np.flatnonzero(n > lo)  # workers still yielding in round lo, in asking order
    rest = taken - int(consumed.sum())
    consumed[active[:rest]] += 1
    next_worker = int(active[rest]) if rest < len(active) else 0
    return consumed, next_worker
