"""The manifest ``dask-windows convert`` writes next to its Parquet files.

A converted dataset's root holds ``_dask_windows_manifest.json``: per file its
row count, its size in bytes and its series runs (maximal contiguous stretches
of one series value, in file order). With it a loader knows every partition's
row count and where each series starts without opening a single file, so a
dataset of 10,000 files is planned in milliseconds. The trade-off: the
manifest is a copy of facts the files also hold, so it is trusted only when it
names exactly the files that are there; :func:`read_manifest` checks its
shape, and callers compare its file list with the listing they made.

Layout (``version`` 1)::

    {"format": "dask_windows.manifest", "version": 1,
     "series": "sensor_id", "time": "timestamp",
     "files": [{"path": "part-00000.parquet", "rows": 1000, "bytes": 40960,
                "runs": [[0, 600, "a"], [600, 400, "b"]]}, ...]}

``path`` is relative to the root and files are named so that sorted order is
the canonical row order.
"""
from __future__ import annotations

import datetime
import json
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import DataError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "read_manifest",
    "series_runs",
    "to_json_scalar",
    "validate_manifest",
    "write_manifest",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "_dask_windows_manifest.json"
MANIFEST_FORMAT = "dask_windows.manifest"
MANIFEST_VERSION = 1


def to_json_scalar(value: Any) -> Any:
    """Turn one series value into a JSON scalar (int, float, str, bool or None).

    Args:
        value: a numpy, pandas or Python scalar.

    Returns:
        The value as a plain Python scalar; datetimes become ISO 8601 strings
        and anything else without a JSON form becomes ``str(value)``.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if value != value else value  # NaN has no JSON form
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if hasattr(value, "isoformat"):  # pandas.Timestamp
        return value.isoformat()
    return str(value)


def series_runs(values: np.ndarray | Sequence[Any]) -> list[list[Any]]:
    """Find the maximal runs of equal consecutive values.

    Args:
        values: one file's series column, in file order.

    Returns:
        ``[[start_row, num_rows, value], ...]`` in file order, values as JSON
        scalars.
    """
    values = np.asarray(values)
    num_rows = len(values)
    if num_rows == 0:
        return []
    changed = values[1:] != values[:-1]  # (num_rows - 1,): True where a new run begins
    run_starts = np.concatenate([[0], np.flatnonzero(changed) + 1])
    run_lengths = np.diff(np.append(run_starts, num_rows))
    return [
        [int(start), int(length), to_json_scalar(values[start])]
        for start, length in zip(run_starts, run_lengths)
    ]


def validate_manifest(manifest: Any, where: str = "manifest") -> dict:
    """Check a manifest's shape and internal consistency.

    Args:
        manifest: the decoded JSON document.
        where: the file it came from, for error messages.

    Returns:
        The same dict.

    Raises:
        DataError: naming the first rule the document breaks.
    """

    def fail(rule: str) -> DataError:
        return DataError(
            f"{where} is not a valid dask_windows manifest: {rule}; "
            f"delete it or rerun `dask-windows convert`"
        )

    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f'"format" must be "{MANIFEST_FORMAT}"')
    if manifest.get("version") != MANIFEST_VERSION:
        raise fail(
            f'"version" is {manifest.get("version")!r}, this library reads version '
            f"{MANIFEST_VERSION} (upgrade dask_windows or reconvert)"
        )
    for key in ("series", "time"):
        if not isinstance(manifest.get(key), str):
            raise fail(f'"{key}" must be a column name')
    files = manifest.get("files")
    if not isinstance(files, list):
        raise fail('"files" must be a list')
    for i, entry in enumerate(files):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise fail(f"files[{i}] has no path")
        rows, runs = entry.get("rows"), entry.get("runs")
        if not isinstance(rows, int) or rows < 0 or not isinstance(entry.get("bytes"), int):
            raise fail(f"files[{i}] ({entry['path']}) needs integer rows and bytes")
        if not isinstance(runs, list):
            raise fail(f"files[{i}] ({entry['path']}) has no runs list")
        expected_start = 0
        for run in runs:
            if not (isinstance(run, list) and len(run) == 3 and run[0] == expected_start
                    and isinstance(run[1], int) and run[1] > 0):
                raise fail(f"files[{i}] ({entry['path']}) has a broken run {run!r}")
            expected_start += run[1]
        if expected_start != rows:
            raise fail(
                f"files[{i}] ({entry['path']}) runs cover {expected_start} rows, not {rows}"
            )
    paths = [entry["path"] for entry in files]
    if paths != sorted(paths) or len(set(paths)) != len(paths):
        raise fail("file paths must be unique and in sorted order")
    return manifest


def write_manifest(
    root: str,
    fs: Any,
    *,
    series: str,
    time: str,
    files: Sequence[dict],
) -> str:
    """Write the manifest into a dataset's root folder.

    Args:
        root: the dataset folder, as ``fs`` names it.
        fs: an fsspec filesystem.
        series: the series column.
        time: the time column.
        files: per file ``{"path", "rows", "bytes", "runs"}``, ``path``
            relative to ``root``.

    Returns:
        The path written.
    """
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "series": series,
        "time": time,
        "files": [
            {"path": f["path"], "rows": int(f["rows"]), "bytes": int(f["bytes"]),
             "runs": [[int(s), int(n), to_json_scalar(v)] for s, n, v in f["runs"]]}
            for f in sorted(files, key=lambda f: f["path"])
        ],
    }
    validate_manifest(manifest)
    path = posixpath.join(fs._strip_protocol(root), MANIFEST_NAME)
    with fs.open(path, "w") as out:
        json.dump(manifest, out, separators=(",", ":"))
    logger.debug("wrote %s (%d files)", path, len(files))
    return path


def read_manifest(root: str, fs: Any) -> dict | None:
    """Read and validate a dataset's manifest.

    Args:
        root: the dataset folder, as ``fs`` names it.
        fs: an fsspec filesystem.

    Returns:
        The manifest, or ``None`` when the folder has none.

    Raises:
        DataError: the file exists but is not a valid manifest.
    """
    path = posixpath.join(fs._strip_protocol(root), MANIFEST_NAME)
    try:
        with fs.open(path, "r") as src:
            text = src.read()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path} is not valid JSON ({exc}); delete it or rerun `dask-windows convert`"
        ) from exc
    return validate_manifest(manifest, where=path)
