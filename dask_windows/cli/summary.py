"""What a dataset holds: ``inspect`` (here) and ``stats`` (:mod:`dask_windows.cli.stats`). ``inspect``
opens the very ``WindowDataset`` a training script would, so its checks, errors and counts are the
loader's own, for the loader's opening cost and torch's import."""

from __future__ import annotations

import json
import logging
import posixpath
import time as clock
from collections.abc import Callable
from itertools import groupby
from typing import Any

import fsspec
import numpy as np
import pyarrow.parquet as pq

from dask_windows.cli.stats import compute_stats
from dask_windows.errors import ConfigError, DataError
from dask_windows.opening.checks import bad_value_rows, value_problem
from dask_windows.planning.windows import windows_per_run
from dask_windows.settings.spec import WindowSpec
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES
from dask_windows.sources.manifest import read_manifest, span_shortfall
from dask_windows.sources.parquet import PARQUET_SUFFIXES, ParquetSource
from dask_windows.sources.retry import resolve_retry

__all__ = ["compute_stats", "inspect_dataset", "loader_memory", "manifest_windows"]

logger = logging.getLogger(__name__)


def manifest_windows(manifest: dict, window: int, stride: int = 1, horizon: int = 0) -> tuple[int, int]:
    """``(windows, windows_lost)`` of a converted dataset: a series split across files (version 1)
    loses the windows straddling a cut; chunks (version 2) only those of a span beyond the overlap."""
    # the loader's own validation of the window settings (its errors, word for word)
    spec = WindowSpec(
        features=("_",), targets=("_t",) if horizon else (), window=window, stride=stride, horizon=horizon
    )
    span = spec.span
    if manifest.get("version", 1) >= 2:
        lost, total = span_shortfall(dict(manifest, span=min(manifest["span"], span - 1)), span, stride)
        return total - lost, lost
    runs = [run for f in manifest["files"] for run in f["runs"]]
    kept = int(windows_per_run([rows for _, rows, _ in runs], span, stride).sum())
    whole = [sum(rows for _, rows, _ in pieces) for _, pieces in groupby(runs, key=lambda run: run[2])]
    return kept, int(windows_per_run(whole, span, stride).sum()) - kept


def _manifest_for(path: str, storage_options: dict | None) -> dict | None:
    """The manifest of the folder ``path`` when it names exactly the files there."""
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    root = root.rstrip("/")
    manifest = read_manifest(root, fs) if fs.isdir(root) else None
    if manifest is None:
        return None
    found = sorted(
        posixpath.relpath(p, root)
        for p in fs.find(root)
        if p.lower().endswith(PARQUET_SUFFIXES)
        and not any(part.startswith(("_", ".")) for part in posixpath.relpath(p, root).split("/"))
    )
    if [f["path"] for f in manifest["files"]] != found:
        logger.warning(
            "the manifest of %s lists other files than the folder holds; ignoring "
            "it (rerun `dask-windows convert` to refresh it)",
            path,
        )
        return None
    return manifest


def inspect_dataset(path: str, *, num_workers: int = 0, **keywords: Any) -> dict:
    """Describe a Parquet dataset as ``WindowDataset(path, **keywords)`` sees it, by opening one, as a
    JSON-ready dict; ``features`` defaults to every numeric column but series, time and targets,
    and without ``window`` only files, rows, series and schema are reported."""
    import pyarrow.types as pat

    from dask_windows.dataset import WindowDataset  # imports torch
    from dask_windows.settings.config import ReadConfig, group_of

    started = clock.perf_counter()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"num_workers={num_workers!r} must be an int >= 0")
    read = ReadConfig(**{k: v for k, v in keywords.items() if group_of(k, "inspect_dataset") == "read"})
    manifest = _manifest_for(path, read.storage_options)
    series = keywords.get("series")
    series = series if series is not None else (manifest["series"] if manifest else None)
    time_col = manifest["time"] if manifest else None
    source = ParquetSource(
        path,
        read.storage_options,
        threads=read.threads,
        retry=resolve_retry(read.retries),
        on_error=read.on_error,
        partition_bytes=read.partition_bytes if read.partition_bytes is not None else DEFAULT_PARTITION_BYTES,
    )
    with source.fs.open(source.files[0], "rb") as first:
        schema = pq.read_schema(first)
    features, targets, window = keywords.get("features"), keywords.get("targets"), keywords.get("window")
    if features is None:
        numeric = (pat.is_integer, pat.is_floating, pat.is_boolean)
        features = [
            f.name
            for f in schema
            if f.name not in (series, time_col, *(targets or ())) and any(t(f.type) for t in numeric)
        ]
    settings = dict(keywords, features=features, series=series, window=window if window is not None else 1)
    ds = WindowDataset(source, **settings)
    if window is not None:  # the loader checks NaN only when it builds a buffer: told here
        _reject_non_finite(ds, lambda: WindowDataset(source, **dict(settings, nan="drop")))
    spec = ds.spec
    runs = [r.series_runs for r in ds.runs]
    rows = [p.num_rows for p in ds.partitions]
    used = getattr(source, "_manifest", None)
    runs_from = "manifest" if used is not None and used.get("series") == series else "series column"
    num_files = len(source.files)
    keys = {json.dumps(k.item() if isinstance(k, np.generic) else k, default=str) for r in runs for k in r.keys}
    report: dict[str, Any] = {
        "path": path,
        "files": num_files,
        "partitions": len(rows),
        "rows": int(sum(rows)),
        "bytes": sum(source.fs.size(f) for f in source.files) if num_files < 1000 else None,
        "largest_partition_rows": int(max(rows, default=0)),
        "series_column": series,
        "time_column": time_col,
        "runs_from": runs_from if series is not None else "partitions",
        "series": len(keys) if series is not None else None,
        "runs": sum(len(r.lengths) for r in runs),
        "schema": {f.name: str(f.type) for f in schema},
        "features": list(spec.features),
        "targets": list(spec.targets),
        "nan": spec.nan,
        "skipped": [s.name for s in ds.skipped] if ds.skipped else [],
    }
    if window is not None:
        report.update(
            window=window,
            stride=spec.stride,
            horizon=spec.horizon,
            windows=ds.num_windows,
            largest_partition_windows=int(ds.windows_per_partition.max(initial=0)),
            left_out={"runs": ds.left_out.runs, "rows": ds.left_out.rows},  # series shorter than the span
        )
        if used is not None:  # converted for a shorter span: windows across its chunk cuts are lost
            lost, total = span_shortfall(used["manifest"], spec.span, spec.stride)
            if lost:
                report["chunk_cuts"] = {"lost": lost, "total": total, "converted_span": used["manifest"]["span"]}
        report["memory"] = loader_memory(
            report["largest_partition_rows"],
            report["largest_partition_windows"],
            len(report["features"]),
            len(report["targets"]),
            window,
            spec.horizon,
            spec.batch_size,
            spec.buffer_partitions,
            spec.prefetch_partitions,
            num_workers,
        )
    report["seconds"] = round(clock.perf_counter() - started, 4)
    return report


def _reject_non_finite(ds: Any, open_dropping: Callable[[], Any]) -> None:
    """Raise ``DataError`` where ``ds`` (``nan="raise"``) holds a window with NaN or inf, as the loader
    would when it builds a buffer: ``open_dropping()`` (``nan="drop"``) counts the windows it drops."""
    if ds.spec.nan != "raise" or ds.num_windows == 0:
        return
    dropping = open_dropping()
    lost = ds.num_windows - dropping.num_windows
    if lost <= 0:
        return
    differ = np.flatnonzero(np.asarray(ds.windows_per_partition) != np.asarray(dropping.windows_per_partition))
    index = int(differ[0]) if len(differ) else 0
    columns = list(dict.fromkeys([*ds.spec.features, *ds.spec.targets]))
    name = ds.partitions[index].name
    values = ds.source.read_rows(index, columns, 0, ds.source.readable_rows(index))
    rows = bad_value_rows(values)
    where = f"in {name}"
    if len(rows):
        row = int(rows[0])
        column = next(c for c in columns if len(bad_value_rows({c: values[c][row : row + 1]})))
        where = f"{value_problem(float(values[column][row]))} in column {column!r} of {name} at row {row}"
    raise DataError(
        f"{where}: {lost:,} of {ds.num_windows:,} windows hold NaN or inf, which the loader rejects with "
        "nan='raise' when it reaches them; clean the data, or pass nan='drop' to leave those windows out"
    )


def loader_memory(
    partition_rows: int,
    partition_windows: int,
    num_features: int,
    num_targets: int,
    window: int,
    horizon: int,
    batch_size: int,
    buffer_partitions: int = 2,
    prefetch_partitions: int = 1,
    num_workers: int = 0,
) -> dict:
    """Peak bytes a ``WindowDataset`` iteration holds, per process and in total: an upper estimate from
    the largest partition, one int64 start per buffered window and the batches in flight."""
    values = num_features * 4 + num_targets * 8  # bytes a decoded row takes
    decoded = partition_rows * values
    concatenated = decoded * buffer_partitions if buffer_partitions > 1 else 0
    partitions = decoded * (buffer_partitions + prefetch_partitions) + concatenated
    reading = partition_rows * (num_features + num_targets) * 8
    index = 8 * buffer_partitions * partition_windows
    batch = batch_size * (num_features * window * 4 + num_targets * max(horizon, 1) * 8)
    batches = batch * (2 if num_workers == 0 else 4)
    per_process = partitions + reading + index + batches
    processes = max(1, num_workers)
    return {
        "partitions": partitions + reading,
        "window_index": index,
        "batches": batches,
        "per_process": per_process,
        "processes": processes,
        "total": per_process * processes,
    }
