"""Remedies for failures whose generic message (``failures.REMEDIES``) would send the user the wrong
way: a URL whose fsspec backend is not installed, a file of another format, a window longer than
every chunk of a spread-converted dataset. Each returns the better remedy, or ``None``; none does
I/O or imports optional packages."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["missing_backend", "no_parquet_remedy", "no_windows_remedy", "wrong_format"]

#: fsspec protocol -> (package, the pip line that installs it)
_BACKENDS = {
    "s3": ("s3fs", "pip install 'dask_windows[s3]'"),
    "s3a": ("s3fs", "pip install 'dask_windows[s3]'"),
    "gs": ("gcsfs", "pip install gcsfs"),
    "gcs": ("gcsfs", "pip install gcsfs"),
    "abfs": ("adlfs", "pip install adlfs"),
    "az": ("adlfs", "pip install adlfs"),
    "hf": ("huggingface_hub", "pip install huggingface_hub"),
}

#: file suffix -> (what it is, how to open it without converting)
_OTHER_FORMATS = {
    ".csv": ("a CSV file", "dask.dataframe.read_csv"),
    ".csv.gz": ("a CSV file", "dask.dataframe.read_csv"),
    ".tsv": ("a TSV file", "dask.dataframe.read_csv(sep='\\t')"),
    ".avro": ("an Avro file", "dask.dataframe.from_map with fastavro"),
    ".json": ("a JSON file", "dask.dataframe.read_json"),
    ".jsonl": ("a JSON file", "dask.dataframe.read_json(lines=True)"),
    ".npy": ("a .npy array", "numpy.load"),
    ".npz": ("a .npz archive", "numpy.load"),
}


def missing_backend(exc: BaseException | None, url: str = "") -> str | None:
    """The ``pip install`` remedy when ``exc`` (or a cause) is a missing fsspec backend (``url``'s protocol picks it)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError):
            text = str(exc)
            found = re.search(r"([A-Za-z0-9]+)://", url)
            protocol = found.group(1).lower() if found else ""
            package, line = _BACKENDS.get(protocol, (getattr(exc, "name", None) or "", ""))
            named = next((p for p, _ in _BACKENDS.values() if p in text), None)
            if named and named != package:
                package, line = next(v for v in _BACKENDS.values() if v[0] == named)
            if not package:
                return f"install the package the error names ({text}); this is not a fault of the data"
            return f"install {package} ({line or f'pip install {package}'}); this is not a fault of the data"
        exc = exc.__cause__ or exc.__context__
    return None


def wrong_format(path: str) -> str | None:
    """The remedy when a file of another format (by its name) was handed to the Parquet source."""
    lower = path.lower()
    for suffix, (what, reader) in _OTHER_FORMATS.items():
        if lower.endswith(suffix):
            return (
                f"{path} is {what}, not Parquet: rewrite it as Parquet with `dask-windows convert "
                f"{path} OUT --series S --time T` and open OUT, or read it with {reader} and pass the "
                f"frame to WindowDataset"
            )
    return None


def no_parquet_remedy(data: str, names: list[str]) -> str | None:
    """The remedy when the folder or glob ``data`` holds no Parquet file but files of another format."""
    kinds: dict[str, list[str]] = {}
    for name in names:
        lower = name.lower()
        suffix = next((s for s in _OTHER_FORMATS if lower.endswith(s)), None)
        if suffix is not None:
            kinds.setdefault(_OTHER_FORMATS[suffix][0], []).append(name)
    if not kinds:
        return None
    what, found = max(kinds.items(), key=lambda kv: len(kv[1]))
    kind = what.split(" ", 1)[1]  # "CSV file"
    return (
        f"it holds {len(found):,} {kind}{'s' if len(found) > 1 else ''} (first: {sorted(found)[0]}): rewrite "
        f"{'them' if len(found) > 1 else 'it'} as Parquet with `dask-windows convert {data} OUT --series S --time T` "
        "and use OUT"
    )


def no_windows_remedy(manifest: Any, span: int, window: int, horizon: int) -> str | None:
    """The remedy when no ``span = window + horizon`` fits the chunks of a spread-converted dataset (``manifest``:
    ``read_manifest``'s ``"manifest"``), else ``None``."""
    if not isinstance(manifest, dict) or manifest.get("version", 1) < 2 or span <= manifest.get("span", span):
        return None
    rows: dict = {}
    for f in manifest.get("files", ()):
        for run in f.get("runs", ()):
            if len(run) >= 5:
                key = repr(run[2])
                rows[key] = rows.get(key, 0) + int(run[4])  # owned rows tile each series
    longest = max(rows.values(), default=0)
    if longest < span:
        return None
    flags = f"--window {window}" + (f" --horizon {horizon}" if horizon else "")
    return (
        f"it was converted in chunks for window + horizon <= {manifest['span']} rows, while its longest "
        f"series has {longest:,} rows: re-run `dask-windows convert` with {flags} (or larger), "
        f"or use a window + horizon of at most {manifest['span']}"
    )
