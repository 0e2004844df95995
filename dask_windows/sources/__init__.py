"""Where rows come from: the source interface (``base``), one module per kind of data, and picking one.

The sources are the only modules that open files: ``parquet`` (any fsspec URL), ``dask_frame``,
``arrays`` (numpy, ``.npy`` memmaps), ``arrow`` (pandas, pyarrow, Polars, Hugging Face, Delta),
``manifest`` (what ``dask-windows convert`` writes) and ``retry`` (transient storage errors).
``open_source`` picks one from the type of the data; importing this package imports neither dask
nor torch."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.errors.faults import check_on_error
from dask_windows.sources.arrays import ArraySource
from dask_windows.sources.base import Partition, PartitionReader, Source
from dask_windows.sources.dask_frame import DaskSource
from dask_windows.sources.parquet import ParquetSource
from dask_windows.sources.retry import RetryPolicy

__all__ = [
    "ArraySource",
    "DaskSource",
    "ParquetSource",
    "Partition",
    "PartitionReader",
    "RetryPolicy",
    "Source",
    "is_series_vector",
    "open_source",
]

log = logging.getLogger(__name__)


def is_series_vector(series: Any) -> bool:
    """Whether ``series`` is a per-row id vector (for one 2-D array) rather than a column name."""
    return isinstance(series, (np.ndarray, list, tuple)) or (
        hasattr(series, "__array__") and hasattr(series, "__len__") and not isinstance(series, str)
    )


def open_source(
    data: Any,
    storage_options: dict | None = None,
    *,
    series: Any = None,
    retry: int | RetryPolicy | None = None,
    on_error: str = "raise",
    **options: Any,
) -> Source:
    """The source for ``data``: a path/URL/list of paths, a Dask DataFrame, numpy arrays, Arrow-like data
    or a ready ``Source`` (returned as is).

    Args:
        series: The series column (a hint for scans at open), or for one 2-D array a ``(rows,)`` id vector.
        retry: Retries of transient storage errors.
        on_error: ``"raise"`` or ``"skip"`` for partitions unreadable when the source is opened.
        **options: ``partition_bytes`` (Parquet), ``partition_rows`` (arrays), ``threads``, ...
    """
    check_on_error(on_error)
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(
            f"storage_options={storage_options!r} must be a dict of fsspec options, e.g. "
            "storage_options={'anon': True} for a public bucket or {'key': ..., 'secret': ...}"
        )
    threads = options.pop("threads", None)
    if isinstance(data, Source):
        return data
    index = options.pop("index", None)
    footer_group = options.pop("footer_group", None)
    if series is not None and is_series_vector(series) and not isinstance(data, np.ndarray):
        raise ConfigError(
            f"series was given as a vector of {len(series)} ids, which only works with one 2-D numpy array; "
            f"for {type(data).__name__} data pass the name of the series column"
        )
    if isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data)
    ):
        options.pop("partition_rows", None)
        given = {"threads": threads, "index": index, "footer_group": footer_group}
        given["series"] = series if isinstance(series, str) else None  # small files' runs come with the footers
        options.update((k, v) for k, v in given.items() if v is not None)
        return ParquetSource(data, storage_options, retry=retry, on_error=on_error, **options)
    if index not in (None, False):
        raise ConfigError(f"index={index!r} applies to Parquet files, not to {type(data).__name__}; leave index= out")
    if options.pop("cache_dir", None) is not None:  # what is not Parquet is read where it is
        options.pop("cache_bytes", None)
        log.info("cache_dir= applies to Parquet in a remote store; %s is read without it", type(data).__name__)
    from dask_windows.sources.arrow import ArrowSource, is_arrow_like

    if is_arrow_like(data):  # pandas, pyarrow, Polars, Hugging Face, to_pyarrow_dataset() (Delta)
        return ArrowSource(data, series=series, **options)
    if type(data).__module__.startswith("dask"):
        options.pop("partition_bytes", None)
        options.pop("partition_rows", None)
        if isinstance(retry, RetryPolicy):
            retry = retry.unbounded()  # a partition computed on a cluster may take long: no storage deadline
        return DaskSource(data, series=series, retry=retry, on_error=on_error, **options)
    options.pop("partition_bytes", None)
    if isinstance(data, np.ndarray) and series is not None and is_series_vector(series):
        return ArraySource.from_series(data, series, **options)
    if isinstance(data, np.ndarray):
        return ArraySource([data], **options)
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, np.ndarray) for d in data):
        return ArraySource(data, **options)
    raise TypeError(
        f"cannot read windows from {type(data).__name__}; pass a Parquet path/URL/glob or a list of them, "
        "a Dask DataFrame, a list of (rows, C) numpy arrays, one 2-D array with series=<id per row>, "
        "a pandas/Polars DataFrame, a pyarrow Table or Dataset, or a Hugging Face datasets.Dataset"
    )
