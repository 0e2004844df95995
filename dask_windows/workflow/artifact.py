"""A fitted workflow as a small, versioned JSON file, written and read through fsspec.

The file holds the operations (their arguments and fitted state), the roles, the series ids,
the static table's rows, the schema of the input columns and a fingerprint of the files it
was fitted on (their names and sizes). Loading checks the format and version; binding it to a
dataset (``check_source``) raises on another schema, naming the column, and warns when the
files differ but the schema is the same (a refit may be due). A user ``Function`` is stored by
its import name, never pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any

from dask_windows.errors import ConfigError, SchemaError

__all__ = ["FORMAT", "VERSION", "check_source", "digest", "from_json", "list_files", "load", "save", "to_json"]

FORMAT = "dask-windows-workflow"
VERSION = 1


def list_files(data: Any, storage_options: dict | None = None) -> list[tuple[str, int]]:
    """``(path, size)`` of the Parquet files under ``data`` (a path, folder, glob, URL or a list), sorted."""
    import fsspec

    urls = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    found: list[tuple[str, int]] = []
    others: list[str] = []  # files of a folder that are not Parquet (for the remedy)
    for url in urls:
        fs, path = fsspec.core.url_to_fs(str(url), **(storage_options or {}))
        paths = fs.glob(path) if any(ch in path for ch in "*?[") else [path]
        for p in paths:
            if fs.isdir(p):
                every = fs.find(p, detail=True).values()
                infos = [i for i in every if i["name"].endswith((".parquet", ".parq"))]
                if not infos:
                    others += [fs.unstrip_protocol(i["name"]) for i in every]
            else:
                infos = [fs.info(p)]
            found += [(fs.unstrip_protocol(i["name"]), int(i["size"])) for i in infos]
    if not found:
        from dask_windows.remedies import no_parquet_remedy

        shown = data if isinstance(data, (str, os.PathLike)) else " ".join(map(str, data))
        remedy = no_parquet_remedy(str(shown), others) or "check the path"
        raise ConfigError(f"no Parquet file found under {data!r}; {remedy}")
    return sorted(found)


def digest(files: list[tuple[str, int]]) -> str:
    """A hash of the files' base names and sizes (moving the folder keeps it; rewriting a file changes it)."""
    h = hashlib.sha256()
    for path, size in files:
        h.update(f"{os.path.basename(path)}\0{size}\n".encode())
    return h.hexdigest()[:32]


def to_json(wf: Any) -> dict:
    """The artifact's content."""
    if not wf.fitted:
        raise ConfigError("the workflow is not fitted; call Workflow.fit(data) before saving it")
    st = wf.statics
    return {
        "format": FORMAT,
        "version": VERSION,
        "series": wf.series,
        "roles": {r: list(getattr(wf, r)) for r in ("continuous", "categorical", "target", "known")},
        "ops": [{"kind": op.kind, "config": op.config(), "state": op.state} for op in wf.ops],
        "statics": None if st is None else {"config": st.config(), "state": st.state},
        "series_keys": wf.series_keys,
        "schema": wf.schema,
        "fingerprint": wf.fingerprint,
    }


def from_json(doc: dict, where: str = "the workflow") -> Any:
    """The fitted ``Workflow`` of an artifact's content."""
    from dask_windows.workflow.core import Statics, Workflow
    from dask_windows.workflow.ops import op_from_json

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{where} is not a dask-windows workflow file (no format {FORMAT!r}); fit and save one")
    if doc.get("version") != VERSION:
        raise ConfigError(
            f"{where} is a workflow file of version {doc.get('version')!r}; this dask_windows reads version "
            f"{VERSION}: refit it with this version (dask-windows fit)"
        )
    statics = None
    if doc.get("statics"):
        statics = Statics(None, **doc["statics"]["config"])
        statics.state = doc["statics"]["state"]
    wf = Workflow([op_from_json(e) for e in doc["ops"]], series=doc["series"], statics=statics, **doc["roles"])
    wf.series_keys, wf.schema, wf.fingerprint = doc["series_keys"], doc["schema"], doc.get("fingerprint")
    return wf


def save(wf: Any, url: str, storage_options: dict | None = None) -> None:
    """Write ``wf`` as JSON to ``url`` (local path or fsspec URL)."""
    import fsspec

    text = json.dumps(to_json(wf), indent=1, allow_nan=True)
    with fsspec.open(str(url), "w", **(storage_options or {})) as f:
        f.write(text)


def load(url: str, storage_options: dict | None = None) -> Any:
    """The fitted workflow saved at ``url``."""
    import fsspec

    try:
        with fsspec.open(str(url), "r", **(storage_options or {})) as f:
            doc = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{url} is not a workflow file (not JSON: {exc}); fit and save one") from exc
    return from_json(doc, str(url))


def _source_kinds(source: Any) -> dict[str, str]:
    """Kind of each column a source holds, where its schema tells (Parquet), else ``{}``."""
    from dask_windows.workflow.fit import column_kind

    kinds: dict[str, str] = {}
    for schema in getattr(source, "_schemas", None) or []:
        for field in schema:
            kinds.setdefault(field.name, column_kind(field.type))
    return kinds


def check_source(wf: Any, source: Any) -> None:
    """Raise if ``source`` lacks a column ``wf`` reads or holds it with another kind; warn on other files."""
    names = set(source.column_names())
    kinds = _source_kinds(source)
    for col, kind in (wf.schema or {}).items():
        if col not in names:
            raise SchemaError(
                f"column {col!r}, which the workflow was fitted on, is not in {source.description}; columns: "
                f"{sorted(map(str, names))}; use the data the workflow was fitted on, or refit it on this data"
            )
        have = kinds.get(col)
        if have is not None and have != kind and {have, kind} != {"number", "bool"}:
            raise SchemaError(
                f"column {col!r} of {source.description} is {have}, but the workflow was fitted on {kind} values; "
                "refit the workflow on this data (dask-windows fit) or convert the column"
            )
    files = getattr(source, "files", None)
    footers = getattr(source, "_footers", None)
    if wf.fingerprint and files and footers:
        sizes = [(p, int(footers[p].size)) for p in files]
        if digest(sorted(sizes)) != wf.fingerprint["digest"]:
            warnings.warn(
                f"the workflow was fitted on other files ({wf.fingerprint['files']} files) than {source.description} "
                f"({len(files)} files) with the same columns; its statistics may not describe these; refit if they "
                "should",
                UserWarning,
                stacklevel=4,
            )
