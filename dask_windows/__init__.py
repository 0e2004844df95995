"""Stream shuffled windows of partitioned time series into PyTorch."""
from __future__ import annotations

from dask_windows import masks
from dask_windows.array_source import ArraySource
from dask_windows.dask_source import DaskSource
from dask_windows.dataset import WindowDataset
from dask_windows.device import DevicePrefetcher, standardize
from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError
from dask_windows.faults import SkippedPartition, SkippedPartitionWarning
from dask_windows.parquet_source import ParquetSource
from dask_windows.retry import RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "ArraySource",
    "ConfigError",
    "DaskSource",
    "DataError",
    "DevicePrefetcher",
    "ParquetSource",
    "RetryPolicy",
    "SchemaError",
    "SkippedPartition",
    "SkippedPartitionWarning",
    "SourceReadError",
    "WindowDataset",
    "__version__",
    "masks",
    "standardize",
]
