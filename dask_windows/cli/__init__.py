"""The ``dask-windows`` command line and what only it needs.

* ``main``: argument parsing and the subcommands (``convert``, ``inspect``,
  ``stats``, ``bench``); their runners and reports are in ``commands``, the
  Dask cluster in ``cluster``;
* ``convert``: rewrites any input into Parquet parts with a manifest (its
  passes in ``convert_plan`` and ``scratch``);
* ``readers``: CSV, Avro, JSON lines, ``.npy`` and Parquet inputs for convert;
* ``summary``: ``inspect`` (windows and memory from metadata, in ``inspection``)
  and ``stats`` (in ``stats``);
* ``bench``: a loader throughput run.

The loader never imports this package; this package imports the loader's
modules (to count windows the way the loader does).
"""

from __future__ import annotations

from dask_windows.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
