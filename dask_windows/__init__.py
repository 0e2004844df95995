"""Stream shuffled windows of partitioned time series into PyTorch."""
from __future__ import annotations

from dask_windows import masks
from dask_windows.dataset import WindowDataset
from dask_windows.device import DevicePrefetcher, standardize
from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "DevicePrefetcher",
    "SchemaError",
    "SourceReadError",
    "WindowDataset",
    "__version__",
    "masks",
    "standardize",
]
