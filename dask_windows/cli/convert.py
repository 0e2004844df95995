"""Turn Parquet, CSV, Avro or ``.npy`` inputs into a loader-ready Parquet dataset with a manifest.

A disk bucket sort in Dask passes (``convert_plan``, ``scratch``, ``layout``): it reads the input
two or three times and writes it twice, for memory bounded by the block and file sizes on any
scheduler and a deterministic output. Files are written under ``DST.tmp-<hex>``, the manifest last,
and renamed to ``DST`` when all is there (``safety``: what ``DST`` may replace).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import fsspec
import numpy as np
import pandas as pd
from dask.utils import parse_bytes

from dask_windows.cli.convert_plan import PROFILE_META, Compute, _profile, _split_cuts, plan_files
from dask_windows.cli.layout import DEFAULT_SPAN, LAYOUTS
from dask_windows.cli.readers import FORMATS, file_schemas, list_inputs, read_inputs, schema_mismatch, time_parsing
from dask_windows.cli.safety import MARKER as _MARKER
from dask_windows.cli.safety import check_output, remove_leftovers
from dask_windows.cli.scratch import _write_files
from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.settings.tuning import CONVERT_DECODED_RATIO
from dask_windows.sources.manifest import read_manifest, write_manifest

__all__ = ["FORMATS", "ConvertReport", "convert", "list_inputs", "plan_files", "read_inputs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertReport:
    """What a conversion read and wrote."""

    dst: str
    rows_in: int
    rows_out: int
    files: int
    series: int
    split_series: int
    bytes_out: int
    manifest: dict
    leftovers_removed: tuple = ()
    layout: str = "contiguous"
    span: int | None = None
    rows_stored: int = 0  # rows_out plus the overlap rows repeated at chunk cuts (spread layout)
    overlap_rows: int = 0


def _default_compute(label: str, *collections: Any) -> tuple:
    logger.info("%s", label)
    return dask.compute(*collections)


def _to_datetime(df: pd.DataFrame, time: str, utc: bool, dtype: Any) -> pd.DataFrame:
    return df.assign(**{time: pd.to_datetime(df[time], utc=utc).astype(dtype)})


def _parse_times(ddf: dd.DataFrame, time: str, utc: bool) -> dd.DataFrame:
    """The time column parsed with ``pandas.to_datetime`` per partition (``dd.to_datetime`` breaks the meta)."""
    dtype = pd.to_datetime(pd.Series(["2000-01-01 00:00:00"]), utc=utc).dtype
    meta = ddf._meta.assign(**{time: pd.Series([], dtype=dtype)})
    return ddf.map_partitions(_to_datetime, time, utc, dtype, meta=meta)


def _check_columns(ddf: dd.DataFrame, series: str, time: str, parse_time: bool | str, where: str) -> dd.DataFrame:
    for flag, column in (("--series", series), ("--time", time)):
        if column not in ddf.columns:
            raise SchemaError(
                f"column {column!r} ({flag}) is not in {where}; its columns are "
                f"{list(ddf.columns)}; pass {flag} with one of them"
            )
    if series == time:
        raise ConfigError(f"--series and --time are both {series!r}; they must differ")
    if parse_time:
        ddf = _parse_times(ddf, time, utc=parse_time == "utc")
    dtype = ddf.dtypes[time]
    if not (
        pd.api.types.is_numeric_dtype(dtype)
        or pd.api.types.is_datetime64_any_dtype(dtype)
        or pd.api.types.is_timedelta64_dtype(dtype)
    ) or pd.api.types.is_complex_dtype(dtype):
        raise SchemaError(
            f"time column {time!r} in {where} has dtype {dtype}, which does not sort as time; store it as numbers or "
            f"datetimes, or pass --parse-time to parse it with pandas.to_datetime"
        )
    return ddf


def convert(
    srcs: Sequence[str],
    dst: str,
    *,
    series: str,
    time: str,
    fmt: str | None = None,
    partition_size: int | str = "256MB",
    overwrite: bool = False,
    parse_time: bool = False,
    npy_columns: Sequence[str] | None = None,
    compression: str = "snappy",
    input_block_size: int = 64 * 2**20,
    storage_options: dict | None = None,
    compute: Compute | None = None,
    layout: str = "spread",
    window: int | None = None,
    horizon: int = 0,
    chunk_rows: int | None = None,
) -> ConvertReport:
    """Convert inputs into a sorted, series-aligned Parquet dataset with a manifest (the keywords are
    ``dask-windows convert``'s flags: docs/cli.md, docs/converted.md).

    Args:
        input_block_size: Bytes of input per read task (at most the target).
        compute: ``compute(label, *collections) -> results`` (default ``dask.compute``).

    Raises:
        FileExistsError: ``dst`` is in the way (not new, empty or, with ``overwrite``, an earlier
            convert output) or overlaps an input.
        SchemaError: a column is missing or the time column cannot be sorted.
        DataError: null series or time values, or rows lost on the way.
    """
    compute = compute or _default_compute
    target_bytes = parse_bytes(partition_size) if isinstance(partition_size, str) else int(partition_size)
    if target_bytes <= 0:
        raise ConfigError(f"partition_size={partition_size!r} must be positive, e.g. 256MB")
    spread = _spread_options(layout, window, horizon, chunk_rows)
    out_fs, root = fsspec.core.url_to_fs(dst, **(storage_options or {}))
    root = root.rstrip("/")
    fmt, files = list_inputs(srcs, fmt, storage_options)
    check_output(out_fs, root, dst, srcs, files, overwrite, storage_options)
    schemas, parsing, remedy = time_parsing(fmt, file_schemas(files, fmt, storage_options), time, parse_time)
    mismatch = schema_mismatch(files, schemas, remedy)
    if mismatch:
        raise SchemaError(mismatch)
    leftovers = remove_leftovers(out_fs, root)
    ddf = read_inputs(
        files,
        fmt,
        series=series,
        time=time,
        npy_columns=npy_columns,
        blocksize=min(target_bytes, input_block_size),
        storage_options=storage_options,
    )
    where = files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more files)"
    ddf = _check_columns(ddf, series, time, parsing, where)

    # pass 1: per-series rows, per-partition rows, null times, bytes per row
    counts, profile = compute(
        "counting rows per series",
        ddf[series].value_counts(dropna=False),
        ddf.map_partitions(_profile, series, time, compression, meta=PROFILE_META),
    )
    rows_in = int(profile["rows"].sum())
    nulls = (("series", series, counts[counts.index.isna()].sum()), ("time", time, profile["null_time"].sum()))
    for what, column, count in nulls:
        if count:
            raise DataError(
                f"{what} column {column!r} has {int(count)} null values in {where}; fill or drop them first"
            )
    try:
        counts = counts.sort_index()
    except TypeError as exc:
        raise DataError(
            f"series column {series!r} mixes values that cannot be ordered ({exc}); cast it to one type first"
        ) from exc
    bytes_per_row = float(np.nanmax(np.append(profile["bytes_per_row"].to_numpy(), 1.0)))
    bytes_per_file = float(np.nan_to_num(profile["bytes_per_file"].iloc[0]))
    target_rows = max(1, int((target_bytes - min(bytes_per_file, target_bytes / 2)) / bytes_per_row))
    # and at most CONVERT_DECODED_RATIO x partition_size in memory: a file of data that compresses
    # well would otherwise be many times its size in the worker sorting it and in every loader buffer
    decoded_per_row = float(np.nanmax(np.append(profile["decoded_per_row"].to_numpy(), 1.0)))
    target_rows = max(1, min(target_rows, int(CONVERT_DECODED_RATIO * target_bytes / decoded_per_row)))
    keys = counts.index
    first_file, num_pieces = plan_files(counts.to_numpy(), target_rows)
    num_files = int(first_file[-1] + num_pieces[-1]) if len(keys) else 0
    logger.info(
        "%d rows, %d series, ~%.1f bytes/row -> %d files of <= %d rows",
        rows_in,
        len(keys),
        bytes_per_row,
        num_files,
        target_rows,
    )

    # pass 2: where to cut series too long for one file
    cuts = _split_cuts(ddf, series, time, keys, num_pieces, compute) if (num_pieces > 1).any() else {}

    tmp = f"{root}.tmp-{uuid.uuid4().hex[:12]}"
    out_fs.makedirs(tmp, exist_ok=True)
    marker = posixpath.join(tmp, _MARKER)
    try:
        with out_fs.open(marker, "w") as out:
            json.dump({"pid": os.getpid(), "host": socket.gethostname()}, out)
        entries = []
        if num_files:
            plan = (series, time, keys, first_file, cuts)
            if spread is not None:
                spread.update(series_rows=counts.to_numpy(), keys=list(keys), target_rows=target_rows)
            entries = _write_files(ddf, out_fs, tmp, plan, num_files, compression, compute, spread)
        rows_out = sum(e["rows"] for e in entries)
        if spread is not None:  # overlap rows are stored twice; owned rows count each row once
            rows_out = sum(run[4] for e in entries for run in e["runs"])
        if rows_out != rows_in:
            raise DataError(
                f"read {rows_in} rows but wrote {rows_out}; the input changed "
                f"while converting, or this is a bug (please report it)"
            )
        write_manifest(
            tmp,
            out_fs,
            series=series,
            time=time,
            files=entries,
            span=None if spread is None else spread["span"],
            layout=None if spread is None else "spread",
        )
        out_fs.rm(marker)
        _move_into_place(out_fs, tmp, root)
    except BaseException:
        if out_fs.exists(tmp):  # never leave a dataset-shaped folder behind
            out_fs.rm(tmp, recursive=True)
        raise
    manifest = read_manifest(root, out_fs)  # reread: what a loader will see
    if manifest is None:
        raise DataError(f"{dst} has no readable manifest after converting; rerun the conversion")
    if entries:
        from dask_windows.sources.parquet.index_writer import write_index

        _date_outputs_as_inputs(out_fs, root, entries, files, storage_options)
        write_index(out_fs.unstrip_protocol(root), storage_options=out_fs.storage_options, series=series)
    stored = sum(e["rows"] for e in entries)
    return ConvertReport(
        dst=dst,
        rows_in=rows_in,
        rows_out=rows_out,
        files=len(entries),
        series=len(keys),
        split_series=series_spread(entries)[0],
        bytes_out=sum(e["bytes"] for e in entries),
        manifest=manifest,
        layout=layout,
        span=None if spread is None else spread["span"],
        leftovers_removed=tuple(leftovers),
        rows_stored=stored,
        overlap_rows=stored - rows_out,
    )


def _spread_options(layout: str, window: int | None, horizon: int, chunk_rows: int | None) -> dict | None:
    """Validated options of the spread layout, or ``None`` for the contiguous one."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}; use 'spread' (the default)")
    for name, value, low in (("window", window, 1), ("horizon", horizon, 0), ("chunk_rows", chunk_rows, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low):
            raise ConfigError(f"{name}={value!r} must be an int >= {low}")
    if layout == "contiguous":
        return None
    span = DEFAULT_SPAN if window is None else int(window) + int(horizon)
    return {"span": span, "chunk_rows": None if chunk_rows is None else int(chunk_rows)}


def _date_outputs_as_inputs(
    out_fs: Any, root: str, entries: list[dict], files: Sequence[str], storage_options: dict | None
) -> None:
    """Date local outputs as the newest local input, so a second run writes a byte-identical index."""
    if "file" not in out_fs.protocol and "local" not in out_fs.protocol:
        return
    newest = 0
    for url in files:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        if "file" not in fs.protocol and "local" not in fs.protocol:
            return  # a remote input: no local time to date the outputs with
        newest = max(newest, os.stat(path).st_mtime_ns)
    for entry in entries:
        os.utime(posixpath.join(root, entry["path"]), ns=(newest, newest))


def _move_into_place(fs: Any, tmp: str, root: str) -> None:
    """Rename the finished temporary folder to ``root``, replacing an old one."""
    old = None
    if fs.exists(root):
        old = f"{root}.old-{uuid.uuid4().hex[:12]}"
        fs.mv(root, old, recursive=True)
    fs.mv(tmp, root, recursive=True)
    if old is not None:
        fs.rm(old, recursive=True)


def series_spread(entries: Sequence[dict]) -> tuple[int, int]:
    """``(series in more than one file, rows of the longest series)`` of a manifest's ``entries``."""
    files: dict[str, set[int]] = {}
    rows: dict[str, int] = {}
    for i, entry in enumerate(entries):
        for run in entry["runs"]:
            key = json.dumps(run[2], sort_keys=True, default=str)  # manifest values: str, int, float, bool
            files.setdefault(key, set()).add(i)
            rows[key] = rows.get(key, 0) + int(run[4] if len(run) >= 5 else run[1])
    return sum(len(f) > 1 for f in files.values()), max(rows.values(), default=0)
