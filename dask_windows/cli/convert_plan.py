"""Passes 1 and 2 of ``convert``: profiling the inputs and planning the output files (series packed
in order into files near the target size; one too long cut at times from a merged sketch of its times)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

Compute = Callable[..., tuple]
#: The columns of ``_profile``'s one-row frame.
PROFILE_META = {"rows": "i8", "null_time": "i8", "bytes_per_row": "f8", "bytes_per_file": "f8", "decoded_per_row": "f8"}


def plan_files(series_rows: np.ndarray, target_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first_file, num_pieces)`` per series: series packed in order into files of at most ``target_rows``
    rows, a longer one into ``ceil(rows / target_rows)`` files of its own (ids from 0, no gaps)."""
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
    """Rows and null times; for the first partition also Parquet bytes per row (the marginal cost, so
    footers do not inflate it) and per file, and decoded bytes per row, from a sorted sample."""
    per_row = per_file = decoded = np.nan
    if partition_info is not None and partition_info["number"] == 0 and len(df):
        sample = df.iloc[:50_000]
        decoded = float(sample.memory_usage(index=False, deep=True).sum()) / len(sample)
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
    figures = (len(df), int(df[time].isna().sum()), per_row, per_file, decoded)
    return pd.DataFrame({name: [value] for name, value in zip(PROFILE_META, figures)})


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
