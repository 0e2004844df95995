"""``inspect`` with ``--nan raise``: fail where the loader would meet NaN or inf in a window.

The loader checks ``nan="raise"`` only when it builds a buffer, so opening a
``WindowDataset`` (all ``inspect`` did) said nothing of a NaN that the first
epoch then rejected. Here ``inspect`` opens the same dataset a second time
with ``nan="drop"``, whose scan reads the feature and target columns and
leaves out every window holding a non-finite value, and compares the two
counts: any window fewer is a window ``nan="raise"`` would fail on. The cost
is the one ``--nan drop`` already pays (those columns read once); the figure
is the loader's own, not a second reckoning of which rows a window covers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dask_windows.errors import DataError
from dask_windows.opening.checks import bad_value_rows, value_problem

__all__ = ["reject_non_finite"]


def reject_non_finite(ds: Any, open_dropping: Callable[[], Any]) -> None:
    """Raise ``DataError`` when ``ds`` (opened with ``nan="raise"``) holds a window with NaN or inf.

    Args:
        ds: The opened ``WindowDataset``.
        open_dropping: Opens the same dataset with ``nan="drop"``.

    Raises:
        DataError: naming the column, the partition and the row of the first non-finite value
            there, and how many windows hold one.
    """
    if ds.spec.nan != "raise" or ds.num_windows == 0:
        return
    dropping = open_dropping()
    lost = ds.num_windows - dropping.num_windows
    if lost <= 0:
        return
    differ = np.flatnonzero(np.asarray(ds.windows_per_partition) != np.asarray(dropping.windows_per_partition))
    index = int(differ[0]) if len(differ) else 0
    columns = list(dict.fromkeys([*ds.spec.features, *ds.spec.targets]))
    source = ds.source
    values = source.read_rows(index, columns, 0, source.readable_rows(index))
    rows = bad_value_rows(values)
    where = f"in {ds.partitions[index].name}"
    if len(rows):
        row = int(rows[0])
        column = next(c for c in columns if values[c].dtype.kind in "fc" and not _fits_float32(values[c][row]))
        where = f"{value_problem(float(values[column][row]))} in column {column!r} of {ds.partitions[index].name} at row {row}"
    raise DataError(
        f"{where}: {lost:,} of {ds.num_windows:,} windows hold NaN or inf, which the loader rejects with "
        "nan='raise' when it reaches them; clean the data, or pass nan='drop' to leave those windows out"
    )


def _fits_float32(value: Any) -> bool:
    return bool(np.isfinite(value)) and abs(float(value)) <= float(np.finfo(np.float32).max)
