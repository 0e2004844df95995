"""Pass 3 of ``convert``: every row bucketed into its output file through scratch files.

Each input partition is scattered into one compressed Arrow scratch file (one
batch per output file); each output file is then gathered from scratch, sorted
and written (the contiguous layout), or handed to the spread layout's passes.
"""

from __future__ import annotations

import posixpath
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dask_windows.cli.convert_plan import Compute, _file_ids
from dask_windows.cli.spread_write import _disk_error, write_part, write_spread
from dask_windows.sources.manifest import series_runs

#: Scratch files are compressed: zstd at its default level keeps them near the output's size.
SCRATCH_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def _scatter(
    df: pd.DataFrame, number: int, fs: Any, scratch: str, schema: pa.Schema, plan: tuple
) -> tuple[str, list[tuple[int, int, int]]]:
    """Write one input partition to a scratch Arrow file, one batch per output file.

    Returns:
        ``(path, [(file_id, batch_index, rows), ...])``.
    """
    file_ids = _file_ids(df, *plan)
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    # Sorted by (file id, series, time), each batch compresses as the sorted data does (a shuffled
    # input's batches were larger than the input itself); the sort is stable, so rows with equal keys
    # keep their input order, as the sort of the whole bucket later does.
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
    write_part(fs, path, table, schema, compression)
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

    With ``spread`` (the options of :func:`dask_windows.cli.spread_write.write_spread`) the buckets
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
            scratch_compression=SCRATCH_OPTIONS.compression,  # a name: the options do not pickle
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
