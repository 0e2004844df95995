"""Stream shuffled windows of partitioned time series into PyTorch.

The names that need torch are imported on first use (PEP 562 ``__getattr__``), so a Dask worker of
``convert`` or the CLI at start pays neither torch's ~190 MB nor its ~1 s import; the price is that
an import error in a torch-side module surfaces at first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dask_windows._moved import install as _install_moved_paths
from dask_windows.errors import ConfigError, DataError, SchemaError, SourceReadError
from dask_windows.errors.faults import SkippedPartition, SkippedPartitionWarning
from dask_windows.sources import ArraySource, DaskSource, ParquetSource, RetryPolicy

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ provides them
    from dask_windows.corpus import CorpusDataset, ListSource
    from dask_windows.dataset import WindowDataset
    from dask_windows.mixture import Mixture, mix
    from dask_windows.ondevice import masks
    from dask_windows.ondevice.prefetcher import DevicePrefetcher, standardize

__version__ = "0.2.0.dev0"  # the one place: setup.cfg and `dask-windows --version` read it

_install_moved_paths()  # 0.1 module paths (dask_windows.parquet_source, ...) still import

__all__ = [
    "ArraySource",
    "ConfigError",
    "CorpusDataset",
    "DaskSource",
    "DataError",
    "DevicePrefetcher",
    "ListSource",
    "Mixture",
    "ParquetSource",
    "RetryPolicy",
    "SchemaError",
    "SkippedPartition",
    "SkippedPartitionWarning",
    "SourceReadError",
    "WindowDataset",
    "__version__",
    "masks",
    "mix",
    "standardize",
]

# exported name -> (module, attribute in it; None for the module itself); these import torch
_LAZY = {
    "CorpusDataset": ("dask_windows.corpus", "CorpusDataset"),
    "ListSource": ("dask_windows.corpus", "ListSource"),
    "DevicePrefetcher": ("dask_windows.ondevice.prefetcher", "DevicePrefetcher"),
    "WindowDataset": ("dask_windows.dataset", "WindowDataset"),
    "Mixture": ("dask_windows.mixture", "Mixture"),
    "masks": ("dask_windows.ondevice.masks", None),
    "mix": ("dask_windows.mixture", "mix"),
    "standardize": ("dask_windows.ondevice.prefetcher", "standardize"),
}


def __getattr__(name: str) -> Any:
    """Import a torch-dependent export on first access (PEP 562)."""
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups find it without calling __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
