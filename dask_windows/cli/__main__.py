"""``python -m dask_windows.cli``: the same as the ``dask-windows`` command."""

from __future__ import annotations

import sys

from dask_windows.cli.main import main

sys.exit(main())
