"""``WindowDataset`` settings resolved when it is opened: pieces, normalize.

The default of ``pieces_per_partition`` (used by ``config.resolve``), and ``normalize=``
turned into ``None``, ``"sample"`` or per-feature ``(mean, std)`` arrays. The keyword
arguments passed on to ``open_source`` are ``config.ReadConfig.source_options``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.sources import Source
from dask_windows.spec import WindowSpec

__all__ = ["resolve_normalize", "resolve_pieces"]


def resolve_pieces(pieces_per_partition: Any, source: Source, batch_size: Any, buffer_partitions: Any) -> Any:
    """``pieces_per_partition``, or its default: enough for ``2 * batch_size`` pieces per buffer."""
    if pieces_per_partition is not None:
        return pieces_per_partition
    if source.default_pieces_per_partition is not None:
        return source.default_pieces_per_partition
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (batch_size, buffer_partitions))
    return -(-2 * batch_size // buffer_partitions) if valid else 1  # invalid values: WindowSpec raises


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
        from dask_windows.normalize import load_stats

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
