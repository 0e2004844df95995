"""What a dataset holds and how to standardise it: ``inspect`` and ``stats``.

``inspect`` answers "how many windows, and how much memory will the loader
need?" by opening the very ``WindowDataset`` a training script would open,
with the same arguments: the loader's validation, its errors, its window grid
(series runs from the manifest when there is one, else from the series column;
NaN rows with ``nan="drop"``; unreadable files with ``on_error="skip"``), so
the counts cannot disagree with the loader's. The price is the loader's own
opening cost: every file's footer (and the series column without a manifest,
the feature columns with ``nan="drop"``), and importing torch (about a second).

``stats`` computes per-feature count, mean, population std, min, max and NaN
count in one Dask pass: each partition reduces to a few numbers per feature
(mean and sum of squared deviations, computed in float64 in two passes over
the partition's rows), and the client merges them with Chan et al.'s
pairwise update, which stays accurate where a global sum of squares would
cancel catastrophically.
"""

from __future__ import annotations

from dask_windows.cli.inspection import inspect_dataset, loader_memory, manifest_windows
from dask_windows.cli.stats import compute_stats

__all__ = [
    "compute_stats",
    "inspect_dataset",
    "loader_memory",
    "manifest_windows",
]
