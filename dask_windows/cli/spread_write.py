"""Passes 4 and 5 of ``convert`` for the spread layout: sorting buckets, writing files.

Where each row goes is planned in :mod:`dask_windows.cli.layout`; this module
sorts each scratch bucket and writes every output file from its chunks' pieces.
"""

from __future__ import annotations

import errno
import os
import posixpath
from typing import Any

import numpy as np

from dask_windows.cli.layout import SpreadPlan, file_runs, output_files, plan_spread, segments_of

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


def write_part(fs: Any, path: str, table: Any, schema: Any, compression: Any) -> None:
    """Write one output file (both layouts): one row group, page CRCs, a disk-full error naming ``path``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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


def _sort_bucket(
    bucket: int,
    pieces: list,
    fs: Any,
    scratch: str,
    schema: Any,
    series: str,
    time: str,
    segments: np.ndarray,
    compression: str | None = None,
) -> tuple[str, list[int]]:
    """Pass 4 of the spread layout: sort one bucket, write its rows grouped by output file.

    Returns:
        ``(path, files)``: the scratch file and, per record batch, the output file it is for.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    batches = []
    for path, batch in pieces:  # in input order, so a stable sort keeps ties in order
        with fs.open(path, "rb") as src:
            batches.append(pa.ipc.open_file(src).get_batch(batch))
    table = pa.Table.from_batches(batches, schema=schema)
    table = table.take(pc.sort_indices(table, sort_keys=[(series, "ascending"), (time, "ascending")]))
    out_path = posixpath.join(scratch, f"bucket-{bucket:06d}.arrow")
    files: list[int] = []
    # segments: (N, 5) file, slot, canonical start, bucket row, rows; sorted by file then slot
    bounds = np.flatnonzero(np.diff(segments[:, 0])) + 1 if len(segments) else np.zeros(0, np.int64)
    # compressed like the input scratch (``scratch.SCRATCH_OPTIONS``; uncompressed took 1.2-1.6x the disk)
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with fs.open(out_path, "wb") as out, pa.ipc.new_file(out, schema, options=options) as writer:
        for group in np.split(segments, bounds) if len(segments) else []:
            rows = np.concatenate([np.arange(r, r + n) for r, n in zip(group[:, 3], group[:, 4])])
            part = table.take(pa.array(rows)).combine_chunks()
            writer.write_batch(part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], schema))
            files.append(int(group[0, 0]))
    return out_path, files


def _write_file(
    name: str,
    sources: list[tuple[str, int, np.ndarray]],
    fs: Any,
    root: str,
    schema: Any,
    compression: str,
    rows: int,
    runs: list,
) -> dict:
    """Pass 5: one output file from its chunks' pieces, in slot order, as one row group."""
    import pyarrow as pa

    tables, keys = [], []
    for path, batch, segments in sources:  # segments (n, 3): slot, canonical start, rows
        with fs.open(path, "rb") as src:
            tables.append(pa.Table.from_batches([pa.ipc.open_file(src).get_batch(batch)], schema=schema))
        keys.append(segments)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if keys:
        seg = np.concatenate(keys)  # (n, 3) slot, canonical start, rows; rows of the table in this order
        first = np.cumsum(seg[:, 2]) - seg[:, 2]  # (n,) table row of each segment
        order = np.lexsort((seg[:, 1], seg[:, 0]))  # segments in slot, then canonical order
        take = np.concatenate([np.arange(first[k], first[k] + seg[k, 2]) for k in order])
        table = table.take(pa.array(take))
    if table.num_rows != rows:
        from dask_windows.errors import DataError

        raise DataError(
            f"{name}: gathered {table.num_rows} rows but the layout planned {rows}; "
            "the input changed while converting, or this is a bug (please report it)"
        )
    path = posixpath.join(root, name)
    write_part(fs, path, table, schema, compression)
    return {"path": name, "rows": table.num_rows, "bytes": int(fs.size(path)), "runs": runs}


def write_spread(
    pieces: list[list[tuple[str, int]]],
    bucket_rows: np.ndarray,
    fs: Any,
    tmp: str,
    scratch: str,
    schema: Any,
    series: str,
    time: str,
    series_rows: np.ndarray,
    keys: list,
    target_rows: int,
    span: int,
    chunk_rows: int | None,
    compression: str,
    compute: Any,
    scratch_compression: str | None = None,
) -> tuple[list[dict], SpreadPlan]:
    """Passes 4 and 5 of ``convert`` for the spread layout.

    Args:
        pieces: Per bucket (an output file of the contiguous plan, in canonical order) the scratch
            ``(path, batch)`` pairs holding its rows.
        bucket_rows: ``(J,)`` rows of each bucket.
        series_rows: ``(S,)`` rows of each series in canonical order; ``keys`` their values.
        target_rows: Most rows an output file should hold.
        span: ``window + horizon`` the overlap is sized for.
        chunk_rows: Owned rows per chunk, or ``None`` for ``auto_chunk_rows``.

    Returns:
        ``(entries, plan)``: the manifest entries (version-2 runs) and the layout plan.
    """
    import dask

    total = int(np.sum(bucket_rows))
    num_files, chunk = output_files(total, target_rows, span, chunk_rows)
    plan = plan_spread(series_rows, num_files, span, chunk)
    offsets = np.cumsum(bucket_rows) - bucket_rows  # (J,) canonical row of each bucket's first row
    segments = [segments_of(plan, int(a), int(a + n)) for a, n in zip(offsets, bucket_rows)]
    sorts = [
        dask.delayed(_sort_bucket)(j, pieces[j], fs, scratch, schema, series, time, segments[j], scratch_compression)
        for j in range(len(pieces))
        if pieces[j]
    ]
    written = dict(
        zip([j for j in range(len(pieces)) if pieces[j]], compute("sorting series and cutting chunks", *sorts))
    )
    # every bucket is sorted: the input scratch is no longer read; removed before the output is written,
    # so the peak holds two copies of the data (sorted buckets and output), not three
    used = sorted({path for bucket in pieces for path, _ in bucket})
    if used:
        fs.rm(used)
    sources: list[list] = [[] for _ in range(num_files)]
    for j, (path, files) in written.items():
        seg = segments[j]
        for batch, f in enumerate(files):
            mine = seg[seg[:, 0] == f]
            sources[f].append((path, batch, mine[:, [1, 2, 4]]))
    width = max(5, len(str(num_files - 1)))
    writes = []
    for f in range(num_files):
        rows, runs = file_runs(plan, series_rows, keys, f)
        if rows:
            writes.append(
                dask.delayed(_write_file)(
                    f"part-{f:0{width}d}.parquet", sources[f], fs, tmp, schema, compression, rows, runs
                )
            )
    return list(compute("writing spread files", *writes)), plan
