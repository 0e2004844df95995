"""``python -m dask_windows.cli``: the same as the ``dask-windows`` command."""

from __future__ import annotations

from dask_windows.cli.main import run_and_exit

run_and_exit()
