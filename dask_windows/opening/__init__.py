"""What opening a ``WindowDataset`` checks and scans: its columns, then the series runs.

Moved out of ``dataset`` unchanged: ``check_columns`` checks that the source
holds the feature, target and series columns with usable types; ``scan`` reads
the series runs of every partition (and, with ``nan="drop"``, the rows holding
non-finite values), skipping unreadable partitions with ``on_error="skip"``;
``check_windows`` raises when the scanned runs hold no window.

The package also holds ``checks`` (checks of the data itself at open: a manifest against the
listing, series order, output dtypes) and ``omissions`` (what opening leaves out, counted and
warned once).
"""

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
    """Check that ``source`` holds the features, targets and ``series`` column, with usable types.

    Raises:
        SchemaError: A column is missing or of a type that cannot be read as numbers.
    """
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
    """The series runs of every partition of ``source``, read on ``threads`` threads.

    Args:
        source: The opened source.
        spec: The window settings.
        series: The series column, or ``None`` for one series.
        nan: ``"drop"``: also read every row a window may hold and leave out the windows holding
            non-finite values.
        on_error: ``"skip"``: an unreadable partition is recorded in ``skipped`` and left out.
        skipped: Where skips are recorded.
        threads: Threads reading the partitions.

    Returns:
        The runs of each partition, as ``index.scan_runs`` gives them (``FileRuns``, columnar, when a dataset
        index tells every file's runs).
    """
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
        runs = _scan(source, read_runs, bad_rows, threads)
    trim()
    return runs


def _scan(source: Source, read_runs: Any, bad_rows: Any, threads: int) -> list:
    return scan_runs(
        len(source.partitions),
        read_runs,
        bad_rows,
        threads,
        source.continues,
        rows_per_partition(source.partitions).tolist(),
    )


def check_windows(
    source: Source, spec: WindowSpec, runs: Sequence[PartitionRuns], num_windows: int, order_remedy: str, skipped: list
) -> None:
    """Raise ``DataError`` when the runs hold no window, naming the longest run and the remedy.

    Args:
        source: The opened source.
        spec: The window settings.
        runs: The scanned runs of each partition.
        num_windows: Windows of the dataset's grid.
        order_remedy: The remedy ``check_series_order`` gave (empty when the order is fine).
        skipped: The partitions skipped as unreadable.
    """
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
