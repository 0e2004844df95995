"""A fitted workflow as a small, versioned JSON file, written and read through fsspec.

It holds the operations (arguments and fitted state; a ``Function`` by its import name), roles, series
ids, static rows, the input schema, a fingerprint of the files fitted on and (version 2) a SHA-256
checksum. A file edited, damaged or of a version not read here is refused at load, naming the file;
``check_source`` raises on another schema, naming the column, and warns when only the files differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any

from dask_windows.errors import ConfigError, SchemaError

__all__ = [
    "FORMAT",
    "READ_VERSIONS",
    "VERSION",
    "check_source",
    "check_zones",
    "checksum",
    "digest",
    "from_json",
    "list_files",
    "load",
    "save",
    "to_json",
]

FORMAT = "dask-windows-workflow"
VERSION = 2  # 2: a checksum of the content; 1 (no checksum) still loads
READ_VERSIONS = (1, 2)


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
        from dask_windows.errors.remedies import no_parquet_remedy

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
        "time": {"column": wf.time, "freq": wf.freq, "missing_timesteps": wf.missing_timesteps},
        "roles": {r: list(getattr(wf, r)) for r in ("continuous", "categorical", "target", "known")},
        "ops": [{"kind": op.kind, "config": op.config(), "state": op.state} for op in wf.ops],
        "statics": None if st is None else {"config": st.config(), "state": st.state},
        "series_keys": wf.series_keys,
        "schema": wf.schema,
        "fingerprint": wf.fingerprint,
    }


def checksum(doc: dict) -> str:
    """A SHA-256 of an artifact's content (every field but ``"checksum"``, keys sorted)."""
    content = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def from_json(doc: dict, where: str = "the workflow", fitted: bool = True) -> Any:
    """The fitted ``Workflow`` of an artifact's content (``fitted=False``: a spec's, unfitted, unchecked).

    Raises:
        ConfigError: Not a workflow file, a version this library does not read, a checksum that
            does not match the content (the file was edited), or a field that is not what a fit
            writes; each names the file and says to refit.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{where} is not a dask-windows workflow file (no format {FORMAT!r}); fit and save one")
    version = doc.get("version")
    if version not in READ_VERSIONS:
        newer = isinstance(version, int) and version > VERSION
        raise ConfigError(
            f"{where} is a workflow file of version {version!r}; this dask_windows reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}: "
            + ("upgrade dask_windows to read it, or " if newer else "")
            + "refit it with this version (dask-windows fit)"
        )
    if fitted and version >= 2 and doc.get("checksum") != checksum(doc):
        raise ConfigError(
            f"{where} was changed after it was saved: its checksum does not match its content (a fitted statistic, "
            "vocabulary or setting was edited, or the file is damaged); refit and save it again (dask-windows fit) "
            "rather than editing it"
        )
    try:
        wf = _workflow(doc, fitted)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ConfigError):
            raise ConfigError(f"{where}: {exc}") from exc
        raise ConfigError(
            f"{where} is not a workflow file this dask_windows can read ({type(exc).__name__}: {exc}); refit and "
            "save it again (dask-windows fit)"
        ) from exc
    return wf


def _workflow(doc: dict, fitted: bool) -> Any:
    from dask_windows.workflow.core import Statics, Workflow
    from dask_windows.workflow.ops import op_from_json

    statics = None
    if doc.get("statics"):
        statics = Statics(None, **doc["statics"]["config"])
        statics.state = doc["statics"]["state"]
    time = doc.get("time") or {}  # (version 1 has none)
    wf = Workflow([op_from_json(e) for e in doc["ops"]], series=doc["series"], statics=statics, **doc["roles"],
                  time=time.get("column"), freq=time.get("freq"), missing_timesteps=time.get("missing_timesteps", "raise"))  # fmt: skip
    wf.series_keys, wf.schema, wf.fingerprint = doc["series_keys"], doc["schema"], doc.get("fingerprint")
    if not fitted:
        return wf
    if not isinstance(wf.series_keys, list) or not isinstance(wf.schema, dict):
        raise ValueError("series_keys must be a list and schema a dict")
    for op in wf.ops:
        op.check_state(len(wf.series_keys))
    if statics is not None:
        _check_statics(statics, len(wf.series_keys))
    return wf


def _check_statics(st: Any, num_series: int) -> None:
    state = st.state
    if not isinstance(state, dict):
        raise ValueError("statics has no fitted state")
    for name, rows in zip((*st.numeric, *st.categorical), (*state["numeric"], *state["categorical"])):
        if len(rows) != num_series:
            raise ValueError(f"static column {name!r} has {len(rows)} rows for {num_series} series")
    for name, codes in zip(st.categorical, state["categorical"]):
        size = len(state["vocabulary"][name]) + 2
        if any(not isinstance(c, int) or not 0 <= c < size for c in codes):
            raise ValueError(f"static column {name!r} has codes outside its vocabulary (0..{size - 1})")


def save(wf: Any, url: str, storage_options: dict | None = None) -> None:
    """Write ``wf`` as JSON to ``url`` (local path or fsspec URL)."""
    import fsspec

    doc = to_json(wf)
    doc["checksum"] = checksum(doc)
    text = json.dumps(doc, indent=1, allow_nan=True)
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


def _source_zones(source: Any) -> dict[str, str | None]:
    """The time zone of each timestamp column of ``source`` (``None``: naive), where its schema tells."""
    from dask_windows.workflow.fit import column_kind

    zones: dict[str, str | None] = {}
    schemas = list(getattr(source, "_schemas", None) or [])
    if getattr(source, "schema", None) is not None and hasattr(source.schema, "names"):
        schemas.append(source.schema)  # an Arrow table or pandas frame
    for schema in schemas:
        for field in schema:
            if str(field.type).startswith("timestamp"):
                zones.setdefault(field.name, getattr(field.type, "tz", None) or None)
    dtypes = getattr(getattr(source, "ddf", None), "dtypes", None)  # a Dask frame
    for name, dtype in dtypes.items() if dtypes is not None else ():
        if column_kind(dtype) == "datetime":
            zones.setdefault(str(name), str(getattr(dtype, "tz", None) or "") or None)
    return zones


def check_zones(wf: Any, zones: dict[str, str | None], where: str) -> None:
    """Raise when a ``TimeFeatures`` column is stored with another time zone (or none) than the fit saw.

    Arrow hands a zoned column over as UTC instants and a naive one as wall times; the fit recorded
    which it was, so a change would shift every calendar field by the zone's offset, silently.
    """
    from dask_windows.workflow.ops import TimeFeatures

    for op in wf.ops:
        col = op.columns[0]
        if not isinstance(op, TimeFeatures) or op.state is None or col not in zones:
            continue
        fitted, have = op.state.get("stored_tz"), zones[col]
        if fitted == have or (fitted and have and op.tz):  # instants both ways, taken in ``op.tz``
            continue

        def say(zone: str | None) -> str:
            return f"with time zone {zone!r}" if zone else "naive (no time zone)"

        remedy = (
            f"localize it as the fit saw it (pandas: frame[{col!r}].dt.tz_localize({fitted!r}))"
            if fitted and not have
            else f"store it as the fit saw it (pandas: frame[{col!r}].dt.tz_localize(None) on wall times)"
            if have and not fitted
            else f"convert it to the fitted zone (pandas: frame[{col!r}].dt.tz_convert({fitted!r}))"
        )
        raise SchemaError(
            f"TimeFeatures column {col!r} of {where} is stored {say(have)}, but the workflow was fitted on it "
            f"stored {say(fitted)}: its calendar fields would shift by the zones' offset; {remedy}, or refit the "
            "workflow on this data"
        )


def check_source(wf: Any, source: Any) -> None:
    """Raise if ``source`` lacks a column ``wf`` reads or holds it with another kind (or a timestamp with
    another time zone); warn on other files."""
    names = set(source.column_names())
    kinds = _source_kinds(source)
    check_zones(wf, _source_zones(source), source.description)
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
