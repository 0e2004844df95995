"""Old module paths that still import, with a ``DeprecationWarning``.

Only the paths of a release (0.1.0) are kept: 0.2 moved the sources into
``dask_windows.sources`` and the command line's tools into
``dask_windows.cli``; 0.3 moved the loader's modules into ``planning`` and
``runtime``, and the top level's into ``errors``, ``settings``, ``opening``,
``passes`` and ``ondevice``. ``import dask_windows.parquet_source`` (and the other old paths
below) keeps working until 0.4: a finder on ``sys.meta_path`` answers for the
old name with the module at its new place, so both names refer to the same
module object (same classes, same state).
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

#: old module path -> where it lives now
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
    # 0.1.0's loader modules, moved into sub-packages in 0.3 (planning, runtime)
    "dask_windows.batch": "dask_windows.runtime.batch",
    "dask_windows.buffer": "dask_windows.runtime.buffer",
    "dask_windows.index": "dask_windows.planning.index",
    "dask_windows.memory": "dask_windows.runtime.memory",
    "dask_windows.plan": "dask_windows.planning.plan",
    "dask_windows.prefetch": "dask_windows.runtime.prefetch",
    "dask_windows.resume": "dask_windows.planning.resume",
    "dask_windows.split": "dask_windows.planning.split",
    "dask_windows.windows": "dask_windows.planning.windows",
    "dask_windows.world": "dask_windows.planning.world",
    # 0.1.0's top-level modules, moved into sub-packages in 0.3 (errors, settings, ondevice)
    "dask_windows.device": "dask_windows.ondevice.prefetcher",
    "dask_windows.faults": "dask_windows.errors.faults",
    "dask_windows.masks": "dask_windows.ondevice.masks",
    "dask_windows.spec": "dask_windows.settings.spec",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the 0.1.0 names and loads them as the module at its new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path stops working in 0.4)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed at its new path."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once, first: an old name means the module at its new place
    even where a stale copy of the old file is still on the path (an older install or checkout)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
