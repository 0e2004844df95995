"""The manifest ``dask-windows convert`` writes next to its Parquet files (format: docs/converted.md).

``_dask_windows_manifest.json`` holds per file (``path`` relative to the root, sorted in row order)
its ``rows``, ``bytes``, ``footer`` digest and series ``runs`` ``[start, rows, value]``; version 2
(the spread layout) adds ``"span"`` and ``"layout"`` and runs ``[start, rows, value, origin, owned]``.
It copies facts the files hold, so it is trusted only where it names exactly the files there and
their footers."""

from __future__ import annotations

import datetime
import hashlib
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
    "footer_digest",
    "manifest_run_arrays",
    "read_manifest",
    "series_runs",
    "span_shortfall",
    "to_json_scalar",
    "validate_manifest",
    "write_manifest",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "_dask_windows_manifest.json"
MANIFEST_FORMAT = "dask_windows.manifest"
MANIFEST_VERSION = 2
#: Versions this library reads (1: runs ``[start, rows, value]``; 2: adds origin, owned, span).
READ_VERSIONS = (1, 2)


def to_json_scalar(value: Any) -> Any:
    """One series value as a JSON scalar (NaN as None, datetimes in ISO 8601, anything else as ``str``)."""
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


def footer_digest(raw: bytes) -> str:
    """A file's content identity: a 64-bit BLAKE2b digest (hex) of its serialized Parquet footer (``Footer.raw``)."""
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def file_footer_digest(fs: Any, path: str) -> str:
    """``footer_digest`` of the Parquet file at ``path`` (two reads from its end)."""
    with fs.open(path, "rb") as src:
        size = src.seek(0, 2)
        src.seek(max(0, size - 8))
        tail = src.read()
        needed = int.from_bytes(tail[-8:-4], "little") + 8 if tail[-4:] == b"PAR1" else 0
        if needed <= 8 or needed > size:
            raise DataError(f"{path} does not end with a Parquet footer; rerun `dask-windows convert`")
        src.seek(size - needed)
        return footer_digest(src.read(needed))


def series_runs(values: np.ndarray | Sequence[Any]) -> list[list[Any]]:
    """``[[start_row, num_rows, value], ...]``: the runs of equal consecutive ``values``, as JSON scalars."""
    values = np.asarray(values)
    num_rows = len(values)
    if num_rows == 0:
        return []
    changed = values[1:] != values[:-1]  # (num_rows - 1,): True where a new run begins
    run_starts = np.concatenate([[0], np.flatnonzero(changed) + 1])
    run_lengths = np.diff(np.append(run_starts, num_rows))
    return [[int(start), int(length), to_json_scalar(values[start])] for start, length in zip(run_starts, run_lengths)]


def validate_manifest(manifest: Any, where: str = "manifest") -> dict:
    """Check a manifest's shape and consistency: the manifest, or ``DataError`` naming ``where`` and the rule."""

    def fail(rule: str) -> DataError:
        return DataError(
            f"{where} is not a valid dask_windows manifest: {rule}; delete it or rerun `dask-windows convert`"
        )

    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f'"format" must be "{MANIFEST_FORMAT}"')
    version = manifest.get("version")
    if version not in READ_VERSIONS:
        raise fail(
            f'"version" is {version!r}, this library reads versions '
            f"{', '.join(map(str, READ_VERSIONS))} (upgrade dask_windows or reconvert)"
        )
    run_width = 3 if version == 1 else 5
    if version >= 2 and not (isinstance(manifest.get("span"), int) and manifest["span"] >= 1):
        raise fail('"span" must be an integer >= 1')
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
        if "footer" in entry and not isinstance(entry["footer"], str):
            raise fail(f"files[{i}] ({entry['path']}) has a footer digest that is not a string")
        expected_start = 0
        for run in runs:
            if not (
                isinstance(run, list)
                and len(run) == run_width
                and run[0] == expected_start
                and isinstance(run[1], int)
                and run[1] > 0
            ):
                raise fail(f"files[{i}] ({entry['path']}) has a broken run {run!r}")
            if run_width == 5 and not (
                isinstance(run[3], int) and run[3] >= 0 and isinstance(run[4], int) and 0 <= run[4] <= run[1]
            ):
                raise fail(f"files[{i}] ({entry['path']}) has a run with a bad origin or owned count {run!r}")
            expected_start += run[1]
        if expected_start != rows:
            raise fail(f"files[{i}] ({entry['path']}) runs cover {expected_start} rows, not {rows}")
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
    span: int | None = None,
    layout: str | None = None,
) -> str:
    """Write the manifest into the dataset folder ``root`` (as ``fs`` names it); return the path written.

    Args:
        files: Per file ``{"path", "rows", "bytes", "runs"}`` (``path`` relative to ``root``; runs
            ``[start, rows, value]``, with ``span`` ``[start, rows, value, origin, owned]``); a missing
            ``"footer"`` digest is read from the file.
        span: The ``window + horizon`` the chunks overlap for; ``None`` writes version 1.
        layout: ``"spread"`` or ``"contiguous"`` (version 2 only)."""
    base = fs._strip_protocol(root)
    head = {} if span is None else {"span": int(span), "layout": layout or "spread"}
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": 1 if span is None else MANIFEST_VERSION,
        "series": series,
        "time": time,
        **head,
        "files": [
            {
                "path": f["path"],
                "rows": int(f["rows"]),
                "bytes": int(f["bytes"]),
                "footer": f.get("footer") or file_footer_digest(fs, posixpath.join(base, f["path"])),
                "runs": [[int(r[0]), int(r[1]), to_json_scalar(r[2]), *map(int, r[3:])] for r in f["runs"]],
            }
            for f in sorted(files, key=lambda f: f["path"])
        ],
    }
    validate_manifest(manifest)
    path = posixpath.join(base, MANIFEST_NAME)
    with fs.open(path, "w") as out:
        json.dump(manifest, out, separators=(",", ":"))
    logger.debug("wrote %s (%d files)", path, len(files))
    return path


def read_manifest(root: str, fs: Any) -> dict | None:
    """The validated manifest of the folder ``root``, or ``None`` when it has none (``DataError`` when invalid)."""
    path = posixpath.join(fs._strip_protocol(root), MANIFEST_NAME)
    try:
        with fs.open(path, "r") as src:
            text = src.read()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON ({exc}); delete it or rerun `dask-windows convert`") from exc
    return validate_manifest(manifest, where=path)


def manifest_run_arrays(runs: Sequence[Sequence[Any]]) -> tuple[np.ndarray, ...]:
    """One file's manifest runs as ``(starts, lengths, keys)``, plus ``(origin, owned)`` for version-2 runs."""
    starts = np.array([r[0] for r in runs], dtype=np.int64)
    lengths = np.array([r[1] for r in runs], dtype=np.int64)
    keys = np.array([r[2] for r in runs])
    if runs and len(runs[0]) == 5:
        origin = np.array([r[3] for r in runs], dtype=np.int64)
        owned = np.array([r[4] for r in runs], dtype=np.int64)
        return starts, lengths, keys, origin, owned
    return starts, lengths, keys


def span_shortfall(manifest: dict, span: int, stride: int) -> tuple[int, int]:
    """``(lost, total)`` windows when a version-2 dataset is opened with a longer ``span`` than converted
    for (the windows starting in a chunk's last owned rows and ending past its overlap)."""
    import pandas as pd

    from dask_windows.planning.index import run_grid
    from dask_windows.planning.windows import windows_per_run

    if manifest.get("version", 1) < 2 or span <= manifest["span"]:
        return 0, 0
    runs = [r for f in manifest["files"] for r in f["runs"]]
    if not runs:
        return 0, 0
    table = np.array([[r[0], r[1], r[3], r[4]] for r in runs], dtype=np.int64)  # (R, 4) start, rows, origin, owned
    kept = int(run_grid(table[:, 0], table[:, 1], span, stride, table[:, 2], table[:, 3])[1].sum())
    codes = pd.factorize(pd.Series([r[2] for r in runs], dtype=object), use_na_sentinel=False)[0]
    series_rows = np.bincount(codes, weights=table[:, 3]).astype(np.int64)  # owned rows tile each series
    total = int(windows_per_run(series_rows, span, stride).sum())
    return total - kept, total
