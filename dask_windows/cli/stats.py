"""``stats``: per-feature count, mean, population std, min, max and NaNs in one Dask pass.

The trade-off: each partition reduces to its count, mean and sum of squared deviations (float64,
two passes over its rows), merged by Chan et al.'s pairwise update, which stays accurate where a
global sum of squares would cancel.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

import dask
import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dask_windows.cli.readers import list_inputs, read_inputs
from dask_windows.errors import ConfigError, SchemaError
from dask_windows.runtime.normalize import STATS_FORMAT, STATS_VERSION
from dask_windows.settings.spec import WindowSpec
from dask_windows.sources.manifest import read_manifest
from dask_windows.sources.parquet import ParquetSource


def _owned_stats(fs: Any, path: str, runs: list, features: list[str]) -> pd.DataFrame:
    """``_partial_stats`` of one spread-layout file's owned rows (its chunks' overlap rows left out)."""
    with fs.open(path, "rb") as src:
        table = pq.read_table(src, columns=features)
    rows = np.concatenate([np.arange(r[0], r[0] + r[4]) for r in runs]) if runs else np.zeros(0, np.int64)
    return _partial_stats(table.take(rows).to_pandas(), features)


def _partial_stats(df: pd.DataFrame, features: list[str]) -> pd.DataFrame:
    """Per feature: count, mean, M2 (sum of squared deviations), min, max, NaNs."""
    out = []
    for name in features:
        values = df[name].to_numpy(dtype=np.float64, na_value=np.nan)
        nan = np.isnan(values)
        valid = values[~nan]
        n = len(valid)
        mean = valid.mean() if n else 0.0
        m2 = float(((valid - mean) ** 2).sum()) if n else 0.0
        out.append(
            (name, len(df), n, mean, m2, valid.min() if n else np.nan, valid.max() if n else np.nan, int(nan.sum()))
        )
    return pd.DataFrame(out, columns=["feature", "rows", "count", "mean", "m2", "min", "max", "nan"])


def _merge_stats(parts: pd.DataFrame, features: Sequence[str]) -> dict:
    """Chan's parallel update over all partitions' partial stats."""
    result = {}
    for name in features:
        p = parts[parts["feature"] == name]
        counts = p["count"].to_numpy(dtype=np.float64)
        n = counts.sum()
        if n == 0:
            mean = std = lo = hi = None
        else:
            mean = float((counts * p["mean"].to_numpy()).sum() / n)
            m2 = p["m2"].sum() + (counts * (p["mean"].to_numpy() - mean) ** 2).sum()
            std, lo, hi = float(np.sqrt(m2 / n)), float(p["min"].min()), float(p["max"].max())
        result[name] = {
            "count": int(n),
            "mean": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "nan_count": int(p["nan"].sum()),
        }
    return result


def compute_stats(
    srcs: Sequence[str] | str,
    features: Sequence[str] | None = None,
    *,
    fmt: str | None = None,
    exclude: Sequence[str] = (),
    series: str | None = None,
    time: str | None = None,
    storage_options: dict | None = None,
    compute: Callable[..., tuple] | None = None,
) -> dict:
    """The stats document (``{"format": "dask_windows.stats", ...}``) of ``srcs`` (as ``convert`` takes them).

    ``features`` defaults to every numeric column but the series and time columns (the manifest's,
    or ``series`` and ``time``: one of them or ``features`` is required without a manifest) and
    ``exclude``; ``compute(label, *collections) -> results``.
    """
    srcs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    fmt, urls = list_inputs([str(s) for s in srcs], fmt, storage_options)
    manifest = None
    if len(srcs) == 1:
        fs, root = fsspec.core.url_to_fs(str(srcs[0]), **(storage_options or {}))
        manifest = read_manifest(root, fs) if fs.isdir(root) else None
        if manifest:
            exclude = [*exclude, manifest["series"], manifest["time"]]
    exclude = [*exclude, *(c for c in (series, time) if c is not None)]
    if features is None and manifest is None and series is None and time is None and fmt != "npy":
        raise ConfigError(
            f"{srcs[0]} has no manifest, so stats cannot tell its series and time columns from features (an integer "
            f"series id would be summarised as one); pass --series COL (and --time COL), or --features"
        )
    if features is not None:  # the loader's checks: no repeats, the series is not a feature
        WindowSpec(features=tuple(features), series=series)
    if fmt == "npy":  # the columns read_inputs makes up are not features
        exclude = [*exclude, "__series__", "__time__"]
    ddf = read_inputs(urls, fmt, series="__series__", time="__time__", storage_options=storage_options)
    if features is None:
        features = [
            c
            for c, t in ddf.dtypes.items()
            if c not in exclude and (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))
        ]
        if not features:
            raise SchemaError(f"{srcs[0]} has no numeric columns; pass --features")
    features = list(features)
    if fmt == "parquet":  # the loader's column check and message
        roles = dict.fromkeys(features, "feature")
        ParquetSource(urls, storage_options).check_columns(features, roles)
    missing = [f for f in features if f not in ddf.columns]
    if missing:
        raise SchemaError(f"features {missing} are not in {srcs[0]}; its columns are {list(ddf.columns)}")
    for name in features:
        dtype = ddf.dtypes[name]
        if not (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)):
            raise SchemaError(f"feature {name!r} has dtype {dtype}, not a number; leave it out of --features")
    if manifest and manifest["version"] >= 2:  # spread layout: overlap rows once
        tasks = [
            dask.delayed(_owned_stats)(fs, posixpath.join(root.rstrip("/"), f["path"]), f["runs"], features)
            for f in manifest["files"]
        ]
    else:  # one pass, feature columns only
        meta = _partial_stats(ddf._meta, features)
        tasks = [ddf[features].map_partitions(_partial_stats, features, meta=meta)]
    compute = compute or (lambda label, *c: dask.compute(*c))
    parts = pd.concat(compute("computing statistics", *tasks), ignore_index=True)
    rows = parts.loc[parts["feature"] == features[0], "rows"].sum()
    return {
        "format": STATS_FORMAT,
        "version": STATS_VERSION,
        "rows": int(rows),
        "features": _merge_stats(parts, features),
    }
