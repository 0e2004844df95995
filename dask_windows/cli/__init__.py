"""The ``dask-windows`` command line and what only it needs (the loader never imports it): ``main``
parses, ``commands`` runs and reports, the other modules do the work."""

from __future__ import annotations

from dask_windows.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
