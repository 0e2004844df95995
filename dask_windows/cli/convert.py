"""Turn Parquet, CSV, Avro or ``.npy`` inputs into a loader-ready Parquet dataset.

The output is sorted by (series, time) and cut into files near a target size
*at series boundaries*: a window never crosses a file, so every cut through a
series loses the windows that would have straddled it. Whole series are packed
greedily into files; only a series larger than the target is split, into the
fewest nearly equal pieces. Each output file is one Parquet row group, so a
file is one partition for every reader.

It runs as Dask passes, none of which holds more than one input block or one
output file on a worker: (1) per-series row counts and a size sample; (2) only
when some series must be split, a small weighted sample of their times to
place the cuts; (3) every input block is split by output file into one Arrow
scratch file (one record batch per output file) under the temporary output
folder; (4) one task per output file reads its batches, sorts them by
(series, time) and writes the file. This disk bucket sort costs reading the
input two or three times and writing it twice, in exchange for memory bounded
by the block and target sizes, not by the input, on any Dask scheduler, with
no shuffle service to tune. A stable sort over batches taken in input order
keeps rows with equal (series, time) in input order: conversion is
deterministic.

That is the ``layout="contiguous"`` output. The default ``layout="spread"``
(:mod:`dask_windows.cli.layout`, ``docs/converted.md``) sorts those buckets
the same way and then deals the canonical order, in chunks overlapping by
``window + horizon - 1`` rows, over all output files (one more scratch pass),
so any few files mix like the whole dataset and no window is lost at a cut.

Files are written under ``DST.tmp-<uuid>``, the manifest last, and the folder
is renamed to ``DST`` only when everything is there. Inputs are listed and
read by :mod:`dask_windows.cli.readers`.

Safety before speed: ``DST`` is replaced only when it is an earlier convert
output (its manifest at the root, nothing but its parts and ``_`` files
beside it), never when it is a file, another folder, an input, or a folder
holding or lying inside an input, whatever the flags. Every input file's
schema is read first (one footer or one MiB of CSV each) and differences are
refused in one message before any Dask work. The scratch files are
zstd-compressed Arrow IPC: they cost a little CPU to bound the scratch disk
near the size of the compressed output. A run that was killed leaves
``DST.tmp-*``; the next run for the same ``DST`` removes it (a marker file in
it names the process, so a run still alive on this host is left alone).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import math
import os
import posixpath
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dask.utils import parse_bytes

from dask_windows.cli.layout import DEFAULT_SPAN, LAYOUTS, write_spread
from dask_windows.cli.readers import FORMATS, file_schemas, list_inputs, read_inputs, schema_mismatch
from dask_windows.cli.safety import MARKER as _MARKER
from dask_windows.cli.safety import check_output, remove_leftovers
from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.sources.manifest import read_manifest, series_runs, write_manifest

# FORMATS, list_inputs and read_inputs live in readers.py; still importable from here
__all__ = ["FORMATS", "ConvertReport", "convert", "list_inputs", "plan_files", "read_inputs"]

logger = logging.getLogger(__name__)

Compute = Callable[..., tuple]


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


def _default_compute(label: str, *collections: Any) -> tuple:
    logger.info("%s", label)
    return dask.compute(*collections)


def plan_files(series_rows: np.ndarray, target_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack series, in order, into output files of at most ``target_rows`` rows.

    A series that fits is never split; one longer than ``target_rows`` gets
    ``ceil(rows / target_rows)`` files of its own, so it is cut as few times as
    possible.

    Args:
        series_rows: row count of each series, in output order.
        target_rows: the most rows a file should hold (>= 1).

    Returns:
        ``(first_file, num_pieces)``: per series its first file id and how
        many consecutive files it spans. File ids count from 0 without gaps.
    """
    first_file = np.zeros(len(series_rows), dtype=np.int64)
    num_pieces = np.ones(len(series_rows), dtype=np.int64)
    next_file, open_rows = 0, 0  # open_rows: rows in file next_file - 1 so far
    for i, rows in enumerate(series_rows.tolist()):
        if rows > target_rows:
            first_file[i] = next_file
            num_pieces[i] = math.ceil(rows / target_rows)
            next_file += int(num_pieces[i])
            open_rows = target_rows  # closed: nothing joins a split series' file
        elif open_rows == 0 or open_rows + rows > target_rows:
            first_file[i] = next_file
            next_file += 1
            open_rows = rows
        else:
            first_file[i] = next_file - 1
            open_rows += rows
    return first_file, num_pieces


def _parquet_bytes(df: pd.DataFrame, compression: str) -> int:
    table = pa.Table.from_pandas(df, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(
        table,
        buf,
        compression=compression,
        use_dictionary=[f.name for f in table.schema if not pa.types.is_floating(f.type)],
    )
    return buf.tell()


def _profile(df: pd.DataFrame, series: str, time: str, compression: str, partition_info=None) -> pd.DataFrame:
    """Rows and null times; for the first partition also Parquet bytes per row and per file.

    The sample is sorted like the output, which compresses better than raw
    input. Bytes per row are the marginal cost (the size of a sample minus
    that of its first half), so a file's footer and headers do not inflate them.
    """
    per_row = per_file = np.nan
    if partition_info is not None and partition_info["number"] == 0 and len(df):
        sample = df.iloc[:50_000]
        try:
            sample = sample.sort_values([series, time], kind="stable")
        except TypeError:  # unorderable values: reported with a remedy after this pass
            pass
        full = _parquet_bytes(sample, compression)
        half = len(sample) // 2
        per_row = full / len(sample)
        if half:
            marginal = (full - _parquet_bytes(sample.iloc[:half], compression)) / (len(sample) - half)
            if marginal > 0:
                per_row, per_file = marginal, max(0.0, full - marginal * len(sample))
    return pd.DataFrame(
        {
            "rows": [len(df)],
            "null_time": [int(df[time].isna().sum())],
            "bytes_per_row": [per_row],
            "bytes_per_file": [per_file],
        }
    )


def _times(values: pd.Series) -> np.ndarray:
    """A time column as a plain numpy array that sorts like the column."""
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        return values.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    if pd.api.types.is_extension_array_dtype(values.dtype):  # no nulls by now
        return values.to_numpy(dtype=getattr(values.dtype, "numpy_dtype", None))
    return values.to_numpy()


def _time_sketch(df: pd.DataFrame, series: str, time: str, keys: pd.Index, size: int) -> dict:
    """Per split series: sorted times thinned to ``size`` points, with weights."""
    positions = keys.get_indexer(df[series])
    sketch = {}
    for pos in np.unique(positions[positions >= 0]):
        times = np.sort(_times(df[time])[positions == pos])
        sketch[int(pos)] = _thin(times, np.ones(len(times)), size)
    return sketch


def _thin(times: np.ndarray, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep ``size`` points of a sorted weighted sample at equal weight steps."""
    if len(times) <= size:
        return times, weights
    cum = np.cumsum(weights)
    picks = np.searchsorted(cum, np.linspace(0, cum[-1], size, endpoint=False), side="right")
    return times[picks], np.full(size, cum[-1] / size)


def _merge_sketches(*sketches: dict, size: int) -> dict:
    merged: dict[int, list] = {}
    for sketch in sketches:
        for pos, pair in sketch.items():
            merged.setdefault(pos, []).append(pair)
    out = {}
    for pos, pairs in merged.items():
        times = np.concatenate([t for t, _ in pairs])
        weights = np.concatenate([w for _, w in pairs])
        order = np.argsort(times, kind="stable")
        out[pos] = _thin(times[order], weights[order], size)
    return out


def _split_cuts(
    ddf: dd.DataFrame, series: str, time: str, keys: pd.Index, num_pieces: np.ndarray, compute: Compute
) -> dict[int, np.ndarray]:
    """Times at which each split series starts a new file (pass 2)."""
    size = 4096
    parts = [dask.delayed(_time_sketch)(p, series, time, keys, size) for p in ddf.to_delayed()]
    while len(parts) > 1:  # a tree, so no task merges more than 8 sketches
        parts = [dask.delayed(_merge_sketches)(*parts[i : i + 8], size=size) for i in range(0, len(parts), 8)]
    (sketch,) = compute("sampling times of long series", parts[0])
    cuts = {}
    for pos, (times, weights) in sketch.items():
        cum = np.cumsum(weights)
        quantiles = np.arange(1, num_pieces[pos]) * cum[-1] / num_pieces[pos]
        cuts[pos] = times[np.minimum(np.searchsorted(cum, quantiles), len(times) - 1)]
    return cuts


def _file_ids(
    df: pd.DataFrame, series: str, time: str, keys: pd.Index, first_file: np.ndarray, cuts: dict[int, np.ndarray]
) -> np.ndarray:
    """The output file of every row of one input partition."""
    positions = keys.get_indexer(df[series])
    file_ids = first_file[positions]
    if cuts:
        times = _times(df[time])
        for pos, at in cuts.items():
            rows = positions == pos
            file_ids[rows] += np.searchsorted(at, times[rows], side="right")
    return file_ids


#: Scratch files are compressed: zstd at its default level keeps them near the output's size.
SCRATCH_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _disk_error(exc: OSError, path: str, what: str) -> OSError:
    """The same error with the path named, and a remedy when the disk (or a size limit) is full."""
    code = exc.errno
    if code not in _DISK_FULL and not any(s in str(exc) for s in ("No space left", "File too large")):
        return OSError(code, f"{exc} (writing {what} {path})")
    code = code or errno.ENOSPC
    return OSError(
        code,
        f"{os.strerror(code)} while writing {what} {path}: the disk holding the "
        f"output is full (or a file size limit was hit); free space there or "
        f"choose a DST on a larger disk (convert needs about the output's size "
        f"twice while it runs: compressed scratch plus the output)",
    )


def _scatter(
    df: pd.DataFrame, number: int, fs: Any, scratch: str, schema: pa.Schema, plan: tuple
) -> tuple[str, list[tuple[int, int, int]]]:
    """Write one input partition to a scratch Arrow file, one batch per output file.

    Returns:
        ``(path, [(file_id, batch_index, rows), ...])``.
    """
    file_ids = _file_ids(df, *plan)
    order = np.argsort(file_ids, kind="stable")  # input order kept within a file id
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False).take(order)
    file_ids = file_ids[order]
    bounds = np.flatnonzero(np.diff(file_ids)) + 1  # where the next file id starts
    path = posixpath.join(scratch, f"in-{number:06d}.arrow")
    index = []
    try:
        with fs.open(path, "wb") as out, pa.ipc.new_file(out, schema, options=SCRATCH_OPTIONS) as writer:
            for i, (a, b) in enumerate(zip([0, *bounds], [*bounds, len(file_ids)])):
                if b > a:
                    writer.write_batch(table.slice(a, b - a).combine_chunks().to_batches()[0])
                    index.append((int(file_ids[a]), i, int(b - a)))
    except OSError as exc:
        raise _disk_error(exc, path, "scratch file") from exc
    return path, index


def _gather(
    file_id: int,
    pieces: list[tuple[str, int]],
    fs: Any,
    root: str,
    name: str,
    schema: pa.Schema,
    series: str,
    time: str,
    compression: str,
) -> dict:
    """Read one output file's rows from scratch, sort them and write one row group."""
    batches = []
    for path, batch in pieces:  # in input order, so a stable sort keeps ties in order
        with fs.open(path, "rb") as src:
            batches.append(pa.ipc.open_file(src).get_batch(batch))
    table = pa.Table.from_batches(batches, schema=schema)
    table = table.take(pc.sort_indices(table, sort_keys=[(series, "ascending"), (time, "ascending")]))
    path = posixpath.join(root, name)
    # dictionaries pay off for ids and labels, not for measurements (they grow float files)
    dictionary = [f.name for f in schema if not pa.types.is_floating(f.type)]
    try:
        with fs.open(path, "wb") as out:
            pq.write_table(
                table,
                out,
                row_group_size=max(len(table), 1),
                compression=compression,
                use_dictionary=dictionary,
                write_page_checksum=True,
            )
    except OSError as exc:
        raise _disk_error(exc, path, "output file") from exc
    return {
        "path": name,
        "rows": len(table),
        "bytes": int(fs.size(path)),
        "runs": series_runs(table.column(series).to_numpy()),
    }


def _write_files(
    ddf: dd.DataFrame,
    fs: Any,
    tmp: str,
    plan: tuple,
    num_files: int,
    compression: str,
    compute: Compute,
    spread: dict | None = None,
) -> list[dict]:
    """Pass 3: bucket every row into its output file through scratch files on ``fs``.

    With ``spread`` (the options of :func:`dask_windows.cli.layout.write_spread`) the buckets
    are sorted and dealt out as chunks over the output files instead of written as they are.
    """
    series, time = plan[0], plan[1]
    schema = pa.Schema.from_pandas(ddf._meta, preserve_index=False)
    scratch = posixpath.join(tmp, "_scratch")
    fs.makedirs(scratch, exist_ok=True)
    scatters = [dask.delayed(_scatter)(part, i, fs, scratch, schema, plan) for i, part in enumerate(ddf.to_delayed())]
    pieces: list[list[tuple[str, int]]] = [[] for _ in range(num_files)]
    bucket_rows = np.zeros(num_files, np.int64)
    for path, index in compute("splitting rows by output file", *scatters):
        for file_id, batch, rows in index:
            pieces[file_id].append((path, batch))
            bucket_rows[file_id] += rows
    if spread is not None:
        entries, _ = write_spread(
            pieces,
            bucket_rows,
            fs,
            tmp,
            scratch,
            schema,
            series,
            time,
            compression=compression,
            compute=compute,
            **spread,
        )
        fs.rm(scratch, recursive=True)
        return entries
    width = max(5, len(str(num_files - 1)))
    gathers = [
        dask.delayed(_gather)(j, pieces[j], fs, tmp, f"part-{j:0{width}d}.parquet", schema, series, time, compression)
        for j in range(num_files)
        if pieces[j]
    ]
    entries = list(compute("sorting and writing files", *gathers))
    fs.rm(scratch, recursive=True)
    return entries


def _to_datetime(df: pd.DataFrame, time: str, utc: bool, dtype: Any) -> pd.DataFrame:
    return df.assign(**{time: pd.to_datetime(df[time], utc=utc).astype(dtype)})


def _parse_times(ddf: dd.DataFrame, time: str, utc: bool) -> dd.DataFrame:
    """The time column parsed with ``pandas.to_datetime`` in each partition.

    Not ``ddf.assign(t=dd.to_datetime(...))``: that gives other columns wrong
    metadata (an int64 series id became float64 in the output).
    """
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
            f"time column {time!r} in {where} has dtype {dtype}, which does not sort as "
            f"time; store it as numbers or datetimes, or pass --parse-time to parse it "
            f"with pandas.to_datetime"
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
    """Convert inputs into a sorted, series-aligned Parquet dataset with a manifest.

    Args:
        srcs: files, folders or globs (fsspec URLs allowed).
        dst: the output folder; it must not exist unless ``overwrite``.
        series: the series column.
        time: the time column (numeric, datetime or timedelta).
        fmt: one of ``FORMATS``; ``None`` infers it from file extensions.
        partition_size: target bytes per output file (``"256MB"`` or int).
        overwrite: replace ``dst`` if it is an earlier convert output.
        parse_time: parse the time column with ``pandas.to_datetime`` first.
        npy_columns: names for the columns of plain ``.npy`` arrays.
        compression: Parquet compression codec.
        input_block_size: bytes of input per read task (at most the target).
        storage_options: passed to fsspec for inputs and output.
        compute: ``compute(label, *collections) -> results``; the CLI passes
            one that shows progress on its cluster. Default ``dask.compute``.
        layout: ``"spread"`` (default): every series in chunks dealt over all files, so
            any few files mix like the whole dataset (``docs/converted.md``);
            ``"contiguous"``: files in (series, time) order, version-1 manifest (windows
            crossing a cut of a long series are lost).
        window: Longest window the dataset will be read with; chunks overlap by
            ``window + horizon - 1`` rows so no window is lost at a cut (default
            window + horizon: ``DEFAULT_SPAN``).
        horizon: Longest horizon it will be read with.
        chunk_rows: Owned rows per chunk (default: about 512 chunks per file, at least
            4 overlaps long).

    Returns:
        A :class:`ConvertReport`.

    Raises:
        FileExistsError: ``dst`` exists and ``overwrite`` is false, or ``dst``
            is not an earlier convert output, or it overlaps an input.
        SchemaError: a column is missing or the time column cannot be sorted.
        DataError: null series or time values, or rows lost on the way.
    """
    compute = compute or _default_compute
    target_bytes = parse_bytes(partition_size) if isinstance(partition_size, str) else int(partition_size)
    if target_bytes <= 0:
        raise ConfigError(f"partition_size={partition_size!r} must be positive, e.g. 256MB")
    spread = _spread_options(layout, window, horizon, chunk_rows)
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    out_fs, root = fsspec.core.url_to_fs(dst, **(storage_options or {}))
    root = root.rstrip("/")
    fmt, files = list_inputs(srcs, fmt, storage_options)
    check_output(out_fs, root, dst, srcs, files, overwrite, storage_options)
    schemas = file_schemas(files, fmt, storage_options)
    mismatch = schema_mismatch(files, schemas)
    if mismatch:
        raise SchemaError(mismatch)
    parsing: bool | str = parse_time  # "utc": ISO text with offsets, parsed to UTC
    if fmt == "csv" and not parse_time and schemas and time in schemas[0]:
        # pyarrow infers ISO-8601 text (what pandas.to_csv writes) as timestamp or date
        kind = schemas[0][time]
        if kind.startswith(("timestamp", "date")):
            parsing = "utc" if "tz=" in kind else True
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
        ddf.map_partitions(
            _profile,
            series,
            time,
            compression,
            meta={"rows": "i8", "null_time": "i8", "bytes_per_row": "f8", "bytes_per_file": "f8"},
        ),
    )
    rows_in = int(profile["rows"].sum())
    if counts.index.hasnans:
        raise DataError(
            f"series column {series!r} has {int(counts[counts.index.isna()].sum())} "
            f"null values in {where}; fill or drop them first"
        )
    if profile["null_time"].sum():
        raise DataError(
            f"time column {time!r} has {int(profile['null_time'].sum())} null "
            f"values in {where}; fill or drop them first"
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
    cuts = {}
    if (num_pieces > 1).any():
        cuts = _split_cuts(ddf, series, time, keys, num_pieces, compute)

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
    return ConvertReport(
        dst=dst,
        rows_in=rows_in,
        rows_out=rows_out,
        files=len(entries),
        series=len(keys),
        split_series=int((num_pieces > 1).sum()),
        bytes_out=sum(e["bytes"] for e in entries),
        manifest=manifest,
        layout=layout,
        span=None if spread is None else spread["span"],
        leftovers_removed=tuple(leftovers),
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


def _move_into_place(fs: Any, tmp: str, root: str) -> None:
    """Rename the finished temporary folder to ``root``, replacing an old one."""
    old = None
    if fs.exists(root):
        old = f"{root}.old-{uuid.uuid4().hex[:12]}"
        fs.mv(root, old, recursive=True)
    fs.mv(tmp, root, recursive=True)
    if old is not None:
        fs.rm(old, recursive=True)
