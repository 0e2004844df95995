"""NVTabular-style workflows: column operations fitted over a dataset with Dask, applied while streaming.

``Workflow(ops, series=..., continuous=..., ...)`` is fitted in one Dask pass (``wf.fit(data)``), saved
as a small JSON file (``wf.save(url)``) and given to ``WindowDataset(..., workflow=wf)``: each decoded
piece is transformed on the reader threads. See ``docs/workflows.md``.
"""

from __future__ import annotations

from dask_windows.workflow.batch import BATCH_KEYS, NamedBatches, invert_target, widen_codes
from dask_windows.workflow.core import Statics, Workflow
from dask_windows.workflow.ops import (
    Categorify,
    Clip,
    Difference,
    FillMissing,
    Function,
    Lag,
    Log1p,
    Normalize,
    Op,
    TimeFeatures,
)
from dask_windows.workflow.timesteps import fill_timesteps
from dask_windows.workflow.transforms import Transform

__all__ = [
    "BATCH_KEYS",
    "Categorify",
    "Clip",
    "Difference",
    "FillMissing",
    "Function",
    "Lag",
    "Log1p",
    "NamedBatches",
    "Normalize",
    "Op",
    "Statics",
    "TimeFeatures",
    "Transform",
    "Workflow",
    "fill_timesteps",
    "invert_target",
    "widen_codes",
]
