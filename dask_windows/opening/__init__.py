"""What opening a ``WindowDataset`` checks and scans: its columns (``check_columns``), the series runs
of every partition (``scan``) and that they hold a window (``check_windows``); ``checks`` checks the
data itself, ``omissions`` counts what opening leaves out and warns once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dask_windows.errors import DataError
from dask_windows.errors.faults import SkippedPartition, guard_scan
from dask_windows.errors.remedies import no_windows_remedy
from dask_windows.opening.checks import bad_value_rows, check_column_types
from dask_windows.planning.index import PartitionRuns, runs_of_files, scan_runs
from dask_windows.runtime.memory import trim
from dask_windows.settings.spec import WindowSpec
from dask_windows.sources import Source
from dask_windows.sources.base import rows_per_partition
from dask_windows.sources.parquet.footers import paused_gc

__all__ = ["check_columns", "check_windows", "scan"]


def check_columns(source: Source, spec: WindowSpec, series: Any) -> None:
    """Raise ``SchemaError`` when ``source`` lacks a feature, target or the ``series`` column, or one is
    of a type that cannot be read as numbers."""
    roles = dict.fromkeys(spec.targets, "target")
    roles.update(dict.fromkeys(spec.features, "feature"))
    needed = list(spec.columns)
    if series is not None:
        roles[series] = "series column"
        needed.append(series)
    source.check_columns(needed, roles)
    check_column_types(source, list(spec.columns), roles)


def scan(
    source: Source,
    spec: WindowSpec,
    series: Any,
    nan: str,
    on_error: str,
    skipped: list[SkippedPartition],
    threads: int,
) -> Sequence[PartitionRuns]:
    """The series runs of every partition (as ``index.scan_runs`` gives them), on ``threads`` threads.

    ``nan="drop"`` also reads every row a window may hold and leaves out the windows holding non-finite
    values; ``on_error="skip"`` records an unreadable partition in ``skipped`` and leaves it out."""
    bad_rows = (  # every row a window may hold, the halo past a partition's end included
        (lambda i: bad_value_rows(source.read_rows(i, list(spec.columns), 0, source.readable_rows(i))))
        if nan == "drop"
        else None
    )

    def read_runs(i: int) -> tuple:
        return source.read_runs(i, series)

    if bad_rows is None and getattr(source, "runs_known", lambda _: False)(series):
        threads = 1  # nothing to read: threads would only trade the GIL
        told = getattr(source, "runs_at_once", lambda _: None)(series)  # a dataset index: every file's runs
        if told is not None:
            return runs_of_files(*told)
    if on_error == "skip":
        read_runs, bad_rows = guard_scan(read_runs, bad_rows, source.partitions, skipped)  # type: ignore[assignment]
    with paused_gc():  # the runs of every partition live on: see paused_gc
        rows = rows_per_partition(source.partitions).tolist()
        runs = scan_runs(len(source.partitions), read_runs, bad_rows, threads, source.continues, rows)
    trim()
    return runs


def check_windows(
    source: Source, spec: WindowSpec, runs: Sequence[PartitionRuns], num_windows: int, order_remedy: str, skipped: list
) -> None:
    """Raise ``DataError`` when the runs hold no window, naming the longest run and the remedy
    (``order_remedy``: what ``check_series_order`` gave, empty when the order is fine)."""
    if num_windows == 0:
        longest = max((int(r.lengths.max()) for r in runs if len(r.lengths)), default=0)
        manifest = (getattr(source, "_manifest", None) or {}).get("manifest")
        remedy = (
            order_remedy.lstrip("; ")
            or no_windows_remedy(manifest, spec.span, spec.window, spec.horizon)
            or "use a smaller window or merge series"
        )
        raise DataError(
            f"no windows: {spec.describe_span()}"
            + f" is longer than every series run in {source.description} (longest: {longest:,} rows); "
            + remedy
            + (f"; {len(skipped)} partitions were skipped as unreadable" if skipped else "")
        )
