"""The dataset index: every file's footer, identity, row groups and series runs in one object.

Opening a Parquet dataset reads each file's footer: one request per object,
and every rank of a job makes them all. ``dask-windows index PATH`` (and
``convert``) writes ``_dask_windows_index.dwi`` beside the files: per file its
path, size and version (ETag on an object store, ``mtime`` in ns on local
disk, as ``identity`` records them), the rows and uncompressed bytes of each
row group, the series runs of the column it was written for, and the footer
cut down to what reading needs (``footer_compact``: about 200 bytes per column
chunk instead of 600-900; each schema's ``ARROW:schema`` kept once). The index
is itself a Parquet file (one row per data file), so it is compressed and read
by one request.

Opening with an index (found beside the data, or ``index=PATH``) costs the
listing and that one read, instead of one read per file. The index is a copy
of facts the files hold, so it is checked against what is there before it is
trusted: a file listed but not indexed, indexed but gone, or of another size
or version than indexed raises ``DataError`` naming the file and the remedy
(write the index again, or ``index=False``). On local disk each file's
``stat`` is compared (microseconds per file); on an object store the listing's
size and ETag (no request more). Reads check identities as without an index.

The trade-off: the index holds only the compact footer, so a reader that
wanted min/max statistics would not find them here (the loader uses none after
open); and a rewrite that keeps a file's size and version is not seen, as
without an index.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import DataError
from dask_windows.sources.identity import FileIdentity, FooterDigest
from dask_windows.sources.parquet.footer_compact import compact_footer, with_key_values
from dask_windows.sources.parquet.footers import Footer, metadata_from_bytes

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "IndexedFooter",
    "entries_bytes",
    "find_index",
    "footer_digest",
    "is_index",
]

log = logging.getLogger("dask_windows.sources.parquet")

INDEX_NAME = "_dask_windows_index.dwi"
INDEX_FORMAT = "dask_windows.index"
INDEX_VERSION = 1
_META_KEY = b"dask_windows.index"


class IndexedFooter(Footer):
    """A ``Footer`` from an index: the compact footer, its schema's key-value field put back on parse,
    and the hash of the file's own footer (the resume fingerprint stays that of an open without index)."""

    __slots__ = ("digest", "key_values")

    def __init__(self, raw: bytes, size: int, rows: tuple[int, ...], digest: bytes, key_values: bytes) -> None:
        super().__init__(raw, size, rows)
        self.digest, self.key_values = digest, key_values

    @property
    def metadata(self) -> Any:
        return metadata_from_bytes(with_key_values(self.raw, self.key_values))

    def __reduce__(self) -> tuple:
        return IndexedFooter, (self.raw, self.size, self.rows, self.digest, self.key_values)


def footer_digest(footer: Footer) -> FooterDigest:
    """SHA-256 of a file's own serialized footer (also for an ``IndexedFooter``), for ``identity.digest``."""
    return FooterDigest(footer.digest if isinstance(footer, IndexedFooter) else hashlib.sha256(footer.raw).digest())


# -- writing ---------------------------------------------------------------------------------------


def entries_bytes(
    files: Sequence[str],
    root: str,
    footers: Sequence[Footer],
    identities: Sequence[FileIdentity | None],
    schema_numbers: Sequence[int],
    schemas: Sequence[Any],
    runs: Sequence[Any],
    series: str | None,
    local: bool,
    compact: bool,
) -> bytes:
    """The index of ``files`` as Parquet bytes (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prefix = root.rstrip("/") + "/" if root else ""
    key_values: list[str | None] = [None] * len(schemas)
    columns: dict[str, list] = {k: [] for k in ("path", "size", "version", "rows", "group_bytes", "footer", "digest")}
    columns.update(schema=[])
    told_runs: list = []
    for path, footer, ident, number, told in zip(files, footers, identities, schema_numbers, runs):
        meta = metadata_from_bytes(footer.raw) if not isinstance(footer, IndexedFooter) else footer.metadata
        if compact and key_values[number] is None:
            arrow = (meta.metadata or {}).get(b"ARROW:schema")
            key_values[number] = "" if arrow is None else base64.b64encode(arrow).decode()
        if prefix and not path.startswith(prefix):
            raise ValueError(f"{path} is not under {root}: an index holds the files of one folder or prefix")
        columns["path"].append(path[len(prefix) :])
        columns["size"].append(footer.size if ident is None or ident.size is None else ident.size)
        columns["version"].append(None if ident is None or ident.version is None else str(ident.version))
        columns["rows"].append(list(footer.rows))
        columns["group_bytes"].append([meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)])
        columns["footer"].append(
            compact_footer(footer.raw) if compact and not isinstance(footer, IndexedFooter) else footer.raw
        )
        columns["digest"].append(bytes(footer_digest(footer)))
        columns["schema"].append(number)
        told_runs.append(_runs_arrays(told))
        del meta
    _runs_columns(told_runs, columns)
    key_dtype = next((r[3] for r in told_runs if r is not None and r[3] is not None), None)
    header = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "root": root,
        "series": series,
        "key_dtype": key_dtype,
        "local": local,
        "compact": compact,
        "schemas": [base64.b64encode(s.serialize().to_pybytes()).decode() for s in schemas],
        "key_values": [k or "" for k in key_values],
    }
    types = {
        "path": pa.string(),
        "size": pa.int64(),
        "version": pa.string(),
        "rows": pa.list_(pa.int64()),
        "group_bytes": pa.list_(pa.int64()),
        "footer": pa.binary(),
        "digest": pa.binary(),
        "schema": pa.int32(),
        "run_starts": pa.list_(pa.int64()),
        "run_lengths": pa.list_(pa.int64()),
        "run_keys": pa.list_(pa.int64()),
    }
    arrays = {k: v if k == "run_keys_any" else pa.array(v, type=types[k]) for k, v in columns.items()}
    table = pa.table(arrays)
    table = table.replace_schema_metadata({_META_KEY: json.dumps(header).encode()})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", row_group_size=1 << 20)
    return out.getvalue()


def _runs_arrays(told: Any) -> tuple | None:
    """``(starts, lengths, keys, key dtype)`` of runs told at open: int64 keys and their dtype when the keys
    are integers, else the keys as they are and ``None``."""
    if told is None:
        return None
    if len(told) == 2:  # packed: ((3, R) int64, key dtype)
        packed, dtype = told
        return packed[0], packed[1], packed[2], np.dtype(dtype).str
    starts, lengths, keys = told
    keys = np.asarray(keys)
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    if keys.dtype.kind in "iu" and keys.dtype.itemsize <= 8:
        return starts, lengths, keys.astype(np.int64), keys.dtype.str
    return starts, lengths, keys, None


def _runs_columns(told: list, columns: dict) -> None:
    """The runs' columns of the index: ``run_keys`` (int64) when every file's keys are integers, else
    ``run_keys_any`` (a list of the keys' Arrow type: strings, floats, dates...); files whose keys
    differ in kind from the others', or that Arrow cannot hold, get no runs (scanned at open)."""
    import pyarrow as pa

    integer = [r is not None and r[3] is not None for r in told]
    other = [r is not None and r[3] is None for r in told]
    if any(other) and not any(integer):
        try:
            keys = pa.array([None if r is None else r[2] for r in told])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            told = [None] * len(told)
        else:
            if not pa.types.is_list(keys.type) and not pa.types.is_null(keys.type):
                told = [None] * len(told)
            else:
                columns["run_keys_any"] = keys
    if any(other) and any(integer):
        told = [r if k else None for r, k in zip(told, integer)]
    columns["run_starts"] = [None if r is None else r[0].tolist() for r in told]
    columns["run_lengths"] = [None if r is None else r[1].tolist() for r in told]
    columns["run_keys"] = [None if r is None or r[3] is None else r[2].tolist() for r in told]


def is_index(blob: bytes) -> bool:
    """Whether ``blob`` is an index this library wrote."""
    try:
        _header(_read_table(blob))
    except Exception:
        return False
    return True


# -- reading ---------------------------------------------------------------------------------------


def _read_table(blob: bytes) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(blob))


def _header(table: Any) -> dict:
    meta = table.schema.metadata or {}
    if _META_KEY not in meta:
        raise DataError("not a dask_windows index (no index header)")
    header = json.loads(meta[_META_KEY])
    if header.get("format") != INDEX_FORMAT or header.get("version") != INDEX_VERSION:
        raise DataError(
            f"an index of format {header.get('format')!r} version {header.get('version')!r}, not {INDEX_VERSION}"
        )
    return header


def find_index(fs: Any, data: Any, index: Any) -> tuple[str, bytes] | None:
    """``(index path, its bytes)`` for ``index=`` (``None``: the one beside ``data``, if any; ``False``:
    none; a path: that one, which must exist), read in one request."""
    if index is False:
        return None
    if index is None or index is True:
        if not isinstance(data, (str, os.PathLike)) or any(ch in os.fspath(data) for ch in "*?["):
            if index is True:
                raise ValueError("index=True needs a folder or prefix; pass index=PATH for a glob or a list of files")
            return None
        path = posixpath.join(fs._strip_protocol(os.fspath(data)).rstrip("/"), INDEX_NAME)
        if not fs.exists(path):  # answered from the listing's cache on an object store
            if index is True:
                raise FileNotFoundError(
                    f"no dataset index at {path}; write one with `dask-windows index {os.fspath(data)}`"
                )
            return None
        return path, fs.cat_file(path)
    import fsspec

    index_fs, path = fsspec.core.url_to_fs(os.fspath(index), **getattr(fs, "storage_options", {}))
    try:
        return path, index_fs.cat_file(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"index={os.fspath(index)!r} does not exist; write it with `dask-windows index`"
        ) from exc
