"""Standardisation statistics: reading a ``dask-windows stats`` file (or dict) for ``normalize=``.

The file is written by ``dask-windows stats`` (``cli.summary.compute_stats``):
per-feature count, mean, population std, min, max and NaN count. The loader
only needs mean and std per channel, as float32, in channel order.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import fsspec
import numpy as np

from dask_windows.errors import DataError, SchemaError

__all__ = ["STATS_FORMAT", "STATS_VERSION", "load_stats"]

logger = logging.getLogger(__name__)

STATS_FORMAT = "dask_windows.stats"
STATS_VERSION = 1


def load_stats(path_or_dict: str | os.PathLike | dict, features: Sequence[str],
               storage_options: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of ``features`` from a stats file or dict, for standardising.

    Args:
        path_or_dict: a ``dask-windows stats`` JSON file (fsspec URL allowed)
            or its decoded dict, or ``{feature: {"mean": .., "std": ..}}``.
        features: the columns, in channel order.
        storage_options: passed to fsspec when reading a file.

    Returns:
        ``(mean, std)``, float32 arrays of shape ``(len(features),)``. ``std``
        is the population std and may hold zeros for constant features.

    Raises:
        SchemaError: a feature is missing or has no mean/std (all NaN).
        DataError: the file is not a stats document.
    """
    where = "the stats dict"
    doc = path_or_dict
    if not isinstance(doc, dict):
        where = os.fspath(doc)
        with fsspec.open(where, "r", **(storage_options or {})) as src:
            try:
                doc = json.load(src)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where} is not JSON ({exc}); create it with "
                                f"`dask-windows stats PATH --out {where}`") from exc
    if "format" in doc:
        if doc["format"] != STATS_FORMAT or doc.get("version") != STATS_VERSION:
            raise DataError(f"{where} is not a dask_windows stats file version "
                            f"{STATS_VERSION} (format {doc.get('format')!r}, version "
                            f"{doc.get('version')!r}); recreate it with `dask-windows stats`")
        doc = doc["features"]
    mean = np.empty(len(features), dtype=np.float32)
    std = np.empty(len(features), dtype=np.float32)
    for i, name in enumerate(features):
        entry = doc.get(name)
        if not isinstance(entry, dict) or entry.get("mean") is None or entry.get("std") is None:
            known = sorted(doc)
            raise SchemaError(f"{where} has no mean/std for feature {name!r} (it has {known}); "
                              f"rerun `dask-windows stats PATH --features ...` including it")
        mean[i], std[i] = entry["mean"], entry["std"]
    if (std == 0).any():
        logger.warning("features %s are constant in %s (std 0)",
                       [f for f, s in zip(features, std) if s == 0], where)
    return mean, std
