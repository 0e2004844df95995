"""The ``dask-windows`` command line and what only it needs (the loader never imports it).

``main`` parses, ``commands`` runs and reports; ``convert`` (with ``convert_plan``, ``scratch``,
``layout``, ``readers`` and ``safety``), ``summary`` (``inspect``), ``stats``, ``bench`` and
``fit`` do the work; ``cluster`` is the Dask cluster of the commands that use one.
"""

from __future__ import annotations

from dask_windows.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
