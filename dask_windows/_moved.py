"""Old module paths of 0.1 that still import, with a ``DeprecationWarning``.

Version 0.2 moved the sources into ``dask_windows.sources`` and the command
line's tools into ``dask_windows.cli``. ``import dask_windows.parquet_source``
(and the other 0.1 paths below) keeps working until 0.4: a finder on
``sys.meta_path`` answers for the old name with the module at its new place,
so both names refer to the same module object (same classes, same state).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: 0.1 module path -> where it lives now
MOVED = {
    "dask_windows.array_source": "dask_windows.sources.arrays",
    "dask_windows.bench": "dask_windows.cli.bench",
    "dask_windows.convert": "dask_windows.cli.convert",
    "dask_windows.dask_source": "dask_windows.sources.dask_frame",
    "dask_windows.manifest": "dask_windows.sources.manifest",
    "dask_windows.parquet_source": "dask_windows.sources.parquet",
    "dask_windows.readers": "dask_windows.cli.readers",
    "dask_windows.retry": "dask_windows.sources.retry",
    "dask_windows.source": "dask_windows.sources",
    "dask_windows.summary": "dask_windows.cli.summary",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the 0.1 names and loads them as the module at its new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in dask_windows 0.2; import it from there (the old path stops working in 0.4)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed at its new path."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
