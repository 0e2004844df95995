"""What a dataset holds and how to standardise it: ``inspect`` and ``stats``.

``inspect`` answers "how many windows, and how much memory will the loader
need?" from metadata alone when the dataset has a manifest (one JSON read
plus one Parquet footer, whatever the number of files). Without one it reads
every file's footer, and the series column when windows are asked for, on a
thread pool: correct, but it touches every file.

``stats`` computes per-feature count, mean, population std, min, max and NaN
count in one Dask pass: each partition reduces to a few numbers per feature
(mean and sum of squared deviations, computed in float64 in two passes over
the partition's rows), and the client merges them with Chan et al.'s
pairwise update, which stays accurate where a global sum of squares would
cancel catastrophically.
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import time as clock
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dask_windows.convert import list_inputs, read_inputs
from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.manifest import read_manifest, series_runs

__all__ = [
    "STATS_FORMAT",
    "STATS_VERSION",
    "compute_stats",
    "inspect_dataset",
    "load_stats",
    "windows_per_run",
]

logger = logging.getLogger(__name__)

STATS_FORMAT = "dask_windows.stats"
STATS_VERSION = 1
_PARQUET = (".parquet", ".parq", ".pq")


def windows_per_run(run_rows: np.ndarray | Sequence[int], window: int, stride: int = 1,
                    horizon: int = 0) -> np.ndarray:
    """Windows in runs of ``run_rows`` rows: ``max(0, (n - window - horizon) // stride + 1)``."""
    run_rows = np.asarray(run_rows, dtype=np.int64)
    return np.maximum(0, (run_rows - window - horizon) // stride + 1)


def _check_window(window: int, stride: int, horizon: int) -> None:
    if window < 1 or stride < 1 or horizon < 0:
        raise ConfigError(f"window={window}, stride={stride}, horizon={horizon}: window and "
                          f"stride must be >= 1 and horizon >= 0")


def _list_parquet(path: str, storage_options: dict | None) -> tuple[Any, str, list[dict]]:
    """The dataset's Parquet files in canonical (sorted) order, with sizes."""
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    root = root.rstrip("/")
    if fs.isdir(root):
        found = fs.find(root, detail=True)
        files = [info for p, info in sorted(found.items()) if p.lower().endswith(_PARQUET)
                 and not any(part.startswith(("_", "."))
                             for part in posixpath.relpath(p, root).split("/"))]
    elif fs.exists(root):
        files, root = [fs.info(root)], posixpath.dirname(root)
    else:
        raise FileNotFoundError(f"{path} does not exist; check the path")
    if not files:
        raise FileNotFoundError(f"no Parquet files in {path}; convert your data with "
                                f"`dask-windows convert` first")
    return fs, root, files


def inspect_dataset(
    path: str,
    *,
    series: str | None = None,
    window: int | None = None,
    stride: int = 1,
    horizon: int = 0,
    features: Sequence[str] | None = None,
    targets: Sequence[str] | None = None,
    batch_size: int = 256,
    buffer_partitions: int = 2,
    prefetch_partitions: int = 1,
    num_workers: int = 0,
    storage_options: dict | None = None,
    threads: int = 16,
) -> dict:
    """Describe a Parquet dataset from its manifest and footers.

    Args:
        path: a dataset folder or one Parquet file (fsspec URL allowed).
        series: the series column; default the manifest's.
        window, stride, horizon: the window settings to count windows for.
        features, targets: the columns the loader stacks; default every
            numeric column except series and time.
        batch_size, buffer_partitions, prefetch_partitions, num_workers: the
            loader settings to size memory for.
        storage_options: passed to fsspec.
        threads: footers and columns are read on this many threads.

    Returns:
        A JSON-ready dict (see the CLI's ``inspect`` for the fields).
    """
    started = clock.perf_counter()
    if window is not None:
        _check_window(window, stride, horizon)
    fs, root, infos = _list_parquet(path, storage_options)
    names = [posixpath.relpath(info["name"], root) for info in infos]
    manifest = read_manifest(root, fs) if fs.isdir(root) else None
    if manifest is not None and [f["path"] for f in manifest["files"]] != names:
        logger.warning("the manifest in %s lists other files than the folder holds; "
                       "ignoring it (rerun `dask-windows convert` to refresh it)", path)
        manifest = None
    series = series or (manifest["series"] if manifest else None)
    use_runs = manifest is not None and manifest["series"] == series
    schema = pq.read_schema(fs.open(infos[0]["name"]))
    if use_runs:
        rows = [f["rows"] for f in manifest["files"]]
        row_groups = None
        runs = [[(n, v) for _, n, v in f["runs"]] for f in manifest["files"]]
        source = "manifest"
    else:
        def footer(info: dict) -> tuple[int, int, Any]:
            with fs.open(info["name"]) as src:
                meta = pq.ParquetFile(src).metadata
            return meta.num_rows, meta.num_row_groups, meta.schema.to_arrow_schema()

        with ThreadPoolExecutor(threads) as pool:
            footers = list(pool.map(footer, infos))
        for info, (_, _, other) in zip(infos, footers):
            if not other.equals(schema):
                raise SchemaError(f"{info['name']} has schema {other} but {infos[0]['name']} "
                                  f"has {schema}; every file of a dataset needs the same columns")
        rows = [n for n, _, _ in footers]
        row_groups = sum(g for _, g, _ in footers)
        runs, source = None, "footers"
        if series is not None:
            if series not in schema.names:
                raise SchemaError(f"series column {series!r} is not in {path}; its columns "
                                  f"are {schema.names}")

            def read_runs(info: dict) -> list:
                with fs.open(info["name"]) as src:
                    values = pq.read_table(src, columns=[series]).column(0).to_numpy()
                return [(n, v) for _, n, v in series_runs(values)]

            with ThreadPoolExecutor(threads) as pool:
                runs = list(pool.map(read_runs, infos))
            source = "series column"
    time_col = manifest["time"] if manifest else None
    if features is None:
        features = [f.name for f in schema if f.name not in (series, time_col)
                    and f.name not in (targets or ()) and _numeric(f.type)]
    report: dict[str, Any] = {
        "path": path, "files": len(infos), "partitions": len(infos), "row_groups": row_groups,
        "rows": int(sum(rows)), "bytes": int(sum(info["size"] for info in infos)),
        "largest_partition_rows": int(max(rows)), "series_column": series,
        "time_column": time_col, "runs_from": source,
        "schema": {f.name: str(f.type) for f in schema},
    }
    if runs is not None:
        values = {_hashable(v) for file_runs in runs for _, v in file_runs}
        report["series"] = len(values)
        report["runs"] = sum(len(r) for r in runs)
    if window is not None:
        if runs is None:
            raise ConfigError("counting windows needs the series column; pass --series "
                              "(or convert the data to get a manifest)")
        per_file = [int(windows_per_run([n for n, _ in r], window, stride, horizon).sum())
                    for r in runs]
        report.update(window=window, stride=stride, horizon=horizon,
                      windows=int(sum(per_file)), largest_partition_windows=int(max(per_file)))
        report["memory"] = _memory_need(
            int(max(rows)), int(max(per_file)), len(features), len(targets or ()), window,
            horizon, batch_size, buffer_partitions, prefetch_partitions, num_workers)
    report["features"] = list(features)
    report["seconds"] = round(clock.perf_counter() - started, 4)
    return report


def _numeric(arrow_type: Any) -> bool:
    import pyarrow.types as pat

    return pat.is_integer(arrow_type) or pat.is_floating(arrow_type) or pat.is_boolean(arrow_type)


def _hashable(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _memory_need(partition_rows: int, partition_windows: int, num_features: int,
                 num_targets: int, window: int, horizon: int, batch_size: int,
                 buffer_partitions: int, prefetch_partitions: int, num_workers: int) -> dict:
    """Bytes the loader holds at its peak, per process and in total (an estimate).

    Decoded partitions hold float32 features and targets plus an int64 row
    number per row; the window index holds an int64 start and an int64
    permutation entry per window of the buffered partitions; a few batches
    are in flight.
    """
    row_bytes = 4 * (num_features + num_targets) + 8
    partitions = (buffer_partitions + prefetch_partitions) * partition_rows * row_bytes
    index = 16 * buffer_partitions * partition_windows
    y_rows = max(horizon, 1) * num_targets
    batches = 2 * batch_size * 4 * (num_features * window + y_rows)
    per_process = partitions + index + batches
    processes = max(1, num_workers)
    return {"partitions": partitions, "window_index": index, "batches": batches,
            "per_process": per_process, "processes": processes,
            "total": per_process * processes}


# ---------------------------------------------------------------- stats

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
        out.append((name, n, mean, m2, valid.min() if n else np.nan,
                    valid.max() if n else np.nan, int(nan.sum())))
    return pd.DataFrame(out, columns=["feature", "count", "mean", "m2", "min", "max", "nan"])


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
        result[name] = {"count": int(n), "mean": mean, "std": std, "min": lo, "max": hi,
                        "nan_count": int(p["nan"].sum())}
    return result


def compute_stats(
    srcs: Sequence[str] | str,
    features: Sequence[str] | None = None,
    *,
    fmt: str | None = None,
    exclude: Sequence[str] = (),
    storage_options: dict | None = None,
    compute: Callable[..., tuple] | None = None,
) -> dict:
    """Per-feature count, mean, population std, min, max and NaN count, in one pass.

    Args:
        srcs: a dataset folder, files or globs, as ``convert`` takes them.
        features: the columns; default every numeric column except the
            manifest's series and time columns and ``exclude``.
        fmt: the input format; default from file extensions.
        exclude: columns never summarised by default.
        storage_options: passed to fsspec.
        compute: ``compute(label, *collections) -> results``.

    Returns:
        The stats document (``{"format": "dask_windows.stats", ...}``).
    """
    srcs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    fmt, urls = list_inputs([str(s) for s in srcs], fmt, storage_options)
    if len(srcs) == 1:
        fs, root = fsspec.core.url_to_fs(str(srcs[0]), **(storage_options or {}))
        manifest = read_manifest(root, fs) if fs.isdir(root) else None
        if manifest:
            exclude = [*exclude, manifest["series"], manifest["time"]]
    if fmt == "npy":  # the columns read_inputs makes up are not features
        exclude = [*exclude, "__series__", "__time__"]
    ddf = read_inputs(urls, fmt, series="__series__", time="__time__",
                      storage_options=storage_options)
    if features is None:
        features = [c for c, t in ddf.dtypes.items() if c not in exclude
                    and (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))]
        if not features:
            raise SchemaError(f"{srcs[0]} has no numeric columns; pass --features")
    features = list(features)
    missing = [f for f in features if f not in ddf.columns]
    if missing:
        raise SchemaError(f"features {missing} are not in {srcs[0]}; its columns are "
                          f"{list(ddf.columns)}")
    for name in features:
        dtype = ddf.dtypes[name]
        if not (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)):
            raise SchemaError(f"feature {name!r} has dtype {dtype}, not a number; leave it "
                              f"out of --features")
    meta = pd.DataFrame({"feature": pd.Series([], dtype="object"), "count": "i8",
                         "mean": "f8", "m2": "f8", "min": "f8", "max": "f8", "nan": "i8"})
    parts = ddf[features].map_partitions(_partial_stats, features, meta=meta)
    rows = ddf.map_partitions(len, meta=("rows", "i8")).sum()
    compute = compute or (lambda label, *c: dask.compute(*c))
    parts, rows = compute("computing statistics", parts, rows)
    return {"format": STATS_FORMAT, "version": STATS_VERSION, "rows": int(rows),
            "features": _merge_stats(parts, features)}


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
        where = os.fspath(path_or_dict)
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
