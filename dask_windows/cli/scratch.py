"""Passes 3 to 5 of ``convert``: each input partition scattered into compressed Arrow scratch (a batch
per output file), each bucket sorted and written as a file, or cut into the chunks of
:mod:`dask_windows.cli.layout` that each file is then written from (spread layout)."""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dask_windows.cli.convert_plan import Compute, _file_ids
from dask_windows.cli.layout import file_runs, output_files, plan_spread, segments_of
from dask_windows.errors import DataError
from dask_windows.sources.manifest import series_runs

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
        f"{os.strerror(code)} while writing {what} {path}: the disk holding the output is full (or a file size limit "
        f"was hit); free space there or choose a DST on a larger disk (convert needs about the output's size twice "
        f"while it runs: compressed scratch plus the output)",
    )


@dataclass(frozen=True)
class _Output:
    """Where and how the tasks of passes 3 to 5 write (it travels to the Dask workers)."""

    fs: Any
    tmp: str
    schema: pa.Schema
    series: str
    time: str
    compression: str  # the output's Parquet codec
    scratch_compression: str | None  # a name: ``IpcWriteOptions`` do not pickle

    @property
    def scratch(self) -> str:
        return posixpath.join(self.tmp, "_scratch")

    def write(self, path: str, table: pa.Table, runs: list) -> dict:
        """Write one output file (both layouts) as one row group with page CRCs; its manifest entry."""
        # dictionaries pay off for ids and labels, not for measurements (they grow float files)
        dictionary = [f.name for f in self.schema if not pa.types.is_floating(f.type)]
        try:
            with self.fs.open(path, "wb") as out:
                pq.write_table(
                    table,
                    out,
                    row_group_size=max(len(table), 1),
                    compression=self.compression,
                    use_dictionary=dictionary,
                    write_page_checksum=True,
                )
        except OSError as exc:
            raise _disk_error(exc, path, "output file") from exc
        return {
            "path": posixpath.basename(path),
            "rows": table.num_rows,
            "bytes": int(self.fs.size(path)),
            "runs": runs,
        }

    def sorted_bucket(self, pieces: list[tuple[str, int]]) -> pa.Table:
        """A bucket's scratch batches, read in input order and stably sorted (ties keep that order)."""
        batches = []
        for path, batch in pieces:
            with self.fs.open(path, "rb") as src:
                batches.append(pa.ipc.open_file(src).get_batch(batch))
        table = pa.Table.from_batches(batches, schema=self.schema)
        return table.take(pc.sort_indices(table, sort_keys=[(self.series, "ascending"), (self.time, "ascending")]))


def _part_name(f: int, num_files: int) -> str:
    return f"part-{f:0{max(5, len(str(num_files - 1)))}d}.parquet"


def _scatter(
    df: pd.DataFrame, number: int, fs: Any, scratch: str, schema: pa.Schema, plan: tuple
) -> tuple[str, list[tuple[int, int, int]]]:
    """Write one input partition to a scratch Arrow file, one sorted batch per output file:
    ``(path, [(file_id, batch, rows)])``."""
    file_ids = _file_ids(df, *plan)
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    keyed = table.select([plan[0], plan[1]]).append_column("_file_id", pa.array(file_ids))
    order = pc.sort_indices(
        keyed, sort_keys=[("_file_id", "ascending"), (plan[0], "ascending"), (plan[1], "ascending")]
    ).to_numpy()
    table = table.take(order)
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


def _gather(out: _Output, pieces: list, path: str) -> dict:
    """Contiguous layout: one output file from its bucket, sorted, with its series runs."""
    table = out.sorted_bucket(pieces)
    return out.write(path, table, series_runs(table.column(out.series).to_numpy()))


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
    """Pass 3: bucket every row into its output file through scratch files on ``fs``, then write the
    files (with ``spread``: :func:`write_spread`'s options)."""
    schema = pa.Schema.from_pandas(ddf._meta, preserve_index=False)
    out = _Output(fs, tmp, schema, plan[0], plan[1], compression, SCRATCH_OPTIONS.compression)
    fs.makedirs(out.scratch, exist_ok=True)
    scatters = [dask.delayed(_scatter)(p, i, fs, out.scratch, schema, plan) for i, p in enumerate(ddf.to_delayed())]
    pieces: list[list[tuple[str, int]]] = [[] for _ in range(num_files)]
    bucket_rows = np.zeros(num_files, np.int64)
    for path, index in compute("splitting rows by output file", *scatters):
        for file_id, batch, rows in index:
            pieces[file_id].append((path, batch))
            bucket_rows[file_id] += rows
    if spread is not None:
        entries = write_spread(out, pieces, bucket_rows, compute, **spread)
    else:
        paths = [posixpath.join(tmp, _part_name(j, num_files)) for j in range(num_files)]
        gathers = [dask.delayed(_gather)(out, pieces[j], paths[j]) for j in range(num_files) if pieces[j]]
        entries = list(compute("sorting and writing files", *gathers))
    fs.rm(out.scratch, recursive=True)
    return entries


def _sort_bucket(out: _Output, bucket: int, pieces: list, segments: np.ndarray) -> tuple[str, list[int]]:
    """Spread layout: one bucket sorted and written back to scratch grouped by output file; the scratch
    file and, per record batch, its output file."""
    table = out.sorted_bucket(pieces)
    path = posixpath.join(out.scratch, f"bucket-{bucket:06d}.arrow")
    files: list[int] = []
    # segments: (N, 5) file, slot, canonical start, bucket row, rows; sorted by file then slot
    bounds = np.flatnonzero(np.diff(segments[:, 0])) + 1 if len(segments) else np.zeros(0, np.int64)
    options = pa.ipc.IpcWriteOptions(compression=out.scratch_compression)
    with out.fs.open(path, "wb") as dst, pa.ipc.new_file(dst, out.schema, options=options) as writer:
        for group in np.split(segments, bounds) if len(segments) else []:
            rows = np.concatenate([np.arange(r, r + n) for r, n in zip(group[:, 3], group[:, 4])])
            part = table.take(pa.array(rows)).combine_chunks()
            writer.write_batch(part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], out.schema))
            files.append(int(group[0, 0]))
    return path, files


def _write_file(out: _Output, path: str, sources: list, rows: int, runs: list) -> dict:
    """Spread layout: one output file from its chunks' pieces (``sources``: scratch path, batch
    and ``(n, 3)`` slot, canonical start, rows of its segments), in slot order."""
    tables, keys = [], []
    for scratch_path, batch, segments in sources:
        with out.fs.open(scratch_path, "rb") as src:
            tables.append(pa.Table.from_batches([pa.ipc.open_file(src).get_batch(batch)], schema=out.schema))
        keys.append(segments)
    table = pa.concat_tables(tables) if tables else out.schema.empty_table()
    if keys:
        seg = np.concatenate(keys)  # (n, 3) slot, canonical start, rows; rows of the table in this order
        first = np.cumsum(seg[:, 2]) - seg[:, 2]  # (n,) table row of each segment
        order = np.lexsort((seg[:, 1], seg[:, 0]))  # segments in slot, then canonical order
        table = table.take(pa.array(np.concatenate([np.arange(first[k], first[k] + seg[k, 2]) for k in order])))
    if table.num_rows != rows:
        raise DataError(
            f"{posixpath.basename(path)}: gathered {table.num_rows} rows but the layout planned {rows}; "
            "the input changed while converting, or this is a bug (please report it)"
        )
    return out.write(path, table, runs)


def write_spread(
    out: _Output,
    pieces: list[list[tuple[str, int]]],
    bucket_rows: np.ndarray,
    compute: Compute,
    series_rows: np.ndarray,
    keys: list,
    target_rows: int,
    span: int,
    chunk_rows: int | None,
) -> list[dict]:
    """Passes 4 and 5 of ``convert`` for the spread layout: the manifest entries. ``pieces``: per bucket
    (a file of the contiguous plan) its scratch ``(path, batch)`` pairs; ``series_rows``: ``(S,)``
    rows of each series in canonical order, ``keys`` their values."""
    num_files, chunk = output_files(int(np.sum(bucket_rows)), target_rows, span, chunk_rows)
    plan = plan_spread(series_rows, num_files, span, chunk)
    offsets = np.cumsum(bucket_rows) - bucket_rows  # (J,) canonical row of each bucket's first row
    segments = [segments_of(plan, int(a), int(a + n)) for a, n in zip(offsets, bucket_rows)]
    filled = [j for j in range(len(pieces)) if pieces[j]]
    sorts = [dask.delayed(_sort_bucket)(out, j, pieces[j], segments[j]) for j in filled]
    written = dict(zip(filled, compute("sorting series and cutting chunks", *sorts)))
    # the input scratch is read no more: removed before the output is written, so the disk holds
    # two copies of the data at most (sorted buckets and output), not three
    used = sorted({path for bucket in pieces for path, _ in bucket})
    if used:
        out.fs.rm(used)
    sources: list[list] = [[] for _ in range(num_files)]
    for j, (path, files) in written.items():
        seg = segments[j]
        for batch, f in enumerate(files):
            sources[f].append((path, batch, seg[seg[:, 0] == f][:, [1, 2, 4]]))
    writes = []
    for f in range(num_files):
        rows, runs = file_runs(plan, series_rows, keys, f)
        if rows:
            path = posixpath.join(out.tmp, _part_name(f, num_files))
            writes.append(dask.delayed(_write_file)(out, path, sources[f], rows, runs))
    return list(compute("writing spread files", *writes))
