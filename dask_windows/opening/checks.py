"""Checks of the data itself at open, from what opening already read (no I/O): each raises naming the
file, column and remedy, or warns with a ``DataWarning``. ``compare_manifest``: a ``convert``
manifest is trusted only when it names exactly the files listed, with their sizes (a file missing on
an object store is an unfinished commit and raises). ``check_series_order``: a series split into
several runs inside a partition loses the windows across the cuts. ``output_dtype``: the dtype of
``y``, decided once from the schema."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import DataError, SchemaError

__all__ = [
    "SERIES_FROM_MANIFEST",
    "DataWarning",
    "ManifestWarning",
    "SeriesOrderWarning",
    "check_series_order",
    "compare_manifest",
    "output_dtype",
]

log = logging.getLogger(__name__)


class _FromManifest:
    """The default of ``WindowDataset(series=...)``: the manifest's series column if there is one."""

    def __repr__(self) -> str:
        return "<series column from the manifest, else one series>"

    def __reduce__(self) -> str:
        return "SERIES_FROM_MANIFEST"


SERIES_FROM_MANIFEST = _FromManifest()


class DataWarning(UserWarning):
    """The data is usable but not as it should be (see ``docs/checks.md``)."""


class ManifestWarning(DataWarning):
    """A ``dask-windows convert`` manifest does not match the files; the series column is scanned."""


class SeriesOrderWarning(DataWarning):
    """Rows of a series are not contiguous inside a partition: windows across the breaks are lost."""


def _warn(message: str, category: type) -> None:
    if log.hasHandlers():  # logging configured: the record too (without, Python's last-resort handler would
        log.warning(message)  # print the message a second time beside the warning)
    warnings.warn(message, category, stacklevel=4)


def compare_manifest(root: str, entries: dict, listed: dict[str, int | None], remote: bool = True) -> list[str]:
    """What differs between a manifest's ``entries`` and the ``listed`` sizes (empty: they agree); raises
    ``DataError`` when, on an object store (``remote``), a file the manifest lists is not there."""
    missing = sorted(p for p in entries if p not in listed)
    if missing and remote:
        raise DataError(
            f"the manifest of {root} lists {len(entries)} files but {len(missing)} of them are not there "
            f"(first: {missing[0]}); the dataset is incomplete: a `dask-windows convert` or copy into the store "
            "that did not finish, or deleted parts; rerun `dask-windows convert` (or finish the copy), or delete "
            f"{root}/_dask_windows_manifest.json to open only the files that are there"
        )
    changes = [f"{p} is listed in the manifest but missing" for p in missing]
    changes += [f"{p} is not in the manifest" for p in sorted(set(listed) - set(entries))]
    for path, size in sorted(listed.items()):
        entry = entries.get(path)
        if entry is not None and size is not None and entry["bytes"] != size:
            changes.append(f"{path} has {size:,} bytes, the manifest says {entry['bytes']:,}")
    return changes


def warn_manifest(root: str, changes: Sequence[str]) -> None:
    """Warn that the manifest of ``root`` is stale and the series column is scanned instead."""
    shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
    _warn(
        f"the manifest of {root} does not match its files ({shown}); scanning the series column instead "
        "(slower to open, but correct); rerun `dask-windows convert` to write a new manifest",
        ManifestWarning,
    )


def check_series_order(runs: Sequence[Any], names: Sequence[str], series: Any, strict: bool) -> str:
    """Warn (or raise ``DataError`` with ``strict``) when a series reappears after another inside a
    partition (``runs``: per partition an object with ``keys``, or ``None``); return the remedy sentence
    for the no-windows error (``""`` when the order is fine)."""
    if series is None:
        return ""
    found = _regrouped_columnar(runs, names)
    if found is None:  # keys of no integer type, or some partition without runs: one partition at a time
        found = _regrouped(runs, names)
    worst, total_runs, distinct = found
    if worst is None:
        return ""
    name, count, unique = worst
    remedy = (
        f"sort the rows by {series!r} and time (e.g. df.sort_values([{series!r}, time])), "
        "or run `dask-windows convert`, which does"
    )
    message = (
        f"series column {series!r} is not grouped: in {name} {unique:,} series form {count:,} runs "
        f"({total_runs:,} runs of {distinct:,} series in all partitions), so a series reappears after another "
        f"and windows that would cross the breaks are lost; {remedy}"
    )
    if strict:
        raise DataError(message)
    _warn(message + " (pass strict=True to raise)", SeriesOrderWarning)
    return f"; the series are not grouped ({unique:,} series form {count:,} runs in {name}): {remedy}"


def _regrouped(runs: Sequence[Any], names: Sequence[str]) -> tuple[tuple | None, int, int]:
    """``(first partition whose series reappear as (name, runs, series), runs, distinct series of all)``."""
    worst = None
    total_runs = 0
    distinct: set = set()  # series values over all partitions (a series spanning files counts once)
    for i, r in enumerate(runs):
        keys = getattr(getattr(r, "series_runs", r), "keys", None)
        if keys is None:
            continue
        distinct.update(np.asarray(keys).tolist())
        total_runs += len(keys)
        unique = _distinct(keys) if len(keys) >= 2 and worst is None else len(keys)
        if unique < len(keys):
            worst = (names[i], len(keys), unique)
    return worst, total_runs, len(distinct)


def _regrouped_columnar(runs: Sequence[Any], names: Sequence[str]) -> tuple[tuple | None, int, int] | None:
    """``_regrouped`` over every partition's keys at once (one sort), for integer keys; ``None`` otherwise."""
    from dask_windows.planning.index import FileRuns
    from dask_windows.planning.ragged import Ragged

    if isinstance(runs, FileRuns):
        keys = runs.keys
    else:
        per = [getattr(getattr(r, "series_runs", r), "keys", None) for r in runs]
        if any(k is None for k in per):
            return None
        arrays = [np.asarray(k) for k in per]
        if len({k.dtype for k in arrays}) > 1:  # (a common type could round large integers)
            return None
        keys = Ragged.of(arrays)
    values = np.asarray(keys.values)
    if values.dtype.kind not in "iub":
        return None
    sizes, item = keys.sizes(), keys.item_of()
    # (N,) the keys sorted within each partition: a key equal to its neighbour in one partition repeats
    order = np.lexsort((values, item))
    key, of = values[order], item[order]
    repeated = (of[1:] == of[:-1]) & (key[1:] == key[:-1])
    unique = sizes - np.bincount(of[1:][repeated], minlength=len(sizes))  # (P,) distinct keys of each
    bad = np.flatnonzero((sizes >= 2) & (unique < sizes))
    worst = None if not len(bad) else (names[int(bad[0])], int(sizes[bad[0]]), int(unique[bad[0]]))
    return worst, len(values), len(np.unique(values))


def _distinct(keys: Any) -> int:
    """Distinct keys of a partition's runs, nulls (``None``, ``NaN``) counted once (``np.unique`` cannot
    order ``None`` among strings)."""
    try:
        return len(np.unique(np.asarray(keys)))
    except TypeError:
        return len({None if k is None or k != k else k for k in np.asarray(keys, dtype=object).tolist()})


def output_dtype(source: Any, columns: Sequence) -> Any:
    """``np.int64`` when every column of ``columns`` is integer or bool in the schema, else ``np.float32``;
    ``None`` when the schema says nothing. Decided once (a null in one file makes that file's column
    float, which would flip ``y``'s dtype between batches)."""
    if not columns:
        return None
    kinds = []
    schemas = getattr(source, "_schemas", None)
    if not schemas and getattr(source, "schema", None) is not None:  # tables in memory (sources.arrow)
        schemas = [source.schema]
    if schemas:
        import pyarrow as pa

        for col in columns:
            types = [s.field(col).type for s in schemas if col in s.names]
            if not types:
                return None
            kinds.append(all(pa.types.is_integer(t) or pa.types.is_boolean(t) for t in types))
        return np.int64 if all(kinds) else np.float32
    frame = getattr(source, "ddf", None)
    dtypes = getattr(frame, "dtypes", None)
    if dtypes is not None:
        try:
            kinds = [np.dtype(dtypes[c]).kind in "iub" for c in columns]
        except (KeyError, TypeError):
            return None
        return np.int64 if all(kinds) else np.float32
    return None


#: Largest finite float32: a float64 value beyond it becomes ``inf`` in a batch.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def bad_value_rows(columns: dict[Any, np.ndarray]) -> np.ndarray:
    """Sorted rows where any of ``columns`` is NaN, ``±inf`` or beyond float32's range (what ``nan=``
    treats as missing: it would reach a float32 batch as NaN or ``inf``)."""
    bad = None
    for values in columns.values():
        if values.dtype.kind not in "fc":
            continue
        with np.errstate(invalid="ignore"):
            hit = ~np.isfinite(values)
            if values.dtype.itemsize > 4 and values.dtype.kind == "f":
                hit |= np.abs(values) > FLOAT32_MAX
        bad = hit if bad is None else bad | hit
    return np.zeros(0, np.int64) if bad is None else np.flatnonzero(bad).astype(np.int64)


def value_problem(value: float) -> str:
    """``"NaN"`` or ``"infinite value (inf, or beyond float32)"``, for messages."""
    return "NaN" if value != value else f"infinite value ({value}, or beyond float32's range)"


def check_column_types(source: Any, columns: Sequence, roles: dict) -> None:
    """Raise ``SchemaError`` for a feature/target column of a Parquet, Arrow-world or Dask source that is
    not integer, float, decimal or bool."""
    schemas = getattr(source, "_schemas", None)
    files = getattr(source, "files", None)
    if schemas and files:
        url = getattr(source, "_url", lambda p: p)
        numbers = getattr(source, "_schema_numbers", None)  # each file's distinct schema (a list or an array)
        numbers = range(len(files)) if numbers is None else [int(n) for n in numbers]
        first: dict[int, str] = {}
        for path, number in zip(files, numbers):
            first.setdefault(number, path)  # the file named for a schema: the first that has it
        for number, path in first.items():
            _check_schema_types(schemas[number], url(path), columns, roles)
        return
    schema = getattr(source, "schema", None)
    if schema is not None and hasattr(schema, "field") and hasattr(schema, "names"):  # a pyarrow Schema
        _check_schema_types(schema, getattr(source, "description", "the table"), columns, roles)
        return
    dtypes = getattr(getattr(source, "ddf", None), "dtypes", None)  # a Dask frame's
    if dtypes is not None:
        import pandas as pd

        where = getattr(source, "description", "the Dask frame")
        for col in columns:
            if col not in dtypes.index:
                continue
            dtype = dtypes[col]
            if pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype):
                continue
            timelike = pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype)
            raise _not_a_number(f"{roles.get(col, 'column')} {col!r} of {where}", dtype, "float", timelike)


def _check_schema_types(schema: Any, where: str, columns: Sequence, roles: dict) -> None:
    """Raise ``SchemaError`` for the first of ``columns`` in ``schema`` that is not a number (see check_column_types)."""
    import pyarrow as pa

    for col in columns:
        if col not in schema.names:
            continue
        kind = schema.field(col).type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
        if numeric or pa.types.is_boolean(kind):
            continue
        what = f"{roles.get(col, 'column')} {col!r} of {where}"
        raise _not_a_number(what, kind, "float, decimal", pa.types.is_temporal(kind))


def _not_a_number(what: str, kind: Any, numbers: str, timelike: bool) -> Exception:
    how = (
        "convert it to numbers first (e.g. seconds since the epoch, or the seconds between rows)"
        if timelike
        else "encode it as numbers (e.g. category codes)"
    )
    return SchemaError(
        f"{what} is {kind}, not a number; features and targets must be integer, {numbers} or bool columns; "
        f"{how} or leave it out of features/targets (a series id may be any type: pass it as series=)"
    )


def runs_disagree_with_footer(meta: Any, series: str, runs: Sequence[Sequence[Any]]) -> str | None:
    """Why a manifest's runs of one file cannot be its series column (each row group's footer min/max must
    be those of the runs over its rows), or ``None``."""
    names = meta.schema.names
    if series not in names or not runs:
        return None
    column = names.index(series)
    starts = np.array([r[0] for r in runs], dtype=np.int64)
    ends = starts + np.array([r[1] for r in runs], dtype=np.int64)
    keys = [r[2] for r in runs]
    first = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        last = first + group.num_rows
        stats = group.column(column).statistics
        overlap = [keys[k] for k in np.flatnonzero((ends > first) & (starts < last))]
        first = last
        if stats is None or not stats.has_min_max or not overlap:
            continue
        low, high = stats.min, stats.max
        if any(type(k) is not type(low) for k in overlap) or type(high) is not type(low):
            continue  # datetimes are ISO text in the manifest: nothing exact to compare
        if (min(overlap), max(overlap)) != (low, high):
            return (
                f"row group {g} holds series {low!r}..{high!r} by its footer, the manifest's runs "
                f"say {min(overlap)!r}..{max(overlap)!r}"
            )
    return None
