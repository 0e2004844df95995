"""The pure arithmetic of mid-epoch resume: a dataset's fingerprint (``ORDER_SETTINGS`` decide the
order); ``round_robin`` is re-exported from ``division``."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from dask_windows.planning.division import round_robin as round_robin
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.pool import PARTITIONS_ORDER, POOL_ORDER
from dask_windows.settings.spec import WindowSpec

__all__ = ["ORDER_SETTINGS", "fingerprint", "round_robin"]

# Settings that decide which windows form which batch, in which order.
ORDER_SETTINGS = (
    "features", "targets", "series", "window", "stride", "horizon",
    "batch_size", "drop_last", "shuffle", "seed", "buffer_partitions",
    "pieces_per_partition", "buffer_bytes",
)  # fmt: skip


def fingerprint(grid: WindowGrid, rows_per_partition: np.ndarray, spec: WindowSpec, files: str | None = None) -> dict:
    """What identifies a dataset's epochs, as a dict of plain values (equal fingerprints, the same batches):
    ``(P,)`` ``rows_per_partition``, the window ``grid`` (after any split or NaN filter), ``spec``'s ordering
    settings and ``files``, the source's identity hash (``sources.identity.digest``; ``None``: none), so a
    state of swapped or rewritten same-shape files is rejected."""
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
    # the pool order, or whole partitions served by it: a state of another order is refused
    out["order"] = POOL_ORDER if spec.buffer_bytes is not None else PARTITIONS_ORDER
    return out
