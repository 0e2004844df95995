"""fastai / tsai ``DataLoaders`` from ``WindowDataset``s: see ``dask_windows.integrations.fastai``."""

from __future__ import annotations

from dask_windows.integrations.fastai import WindowDataLoaders, WindowDL

__all__ = ["WindowDL", "WindowDataLoaders"]
