"""The dataset index: every file's footer, identity, row groups and series runs in one file.

``dask-windows index PATH`` (and ``convert``) writes ``_dask_windows_index.dwi`` beside the files: a
Parquet file of one row per data file (path relative to the index's folder, size, version, rows and
bytes of each row group, series runs, the footer compacted by ``footer_compact``), whose SHA-256 sits
in its own footer (``_SUM_KEY``) and is checked before any byte is parsed. An index of format 1 is
warned about beside the data and raises when named with ``index=``. It holds no min/max statistics,
and a rewrite keeping a file's size and version is not seen (as without an index)."""

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
from dask_windows.sources.parquet.footers import Footer, folder_of, metadata_from_bytes, pack_runs

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "IndexDamaged",
    "IndexedFooter",
    "OldIndex",
    "entries_bytes",
    "find_index",
    "footer_digest",
    "is_index",
    "table_bytes",
    "verify_checksum",
]

log = logging.getLogger("dask_windows.sources.parquet")

INDEX_NAME = "_dask_windows_index.dwi"
INDEX_FORMAT = "dask_windows.index"
INDEX_VERSION = 2  # 2: a checksum of the whole file, paths relative to the index's folder
_META_KEY = b"dask_windows.index"
#: The key of the index's checksum in its Parquet footer: SHA-256 (hex) of the whole file with the value
#: itself written as 64 zeros. It follows its key in the Thrift bytes as a binary field of 64 bytes.
_SUM_KEY = b"dask_windows.index.sha256"
_SUM_MARK = _SUM_KEY + b"\x18\x40"  # field 2 (value), binary; length 64
_SUM_ZEROS = b"0" * 64
_LIST = "list of int64"
#: The index's columns and their Arrow types (``_LIST``: a list of int64).
_COLUMN_TYPES = {
    "path": "string",
    "size": "int64",
    "version": "string",
    "rows": _LIST,
    "group_bytes": _LIST,
    "footer": "binary",
    "digest": "binary",
    "schema": "int32",
    "run_starts": _LIST,
    "run_lengths": _LIST,
    "run_keys": _LIST,
}


class IndexedFooter(Footer):
    """A ``Footer`` from an index: the compact footer (its schema's key-value field put back on parse) and
    the digest of the file's own footer, so the resume fingerprint is that of an open without index."""

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
    base: str | None = None,
    manifest: bool = True,
) -> bytes:
    """The index of ``files`` (under the folder or prefix ``root``) as Parquet bytes; ``base``: the folder it
    is written to, which the root is made relative to (``None``: kept); ``manifest``: whether the folder
    holds a ``convert`` manifest."""
    import pyarrow as pa

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
        "root": root if base is None else (posixpath.relpath(root or "/", base or "/") if root else root),
        "relative": base is not None and bool(root),
        "files": len(columns["path"]),
        "manifest": manifest,
        "series": series,
        "key_dtype": key_dtype,
        "local": local,
        "compact": compact,
        "schemas": [base64.b64encode(s.serialize().to_pybytes()).decode() for s in schemas],
        "key_values": [k or "" for k in key_values],
    }
    types = {k: pa.list_(pa.int64()) if v == _LIST else pa.type_for_alias(v) for k, v in _COLUMN_TYPES.items()}
    arrays = {k: v if k == "run_keys_any" else pa.array(v, type=types[k]) for k, v in columns.items()}
    table = pa.table(arrays)
    return table_bytes(table, header)


def table_bytes(table: Any, header: dict) -> bytes:
    """``table`` with ``header`` as an index file: Parquet, zstd, its checksum written in its footer."""
    import pyarrow.parquet as pq

    table = table.replace_schema_metadata({_META_KEY: json.dumps(header).encode(), _SUM_KEY: _SUM_ZEROS})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", row_group_size=1 << 20)
    blob = bytearray(out.getvalue())
    at = blob.rfind(_SUM_MARK + _SUM_ZEROS) + len(_SUM_MARK)
    assert at >= len(_SUM_MARK), "the index's checksum field was not found in its footer"
    blob[at : at + 64] = _checksum(blob, at).encode()
    return bytes(blob)


def _checksum(blob: bytes | bytearray, at: int) -> str:
    """SHA-256 (hex) of ``blob`` with its 64 bytes at ``at`` (the checksum's value) taken as zeros."""
    view = memoryview(blob)
    digest = hashlib.sha256(view[:at])
    digest.update(_SUM_ZEROS)
    digest.update(view[at + 64 :])
    return digest.hexdigest()


class IndexDamaged(DataError):
    """The bytes of an index are not the ones written (its checksum or a bound on a number failed)."""


class OldIndex(DataError):
    """An index of an earlier format (no checksum, absolute root): written again, it opens."""


def verify_checksum(blob: bytes) -> None:
    """Raise ``OldIndex`` (format 1) or ``IndexDamaged`` unless ``blob`` is an index whose checksum matches;
    nothing is parsed before (a damaged footer can abort pyarrow)."""
    at = blob.rfind(_SUM_MARK)
    if at < 0:
        tail = blob[-(1 << 20) :]  # format 1 had no checksum; a format-2 index whose checksum key is damaged is not one
        if _META_KEY in tail and b'"version": 1,' in tail and b'"version": 2,' not in tail and blob[-4:] == b"PAR1":
            raise OldIndex("an index of an earlier format (no checksum, absolute paths)")
        raise IndexDamaged("not a dask_windows index, or damaged (no index checksum in it)")
    at += len(_SUM_MARK)
    stored = bytes(blob[at : at + 64])
    if len(stored) != 64 or _checksum(blob, at).encode() != stored:
        raise IndexDamaged(f"its checksum does not match its bytes (damaged or truncated; {len(blob):,} bytes)")


def _runs_arrays(told: Any) -> tuple | None:
    """``(starts, lengths, keys, key dtype)`` of runs told at open: int64 keys and their dtype when the keys
    are integers, else the keys as they are and ``None``."""
    if told is None:
        return None
    told = pack_runs(told)
    if len(told) == 2:  # packed: ((3, R) int64, key dtype)
        packed, dtype = told
        return packed[0], packed[1], packed[2], np.dtype(dtype).str
    starts, lengths, keys = told
    return np.asarray(starts, np.int64), np.asarray(lengths, np.int64), np.asarray(keys), None


def _runs_columns(told: list, columns: dict) -> None:
    """The runs' columns: ``run_keys`` (int64) when every file's keys are integers, else ``run_keys_any``
    (their Arrow type); files of keys of another kind, or that Arrow cannot hold, get none."""
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
    """Whether ``blob`` is an index this library wrote, of any format, damaged or not (only its key is sought)."""
    return blob[-4:] == b"PAR1" and (_SUM_MARK in blob[-(1 << 20) :] or _META_KEY in blob[-(1 << 20) :])


# -- reading ---------------------------------------------------------------------------------------


def _read_table(blob: bytes) -> Any:
    """The index's table, its checksum verified first, one chunk per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    verify_checksum(blob)
    return pq.ParquetFile(pa.BufferReader(blob)).read()


def _header(table: Any) -> dict:
    """The index's header, each field checked for its type (``IndexDamaged`` otherwise)."""
    meta = table.schema.metadata or {}
    if _META_KEY not in meta:
        raise IndexDamaged("not a dask_windows index (no index header)")
    header = json.loads(meta[_META_KEY])
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise IndexDamaged(f"not a dask_windows index (format {header.get('format')!r})")
    if header.get("version") != INDEX_VERSION:
        raise OldIndex(f"an index of version {header.get('version')!r}, not {INDEX_VERSION}")
    kinds = {"root": str, "relative": bool, "files": int, "local": bool, "compact": bool, "schemas": list}
    kinds.update(key_values=list)
    for key, kind in kinds.items():
        if not isinstance(header.get(key), kind):
            raise IndexDamaged(f"its header's {key!r} is not a {kind.__name__}")
    for key in ("series", "key_dtype"):
        if header.get(key) is not None and not isinstance(header[key], str):
            raise IndexDamaged(f"its header's {key!r} is not text")
    if len(header["key_values"]) != len(header["schemas"]) or header["files"] != table.num_rows:
        raise IndexDamaged("its header does not match its rows")
    if header["key_dtype"] is not None and np.dtype(header["key_dtype"]).kind not in "iu":
        raise IndexDamaged(f"its series keys' dtype {header['key_dtype']!r} is not an integer type")
    return header


def find_index(fs: Any, data: Any, index: Any) -> tuple[str, bytes] | None:
    """``(index path, its bytes)`` for ``index=`` (``None``: the one beside ``data``, if any; ``False``:
    none; a path: that one, which must exist)."""
    if index is False:
        return None
    if index is None or index is True:
        root = folder_of(fs, data)
        if root is None:
            if index is True:
                raise ValueError("index=True needs a folder or prefix; pass index=PATH for a glob or a list of files")
            return None
        path = posixpath.join(root, INDEX_NAME)
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
