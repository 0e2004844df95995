"""Input readers for ``convert`` and ``stats``: Parquet, CSV, Avro and ``.npy`` files, each format one
lazy Dask DataFrame in file order (Dask's DataFrame layer imported only by :func:`read_inputs`)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pandas as pd

from dask_windows.errors import ConfigError, DataError, SchemaError

if TYPE_CHECKING:
    import dask.dataframe as dd

__all__ = ["FORMATS", "PARSED", "file_schemas", "list_inputs", "read_inputs", "schema_mismatch", "time_parsing"]

FORMATS = ("parquet", "csv", "avro", "npy")
_EXTENSIONS = {
    "parquet": (".parquet", ".parq", ".pq"),
    "csv": (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".tsv"),
    "avro": (".avro",),
    "npy": (".npy",),
}
PARSED = "timestamp (parsed)"  # the one type every parsed time column gets in ``time_parsing``


def _format_of(path: str) -> str | None:
    return next((f for f, exts in _EXTENSIONS.items() if path.lower().endswith(exts)), None)


def list_inputs(srcs: Sequence[str], fmt: str | None, storage_options: dict | None = None) -> tuple[str, list[str]]:
    """``(fmt, urls)``: files, folders (searched recursively, skipping ``_`` and ``.`` names) and globs
    expanded into sorted input file URLs, and the format (``None``: from the extensions)."""
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    wanted = _EXTENSIONS[fmt] if fmt else sum(_EXTENSIONS.values(), ())
    urls: list[str] = []
    for src in srcs:
        fs, path = fsspec.core.url_to_fs(src, **(storage_options or {}))
        if fs.isdir(path):
            found = [
                p
                for p in fs.find(path)
                if p.lower().endswith(wanted)
                and not any(part.startswith(("_", ".")) for part in posixpath.relpath(p, path).split("/"))
            ]
        elif any(c in path for c in "*?["):
            found = fs.glob(path)
        elif fs.exists(path):
            found = [path]
        else:
            raise FileNotFoundError(f"input {src} does not exist; check the path")
        if not found:
            raise FileNotFoundError(f"no input files ({', '.join(wanted)}) in {src}; check the path or pass --format")
        local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        urls += [p if local else fs.unstrip_protocol(p) for p in sorted(found)]
    if fmt is None:
        formats = {_format_of(u) for u in urls}
        if None in formats:
            odd = next(u for u in urls if _format_of(u) is None)
            raise ConfigError(
                f"cannot tell the format of {odd} from its name; pass --format with one of {', '.join(FORMATS)}"
            )
        if len(formats) > 1:
            raise ConfigError(
                f"inputs mix formats {sorted(formats)}; convert one format "  # type: ignore[type-var]
                f"at a time or pass --format"
            )
        fmt = formats.pop()
    return fmt, urls  # type: ignore[return-value]


def _parquet_schema(url: str, storage_options: dict | None) -> dict[str, str]:
    """The footer's column types, pandas' index columns left out."""
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        schema = pq.read_schema(src)
    return {f.name: str(f.type) for f in schema if not f.name.startswith("__index_level_")}


def _csv_schema(url: str, storage_options: dict | None) -> dict[str, str]:
    """Column types pyarrow infers from the first MiB of one CSV file (decompressed)."""
    import pyarrow.csv as pacsv

    sep = "\t" if url.lower().endswith(".tsv") else ","
    with fsspec.open(url, "rb", compression="infer", **(storage_options or {})) as src:
        try:
            reader = pacsv.open_csv(
                src, read_options=pacsv.ReadOptions(block_size=2**20), parse_options=pacsv.ParseOptions(delimiter=sep)
            )
        except Exception as exc:  # empty file, bad quoting, ...: named with the file
            raise DataError(f"cannot read {url} as CSV ({exc}); check the file or --format") from exc
        return {f.name: str(f.type) for f in reader.schema}


def file_schemas(
    urls: Sequence[str], fmt: str, storage_options: dict | None = None, threads: int = 16
) -> list[dict[str, str]]:
    """Each input file's column types (a CSV file's from its first MiB); none for ``.npy``."""
    from concurrent.futures import ThreadPoolExecutor

    one = {"parquet": _parquet_schema, "csv": _csv_schema, "avro": _avro_dtypes}.get(fmt)
    if one is None or not urls:
        return []
    with ThreadPoolExecutor(min(threads, len(urls))) as pool:
        return list(pool.map(one, urls, [storage_options] * len(urls)))


def _same_type(a: str | None, b: str | None) -> bool:
    return a == b or "null" in (a, b)  # a CSV column empty in the sampled rows fits any type


def schema_mismatch(urls: Sequence[str], schemas: Sequence[dict[str, str]], remedy: str | None = None) -> str | None:
    """The message listing how the inputs' schemas differ, or ``None`` when they agree."""
    if len(schemas) < 2:
        return None
    first = schemas[0]
    names = list(dict.fromkeys(n for s in schemas for n in s))
    differing = [n for n in names if any(n not in s or not _same_type(s[n], first.get(n)) for s in schemas)]
    if not differing:
        return None
    groups: dict[tuple, list[str]] = {}
    for url, schema in zip(urls, schemas):
        groups.setdefault(tuple(schema.get(n, "-") for n in differing), []).append(url)
    lines = []
    for key, members in groups.items():
        more = f" (and {len(members) - 1} more like it)" if len(members) > 1 else ""
        cols = ", ".join(f"{n}: {t}" for n, t in zip(differing, key))
        lines.append(f"  {members[0]}{more}: {cols}")
    advice = remedy or (
        "rewrite the files with the same columns and types (e.g. cast in pandas and save "
        "again), or convert each group of files separately"
    )
    return (
        "the inputs do not share one schema; these columns differ (- means missing):\n"
        + "\n".join(lines)
        + f"\nnothing was converted: {advice}"
    )


def _avro_dtype(avro_type: Any) -> str:
    """The pandas dtype a column of this Avro type becomes."""
    nullable = isinstance(avro_type, list) and "null" in avro_type
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        if len(rest) != 1:
            return "object"
        avro_type = rest[0]
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType", "")
        if logical in ("timestamp-millis", "timestamp-micros"):
            return "datetime64[us, UTC]"
        if logical in ("local-timestamp-millis", "local-timestamp-micros"):
            return "datetime64[us]"
        avro_type = avro_type.get("type") if not logical else None
    simple = {
        "int": ("int64", "Int64"),
        "long": ("int64", "Int64"),
        "float": ("float32", "float32"),
        "double": ("float64", "float64"),
        "boolean": ("bool", "boolean"),
        "string": ("str", "str"),
    }
    return simple[avro_type][nullable] if avro_type in simple else "object"


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError as exc:
        raise ImportError('reading Avro needs fastavro: pip install "dask_windows[avro]"') from exc
    return fastavro


def _avro_dtypes(url: str, storage_options: dict | None) -> dict[str, str]:
    fastavro = _fastavro()
    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        schema = fastavro.reader(src).writer_schema
    return {field["name"]: _avro_dtype(field["type"]) for field in schema["fields"]}


def _read_avro(url: str, dtypes: dict[str, str], first: str, storage_options: dict | None) -> pd.DataFrame:
    fastavro = _fastavro()
    if url != first and (mine := _avro_dtypes(url, storage_options)) != dtypes:
        raise SchemaError(
            f"{url} has Avro columns {mine} but {first} has {dtypes}; convert files with different schemas separately"
        )
    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        records = list(fastavro.reader(src))
    columns = {}
    for name, dtype in dtypes.items():
        values = [r.get(name) for r in records]
        if dtype.startswith("datetime64"):
            columns[name] = pd.Series(pd.to_datetime(values, utc="UTC" in dtype)).astype(dtype)
        else:
            columns[name] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(columns)


def _npy_header(url: str, storage_options: dict | None) -> tuple[tuple, np.dtype, int, bool]:
    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        version = np.lib.format.read_magic(src)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise DataError(f"{url} is .npy version {version}; save it with numpy.save")
        shape, fortran_order, dtype = read(src)
        offset = src.tell()
    if len(shape) not in (1, 2) or (dtype.names and len(shape) != 1) or dtype.hasobject:
        raise DataError(
            f"{url} holds a {dtype} array of shape {shape}; use (rows,) or "
            f"(rows, columns) arrays of numbers, or a 1-D structured array"
        )
    return shape, dtype, offset, bool(fortran_order) and len(shape) == 2


def _read_npy(part: tuple, names: list[str], series: str, time: str, storage_options: dict | None) -> pd.DataFrame:
    """Rows ``[start, stop)`` of one ``.npy`` file, read without loading the rest."""
    url, start, stop, shape, dtype, offset, fortran = part
    width = shape[1] if len(shape) == 2 else 1
    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        if fortran:  # column-major: each column's rows are contiguous
            columns = []
            for j in range(width):
                src.seek(offset + (j * shape[0] + start) * dtype.itemsize)
                columns.append(np.frombuffer(src.read((stop - start) * dtype.itemsize), dtype))
            data = np.stack(columns, axis=1) if columns else np.empty((0, 0), dtype)
        else:
            src.seek(offset + start * width * dtype.itemsize)
            data = np.frombuffer(src.read((stop - start) * width * dtype.itemsize), dtype=dtype)
    if dtype.names:
        df = pd.DataFrame({name: data[name] for name in dtype.names})
    else:
        df = pd.DataFrame(data.reshape(stop - start, len(names)), columns=names)
    extra = {}
    if series not in df.columns:
        extra[series] = pd.Series([posixpath.basename(url)[:-4]] * len(df), dtype="str")
    if time not in df.columns:
        extra[time] = np.arange(start, stop, dtype=np.int64)
    return pd.concat([pd.DataFrame(extra), df], axis=1) if extra else df


def read_inputs(
    urls: Sequence[str],
    fmt: str,
    *,
    series: str,
    time: str,
    npy_columns: Sequence[str] | None = None,
    blocksize: int = 64 * 2**20,
    storage_options: dict | None = None,
) -> dd.DataFrame:
    """Open input files as one lazy Dask DataFrame, in file order; a ``.npy`` file without a ``series``
    (``time``) column is one series named after the file (time is its row number)."""
    import dask.dataframe as dd

    options = storage_options or {}
    if fmt == "parquet":
        return dd.read_parquet(list(urls), storage_options=options, blocksize=blocksize)
    if fmt == "csv":
        compressed = any(not u.lower().endswith((".csv", ".tsv")) for u in urls)
        sep = "\t" if all(u.lower().endswith(".tsv") for u in urls) else ","
        return dd.read_csv(list(urls), blocksize=None if compressed else blocksize, sep=sep, storage_options=options)
    if fmt == "avro":
        dtypes = _avro_dtypes(urls[0], options)
        meta = pd.DataFrame({n: pd.Series([], dtype=d) for n, d in dtypes.items()})
        return dd.from_map(
            _read_avro, list(urls), dtypes=dtypes, first=urls[0], storage_options=options, meta=meta, label="read-avro"
        )
    if fmt != "npy":
        raise ConfigError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    parts, first = [], None
    for url in urls:
        shape, dtype, offset, fortran = _npy_header(url, options)
        if first is None:
            first = (url, shape[1:], dtype)
        elif (shape[1:], dtype) != first[1:]:
            raise SchemaError(
                f"{url} holds {dtype} rows of shape {shape[1:]} but {first[0]} holds {first[2]} rows of shape "
                f"{first[1]}; every .npy input needs the same columns"
            )
        row_bytes = dtype.itemsize * (shape[1] if len(shape) == 2 else 1)
        step = max(1, blocksize // max(row_bytes, 1))
        parts += [(url, a, min(a + step, shape[0]), shape, dtype, offset, fortran) for a in range(0, shape[0], step)]
    num_columns = 1 if len(first[1]) == 0 else first[1][0]  # type: ignore[index]
    columns = list(npy_columns) if npy_columns else [f"f{i}" for i in range(num_columns)]
    if not first[2].names and len(columns) != num_columns:  # type: ignore[index]
        raise ConfigError(
            f"{len(columns)} column names given for .npy arrays with "
            f"{num_columns} columns; pass exactly {num_columns} names"
        )
    if not parts:
        raise DataError(f"the .npy inputs ({urls[0]}, ...) have no rows")
    meta = _read_npy((parts[0][0], 0, 0, *parts[0][3:]), columns, series, time, options)
    return dd.from_map(
        _read_npy, parts, names=columns, series=series, time=time, storage_options=options, meta=meta, label="read-npy"
    )


def time_parsing(
    fmt: str, schemas: Sequence[dict[str, str]], time: str, parse_time: bool | str
) -> tuple[list[dict[str, str]], bool | str, str | None]:
    """``(schemas, parsing, remedy)``: the CSV schemas with the time column settled (any date or
    timestamp kind Arrow infers per file is one parsed type), how to parse it (``False``, ``True``
    or ``"utc"``) and the advice where it still differs between files."""
    if fmt != "csv" or not schemas:
        return list(schemas), parse_time, None
    kinds = [s[time] for s in schemas if s.get(time, "null") != "null"]
    settled = [{n: (PARSED if n == time else t) for n, t in s.items()} for s in schemas]
    if parse_time:
        return settled, parse_time, None
    if not kinds or not all(k.startswith(("timestamp", "date")) for k in kinds):
        remedy = f"pass --parse-time to parse column {time!r} of every file with pandas.to_datetime"
        return list(schemas), False, remedy if len(set(kinds)) > 1 else None
    zoned = {"tz=" in k for k in kinds}
    if len(zoned) > 1:
        remedy = (
            f"column {time!r} has UTC offsets in some files and none in others; write every "
            f"time with an offset (or none) and convert again"
        )
        return list(schemas), True, remedy
    return settled, "utc" if zoned.pop() else True, None
