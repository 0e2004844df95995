"""What ``convert`` reports about the files it wrote, counted from the files' own runs.

The spread layout deals every long series over all files in chunks, and
repeats ``span - 1`` rows at each chunk cut. Counting from the plan ("pieces
of a series longer than one file") said "0 split across files" while every
series was in every file, and "rows out" left the repeated rows out. Here
both come from the manifest entries written: a series is split when its runs
lie in more than one file, and the rows stored are the files' rows, the
overlap included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["series_in_several_files", "stored_rows"]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)  # manifest values: str, int, float, bool


def series_in_several_files(entries: Sequence[dict]) -> int:
    """Series whose runs lie in more than one of the files ``entries`` describe."""
    first_file: dict[str, int] = {}
    split: set[str] = set()
    for i, entry in enumerate(entries):
        for run in entry["runs"]:
            key = _key(run[2])
            if first_file.setdefault(key, i) != i:
                split.add(key)
    return len(split)


def stored_rows(entries: Sequence[dict]) -> tuple[int, int]:
    """``(rows stored, overlap rows)``: every row of every file, and those repeated at chunk cuts."""
    stored = sum(int(e["rows"]) for e in entries)
    owned = sum(int(run[4]) if len(run) >= 5 else int(run[1]) for e in entries for run in e["runs"])
    return stored, stored - owned


def longest_series(manifest: dict) -> int:
    """Rows of the longest series a manifest describes (its runs' owned rows summed per series)."""
    rows: dict[str, int] = {}
    for entry in manifest["files"]:
        for run in entry["runs"]:
            key = _key(run[2])
            rows[key] = rows.get(key, 0) + int(run[4] if len(run) >= 5 else run[1])
    return max(rows.values(), default=0)
