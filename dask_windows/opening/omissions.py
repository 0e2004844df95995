"""What opening leaves out or may get wrong without an error: counted, and warned once.

Series (or a file's stretch of one) shorter than ``window + horizon`` hold no window: ``left_out``
counts them from the scanned runs, ``WindowDataset`` warns (``ShortSeriesWarning``) and keeps the
count as ``ds.left_out``. Without ``series=``, a column named like a series id whose values change in
runs inside the first partition (its one read) is named by ``series_column_hint`` and warned about
(``SeriesColumnWarning``); ``series=None`` turns it off."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.opening.checks import DataWarning, _warn
from dask_windows.planning.index import FileRuns
from dask_windows.planning.windows import find_runs
from dask_windows.sources.base import rows_per_partition

__all__ = [
    "LeftOut",
    "SeriesColumnWarning",
    "ShortSeriesWarning",
    "check_omissions",
    "left_out",
    "series_column_hint",
    "warn_left_out",
    "warn_series_column",
]

#: Column names taken for a series id: a whole word of the name (between ``_``, ``-``, spaces or
#: camel-case humps), compared case-insensitively.
SERIES_WORDS = frozenset(
    {"id", "ids", "sid", "uid", "series", "sensor", "station", "device", "ticker", "symbol", "entity", "meter", "unit"}
)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


class ShortSeriesWarning(DataWarning):
    """Series (or stretches of one) shorter than ``window + horizon`` hold no window and are left out."""


class SeriesColumnWarning(DataWarning):
    """A column looks like a series id but ``series=`` was not given: windows may cross series."""


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """Series runs shorter than the span: how many ``runs``, their ``rows``, and ``first`` as ``(partition
    name, series key, rows)`` for messages (``None`` when none)."""

    runs: int = 0
    rows: int = 0
    first: tuple[str, Any, int] | None = None


def left_out(runs: Sequence[Any], partitions: Sequence[Any], span: int) -> LeftOut:
    """Count the runs (``index.PartitionRuns``, one per partition) that begin their series and end before ``span`` rows."""
    begins: Any = True  # every run begins its series, and owns its rows, unless some say otherwise
    owns: Any = True
    if isinstance(runs, FileRuns):  # columnar (opened from the index): no origin, owned or whole; no loop
        sizes, starts, lengths, keys = runs.starts.sizes(), runs.starts.values, runs.lengths.values, runs.keys.values
        if not sizes.sum():
            return LeftOut()
    else:
        wholes = [found.series_runs for found in runs]
        sizes = np.fromiter(map(len, (w.lengths for w in wholes)), np.int64, len(wholes))  # (P,) runs of each
        if not sizes.sum():
            return LeftOut()
        # (R,) every run of every partition, partition after partition
        starts = np.concatenate([w.starts for w in wholes])
        lengths = np.concatenate([w.lengths for w in wholes])
        keys = None
        if any(w.origin is not None for w in wholes):
            begins = np.concatenate(
                [np.ones(len(w.lengths), bool) if w.origin is None else w.origin == 0 for w in wholes]
            )
        if any(w.owned is not None for w in wholes):
            owns = np.concatenate([np.ones(len(w.lengths), bool) if w.owned is None else w.owned > 0 for w in wholes])
    part = np.repeat(np.arange(len(sizes)), sizes)  # (R,) partition of each run
    own_rows = rows_per_partition(partitions)[: len(sizes)]
    short = begins & (lengths < span) & (starts < own_rows[part]) & owns  # not a halo run of the next
    hit = np.flatnonzero(short)
    if not len(hit):
        return LeftOut()
    h = int(hit[0])
    p = int(part[h])
    key = keys[h] if keys is not None else wholes[p].keys[h - int(np.cumsum(sizes)[p] - sizes[p])]
    first = (partitions[p].name, key.item() if isinstance(key, np.generic) else key, int(lengths[h]))
    return LeftOut(len(hit), int(lengths[hit].sum()), first)  # a short run's halo rows are its own


def warn_left_out(
    found: LeftOut, span: int, description: str, asked: str | None = None, converted_span: int | None = None
) -> None:
    """Warn once that ``found`` runs are left out; ``asked``: the span as the user asked for it;
    ``converted_span``: the span ``dask-windows convert`` wrote the data for (``None``: not converted),
    whose series are whole, so the remedy is a smaller window or converting again."""
    if not found.runs or found.first is None:
        return
    name, key, rows = found.first
    if converted_span is None:
        what = "series (or a file's stretch of one)"
        remedy = "use a smaller window, or join a series split between files (`dask-windows convert` does)"
    elif span <= converted_span:
        what = "series"
        remedy = "use a smaller window (these series are whole: `dask-windows convert` joined them)"
    else:
        what = "series (or the first chunk of one)"
        remedy = (
            f"the data were converted for window + horizon <= {converted_span}: re-run `dask-windows convert` "
            "with a --window this large, or use a smaller window"
        )
    _warn(
        f"{found.runs:,} {what} in {description} are shorter than "
        f"{asked or f'window + horizon = {span} rows'} and hold no window: {found.rows:,} rows are left out "
        f"(first: series {key!r} in {name}, {rows:,} rows); {remedy}; `dask-windows inspect` reports the count",
        ShortSeriesWarning,
    )


def series_column_hint(source: Any, used: Sequence[Any]) -> tuple[str, int] | None:
    """``(column, runs in the first partition)`` of a column outside ``used`` that looks like a series id, or ``None``."""
    if not getattr(source, "partitions", None):
        return None
    try:
        names = list(source.column_names())
    except Exception:  # a source without named columns (arrays)
        return None
    for name in names:
        words = _WORD.findall(name) if isinstance(name, str) else []
        if name in used or not any(word.lower() in SERIES_WORDS for word in words):
            continue
        try:
            keys = np.asarray(source.read(0, [name])[name])
        except Exception:  # unreadable here: the scan reports the partition on its own
            return None
        if keys.dtype.kind in "fcmM":  # a measurement or a time, not an id
            continue
        _, lengths = find_runs(keys)
        if len(lengths) > 1 and int(np.max(lengths)) > 1:  # runs of many rows: series, not a row id
            return name, len(lengths)
    return None


def warn_series_column(hint: tuple[str, int] | None, description: str) -> None:
    """Warn once that the column of ``hint`` looks like a series id that was not passed."""
    if hint is None:
        return
    name, runs = hint
    _warn(
        f"{description} has a column {name!r} that looks like a series id ({runs:,} runs of distinct values in its "
        f"first partition), but series= was not given: each partition is taken as one series, so windows may run "
        f"from one series into the next; pass series={name!r} (or series=None to keep one series per partition "
        "and silence this)",
        SeriesColumnWarning,
    )


def check_omissions(ds: Any, series_given: bool) -> LeftOut:
    """What ``WindowDataset`` runs at open: warn about short series (returned, kept as ``ds.left_out``) and a likely
    series column (unless ``series_given``: passed, ``None`` included, or from a manifest)."""
    description = ds.source.description
    if not series_given and ds.spec.series is None:
        warn_series_column(series_column_hint(ds.source, list(ds.spec.columns)), description)
    found = left_out(ds.runs, ds.source.partitions, ds.spec.span)
    manifest = getattr(ds.source, "_manifest", None)  # a `dask-windows convert` output's
    converted_span = None
    if manifest is not None:  # whole series; in chunks overlapping for a span in the spread layout
        head = manifest["manifest"]
        chunked = head.get("version", 1) >= 2 and head.get("layout", "spread") == "spread"
        converted_span = int(head["span"]) if chunked else ds.spec.span
    warn_left_out(found, ds.spec.span, description, ds.spec.describe_span(), converted_span)
    return found
