"""``WindowDataset`` settings resolved when it is opened: the order (``resolve_order``), the deprecated
keywords (``deprecated_pieces``, ``piece_budget``, ``deprecated_read_workers``) and ``normalize=``."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import BUFFER_BYTES
from dask_windows.sources import Source

__all__ = ["deprecated_pieces", "deprecated_read_workers", "piece_budget", "resolve_normalize", "resolve_order"]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_order(pieces_per_partition: Any, buffer_bytes: Any, source: Any) -> Any:
    """``buffer_bytes`` of the pool order (the default), or ``None`` for whole partitions: asked for by
    ``pieces_per_partition``, or the default of Dask frames (a read computes a whole partition) and of
    data ``dask-windows convert`` spread (whole partitions already mix) unless ``buffer_bytes`` is given."""
    if pieces_per_partition is not None:
        if buffer_bytes is not None:
            raise ConfigError(
                f"buffer_bytes={buffer_bytes!r} and pieces_per_partition={pieces_per_partition!r} ask for two "
                "orders; pass buffer_bytes for the default pool order, or pieces_per_partition (with "
                "buffer_partitions) for the piece order"
            )
        return None
    if buffer_bytes is None and source.default_pieces_per_partition is not None:
        return None
    return BUFFER_BYTES if buffer_bytes is None else buffer_bytes


def deprecated_pieces(pieces_per_partition: Any, device: Any) -> Any:
    """``pieces_per_partition``, but a count above 1 (deprecated) warns and becomes ``None`` (the pool order,
    with ``piece_budget``)."""
    if not (_count(pieces_per_partition) and pieces_per_partition > 1):
        return pieces_per_partition
    warnings.warn(
        f"pieces_per_partition={pieces_per_partition} is deprecated: the piece order it asked for decoded each "
        "row group once per piece, so its reads grew with the dataset, and it is no longer served. "
        "The default pool order (each row group read once per epoch) now serves it, with a memory budget "
        "of two buffers of buffer_partitions partitions. "
        "Drop pieces_per_partition for the default pool order, set buffer_bytes to size its memory, or pass "
        "pieces_per_partition=1 for whole partitions (docs/configuration.md)",
        DeprecationWarning,
        stacklevel=4,  # WindowDataset(...) in the caller's code (this <- config.resolve <- WindowDataset)
    )
    return None


def deprecated_read_workers(read_workers: Any, read_deadline: Any) -> None:
    """Warn that ``read_workers`` and ``read_deadline``, when given, are ignored."""
    given = [f"{name}={value!r}" for name, value, unset in (
        ("read_workers", read_workers, 0), ("read_deadline", read_deadline, None)) if value != unset]  # fmt: skip
    if not given:
        return
    one = len(given) == 1
    warnings.warn(
        f"{' and '.join(given)} {'is' if one else 'are'} deprecated and ignored, and will be removed in 0.4: "
        "read_workers started read processes that served only whole partitions (pieces_per_partition=1), while "
        f"the default pool order reads each unit once on a reader thread; drop {'it' if one else 'them'}",
        DeprecationWarning,
        stacklevel=3,  # WindowDataset(...) in the caller's code (this <- WindowDataset.__init__)
    )


def piece_budget(source: Source, buffer_partitions: Any, features: Any, targets: Any, stride: Any) -> int | None:
    """The pool order's ``buffer_bytes`` for a deprecated ``pieces_per_partition > 1``: the memory the piece
    order held (docs/configuration.md), or ``None`` for invalid settings (``WindowSpec`` raises on them)."""
    if not (_count(buffer_partitions) and buffer_partitions >= 1 and _count(stride) and stride >= 1):
        return None
    partitions = source.partitions
    rows = math.ceil(sum(p.num_rows for p in partitions) / max(len(partitions), 1))
    columns = sum(0 if v is None else 1 if isinstance(v, (str, int)) else len(list(v)) for v in (features, targets))
    return max(1, int(2 * buffer_partitions * rows * (4 * max(columns, 1) + 8 / stride)))


def resolve_normalize(normalize: Any, spec: WindowSpec, storage_options: dict | None = None) -> Any:
    """``None``, ``"sample"`` or ``(mean, std)`` float32 arrays of the features.

    A constant feature (std 0 in a stats file) is only centred: its std is taken as 1.
    """
    if normalize is None or (isinstance(normalize, str) and normalize == "sample"):
        return normalize
    if isinstance(normalize, dict) and "mean" in normalize and "std" in normalize:
        with np.errstate(over="ignore"):  # beyond float32 becomes inf, rejected below
            mean = np.asarray(normalize["mean"], np.float32).reshape(-1)
            std = np.asarray(normalize["std"], np.float32).reshape(-1)
        if mean.shape != (len(spec.features),) or std.shape != mean.shape:
            raise ConfigError(
                f"normalize mean/std have shapes {mean.shape}/{std.shape}; expected ({len(spec.features)},), "
                "one value per feature"
            )
        if not np.all(std > 0) or not np.all(np.isfinite(std)) or not np.all(np.isfinite(mean)):
            raise ConfigError(
                "normalize std must be finite and > 0 and mean finite for every feature "
                f"(got mean={mean.tolist()}, std={std.tolist()}); pass the statistics of clean data"
            )
        return mean, std
    if isinstance(normalize, (str, os.PathLike, dict)):
        from dask_windows.runtime.normalize import load_stats

        try:
            mean, std = load_stats(normalize, list(spec.features), storage_options)
        except FileNotFoundError as exc:
            raise ConfigError(
                f"normalize={normalize!r} is neither 'sample' nor an existing stats file; write one with "
                "`dask-windows stats PATH --features ... --out stats.json`, or pass {'mean': [...], 'std': [...]}"
            ) from exc
        return mean, np.where(std > 0, std, np.float32(1.0)).astype(np.float32)
    raise ConfigError(
        f"normalize={normalize!r} is not understood; pass None, 'sample', {{'mean': [...], 'std': [...]}} "
        "or the path of a stats file written by `dask-windows stats`"
    )
