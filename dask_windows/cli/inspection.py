"""``inspect``: windows and loader memory of a dataset, counted by the loader itself.

Opens the very ``WindowDataset`` a training script would open, with the same
arguments, so the counts cannot disagree with the loader's (see
:mod:`dask_windows.cli.summary`). Re-exported by ``dask_windows.cli.summary``.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time as clock
from typing import Any

import fsspec
import numpy as np
import pyarrow.parquet as pq

from dask_windows.cli.inspect_nan import reject_non_finite
from dask_windows.errors import ConfigError
from dask_windows.planning.index import PartitionRuns, WindowGrid
from dask_windows.planning.windows import windows_per_run
from dask_windows.settings.spec import WindowSpec
from dask_windows.sources.base import DEFAULT_PARTITION_BYTES
from dask_windows.sources.manifest import read_manifest, span_shortfall
from dask_windows.sources.parquet import PARQUET_SUFFIXES, ParquetSource
from dask_windows.sources.retry import resolve_retry

logger = logging.getLogger("dask_windows.cli.summary")


def _check_window(window: int, stride: int, horizon: int) -> WindowSpec:
    """The loader's own validation of the window settings (its errors, word for word)."""
    return WindowSpec(
        features=("_",), targets=("_t",) if horizon else (), window=window, stride=stride, horizon=horizon
    )


def manifest_windows(manifest: dict, window: int, stride: int = 1, horizon: int = 0) -> tuple[int, int]:
    """Windows a converted dataset holds, and windows its file cuts lost.

    A series split across files loses the windows that would straddle a cut:
    the lost count compares each series' windows as one run with the sum over
    its pieces (pieces of one series are consecutive runs of equal value).

    Returns:
        ``(windows, windows_lost)``.
    """
    spec = _check_window(window, stride, horizon)
    runs = [run for f in manifest["files"] for run in f["runs"]]
    span = spec.span
    if manifest.get("version", 1) >= 2:  # chunks overlap: only a span beyond the overlap loses windows
        lost, total = span_shortfall(dict(manifest, span=min(manifest["span"], span - 1)), span, stride)
        return total - lost, lost
    grid = WindowGrid.from_runs(
        [
            PartitionRuns(
                np.array([a for a, _, _ in f["runs"]], np.int64),
                np.array([n for _, n, _ in f["runs"]], np.int64),
                np.array([v for _, _, v in f["runs"]], object),
            )
            for f in manifest["files"]
        ],
        span,
        stride,
    )
    kept = int(grid.windows_per_partition.sum())  # the loader's grid of the same runs
    whole: list[int] = []  # rows of each series before it was cut into files
    previous = object()
    for _, rows, value in runs:
        if whole and value == previous:
            whole[-1] += rows
        else:
            whole.append(rows)
        previous = value
    return kept, int(windows_per_run(whole, span, stride).sum()) - kept


def _manifest_for(path: str, storage_options: dict | None) -> tuple[Any, str, dict | None]:
    """The manifest of the folder ``path`` when it names exactly the files there."""
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    root = root.rstrip("/")
    if not fs.isdir(root):
        return fs, root, None
    manifest = read_manifest(root, fs)
    if manifest is None:
        return fs, root, None
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
        return fs, root, None
    return fs, root, manifest


def inspect_dataset(path: str, *, num_workers: int = 0, **keywords: Any) -> dict:
    """Describe a Parquet dataset as ``WindowDataset`` sees it, by opening one.

    The keywords are ``WindowDataset``'s and are validated by it, so a
    setting the loader rejects fails here with the loader's error, and
    ``windows`` equals ``WindowDataset(path, ...).num_windows``; zero windows
    raise the loader's ``DataError`` naming the longest run. Three differ:

    Args:
        path: a dataset folder, glob or Parquet file (fsspec URL allowed).
        num_workers: DataLoader workers, to size memory for.
        keywords: ``WindowDataset``'s (see ``dask_windows.settings.config.KEYWORDS``), but
            ``series`` defaults to the manifest's (``None``: each partition is
            one run, as in ``WindowDataset(series=None)``); without ``window``
            only files, rows, series and schema are reported; ``features``
            default to every numeric column except series, time and targets.

    Returns:
        A JSON-ready dict (see the CLI's ``inspect`` for the fields).
    """
    from dask_windows.dataset import WindowDataset  # imports torch
    from dask_windows.settings.config import ReadConfig, group_of

    started = clock.perf_counter()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"num_workers={num_workers!r} must be an int >= 0")
    read = ReadConfig(**{k: v for k, v in keywords.items() if group_of(k, "inspect_dataset") == "read"})
    _, _, manifest = _manifest_for(path, read.storage_options)
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
        features = [
            f.name
            for f in schema
            if f.name not in (series, time_col) and f.name not in (targets or ()) and _numeric(f.type)
        ]
    settings = dict(keywords, features=features, series=series, window=window if window is not None else 1)
    ds = WindowDataset(source, **settings)
    if window is not None:  # the loader checks NaN only when it builds a buffer: told here
        reject_non_finite(ds, lambda: WindowDataset(source, **dict(settings, nan="drop")))
    spec = ds.spec
    runs = [r.series_runs for r in ds.runs]
    rows = [p.num_rows for p in ds.partitions]
    used = getattr(source, "_manifest", None)
    if series is None:
        runs_from = "partitions"
    elif used is not None and used.get("series") == series:
        runs_from = "manifest"
    else:
        runs_from = "series column"
    num_files = len(source.files)
    report: dict[str, Any] = {
        "path": path,
        "files": num_files,
        "partitions": len(rows),
        "rows": int(sum(rows)),
        "bytes": sum(source.fs.size(f) for f in source.files) if num_files < 1000 else None,
        "largest_partition_rows": int(max(rows, default=0)),
        "series_column": series,
        "time_column": time_col,
        "runs_from": runs_from,
        "series": (len({_key(k) for r in runs for k in r.keys.tolist()}) if series is not None else None),
        "runs": sum(len(r.lengths) for r in runs),
        "schema": {f.name: str(f.type) for f in schema},
        "features": list(ds.spec.features),
        "targets": list(ds.spec.targets),
        "nan": spec.nan,
        "skipped": [s.name for s in ds.skipped] if ds.skipped else [],
    }
    if window is not None:
        per_partition = ds.windows_per_partition
        report.update(
            window=window,
            stride=spec.stride,
            horizon=spec.horizon,
            windows=ds.num_windows,
            largest_partition_windows=int(per_partition.max(initial=0)),
            left_out={"runs": ds.left_out.runs, "rows": ds.left_out.rows},  # series shorter than the span
        )
        if used is not None:  # converted for a shorter span: windows across its chunk cuts are lost
            from dask_windows.sources.manifest import span_shortfall

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


def _numeric(arrow_type: Any) -> bool:
    import pyarrow.types as pat

    return pat.is_integer(arrow_type) or pat.is_floating(arrow_type) or pat.is_boolean(arrow_type)


def _key(value: Any) -> Any:
    return json.dumps(value.item() if isinstance(value, np.generic) else value, default=str)


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
    """Peak bytes a ``WindowDataset`` iteration holds, per process and in total.

    An upper estimate from the largest partition, following the loader's
    layout: decoded partitions are float32 ``(C, rows)`` features plus
    ``(T, rows)`` targets (counted at 8 bytes, int64 when integral); a buffer
    holds ``buffer_partitions`` of them plus their concatenation, while
    ``prefetch_partitions`` more are decoded ahead and one is being read in
    its file's dtypes (counted at 8 bytes a value); the window index is one
    int32/int64 start per buffered window; two batches are in flight (one
    more per DataLoader prefetch slot in each worker).
    """
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
