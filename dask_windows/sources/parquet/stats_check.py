"""Decoded values checked against the min/max statistics of their footer: a cheap corruption check.

Without page CRCs a flipped byte in a data page decodes as another valid number; a decoded value
outside its row group's footer min/max is proof of damage (a flip inside the range still passes:
docs/checks.md gives the measured share). Only signed integer and floating columns are compared
(whose statistics every writer orders alike), by numpy's min and max of the values viewed where
Arrow decoded them (Arrow's ``min_max`` cost 38-47% of a read, numpy's 3-17%)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["outside_statistics"]

_CHECKED = ("INT32", "INT64", "FLOAT", "DOUBLE")


def _bounds(column_meta: Any) -> tuple[Any, Any] | None:
    stats = column_meta.statistics
    if stats is None or not stats.has_min_max or column_meta.physical_type not in _CHECKED:
        return None
    logical = str(getattr(stats, "logical_type", "None"))
    if logical not in ("None", "Int(bitWidth=32, isSigned=true)", "Int(bitWidth=64, isSigned=true)"):
        return None  # unsigned, decimal, time types: left to page CRCs
    return stats.min, stats.max


def outside_statistics(meta: Any, row_groups: Sequence[int], table: Any) -> str | None:
    """Where a decoded value of ``table`` (the row groups ``row_groups`` of the file of ``meta``) lies outside
    its row group's footer min/max (``"column 'x' of row group 3 holds 1.2e+38, outside the footer's
    [0, 99]: ..."``), or ``None``."""
    # column names from a row group's chunks, not ``meta.schema``: the schema and its metadata refer to each
    # other, a cycle that kept every read's parsed footer alive until a full garbage collection
    first = meta.row_group(0) if meta.num_row_groups else None
    paths = {} if first is None else {first.column(i).path_in_schema: i for i in range(meta.num_columns)}
    for name in table.column_names:
        index = paths.get(name)
        if index is None:
            continue
        column = table.column(name)
        at = 0
        for group in row_groups:
            rows = meta.row_group(group).num_rows
            bounds = _bounds(meta.row_group(group).column(index))
            if bounds is not None and rows:
                low, high = _min_max(column.slice(at, rows))
                if low is not None and (low < bounds[0] or high > bounds[1]):
                    bad = low if low < bounds[0] else high
                    return (
                        f"column {name!r} of row group {group} holds {bad!r}, outside the footer's "
                        f"[{bounds[0]!r}, {bounds[1]!r}]: a data page is damaged"
                    )
            at += rows
    return None


def _min_max(column: Any) -> tuple[Any, Any]:
    """``(min, max)`` of a (chunked) Arrow column, nulls and NaN left out as Arrow's ``min_max`` does: a
    signed integer or float column without nulls viewed and reduced by numpy, anything else (or a NaN)
    by Arrow."""
    import pyarrow as pa

    kind = column.type
    if column.null_count or not (pa.types.is_signed_integer(kind) or pa.types.is_floating(kind)):
        return _arrow_min_max(column)
    dtype = np.dtype(f"{'f' if pa.types.is_floating(kind) else 'i'}{kind.bit_width // 8}")
    low = high = None
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if not len(chunk):
            continue
        values = np.frombuffer(chunk.buffers()[1], dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
        a, b = values.min().item(), values.max().item()
        if a != a or b != b:  # a NaN: Arrow's minimum and maximum leave it out
            return _arrow_min_max(column)
        low = a if low is None else min(low, a)
        high = b if high is None else max(high, b)
    return low, high


def _arrow_min_max(column: Any) -> tuple[Any, Any]:
    import pyarrow.compute as pc

    found = pc.min_max(column).as_py()
    return found["min"], found["max"]
