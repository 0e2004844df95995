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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dask_windows.errors import DataError
from dask_windows.sources.identity import FileIdentity, FooterDigest
from dask_windows.sources.parquet.footer_compact import compact_footer, key_values_field, with_key_values
from dask_windows.sources.parquet.footers import Footer, metadata_from_bytes, split_sizes

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "IndexedFooter",
    "entries_bytes",
    "find_index",
    "footer_digest",
    "is_index",
    "opened_from_index",
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
    columns.update(schema=[], run_starts=[], run_lengths=[], run_keys=[])
    key_dtype: str | None = None
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
        arrays = _int_runs(told)
        if arrays is not None:
            key_dtype = key_dtype or arrays[3]
        for name, values in zip(("run_starts", "run_lengths", "run_keys"), arrays[:3] if arrays else (None,) * 3):
            columns[name].append(None if values is None else values.tolist())
        del meta
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
    table = pa.table({k: pa.array(v, type=types[k]) for k, v in columns.items()})
    table = table.replace_schema_metadata({_META_KEY: json.dumps(header).encode()})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", row_group_size=1 << 20)
    return out.getvalue()


def _int_runs(told: Any) -> tuple | None:
    """``(starts, lengths, keys, key dtype)`` as int64 arrays of runs told at open, when the keys are integers."""
    if told is None:
        return None
    if len(told) == 2:  # packed: ((3, R) int64, key dtype)
        packed, dtype = told
        return packed[0], packed[1], packed[2], np.dtype(dtype).str
    starts, lengths, keys = told
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu" or keys.dtype.itemsize > 8:
        return None
    return np.asarray(starts, np.int64), np.asarray(lengths, np.int64), keys.astype(np.int64), keys.dtype.str


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


def opened_from_index(
    blob: bytes,
    where: str,
    files: list[str],
    listed: dict,
    local: bool,
    partition_bytes: int,
    series: str | None,
    data_root: str | None,
    url: Callable[[str], str],
    check: bool = True,
) -> dict:
    """Each of ``files`` opened from the index ``blob`` (at ``where``), as ``opening._Opened``.

    Args:
        files: The files listed (full paths, as the filesystem names them).
        listed: The listing's ``info`` entries by path (sizes and versions on an object store).
        data_root: The folder or prefix opened (``None`` for a glob or list): when it is the index's own,
            a file indexed but not listed is reported as deleted.
        url: A path as messages show it.
        check: Compare identities (``False`` for the footers ranks exchange: same listing by construction).

    Raises:
        DataError: The index is stale (a file added, deleted or changed), naming the file.
    """
    import pyarrow as pa

    from dask_windows.sources import identity
    from dask_windows.sources.parquet.opening import _Opened

    try:
        table = _read_table(blob)
        header = _header(table)
    except DataError as exc:
        raise DataError(
            f"{where} is not a readable dataset index ({exc}); write it again with `dask-windows index`"
        ) from exc
    except Exception as exc:
        raise DataError(
            f"{where} is not a readable dataset index ({exc}); write it again with `dask-windows index`"
        ) from exc
    root = header["root"].rstrip("/")
    prefix = root + "/" if root else ""
    rel = table.column("path").to_pylist()
    position = {prefix + p: i for i, p in enumerate(rel)}  # full path -> row

    def stale(path: str, what: str) -> DataError:
        return DataError(
            f"the dataset index {where} is stale: {url(path)} {what}; write the index again "
            f"(`dask-windows index`), or pass index=False to read every footer"
        )

    for path in files:
        if path not in position:
            raise stale(path, "is not in it (added after the index was written)")
    if data_root is not None and data_root == root and len(position) != len(files):
        gone = sorted(set(position) - set(files))
        raise stale(gone[0], f"is in it but not there (deleted; {len(gone)} files in all)")
    schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in header["schemas"]]
    kv_fields = [key_values_field([(b"ARROW:schema", base64.b64decode(k))]) if k else b"" for k in header["key_values"]]
    sizes = table.column("size").to_numpy()
    versions = table.column("version").to_pylist()
    rows = table.column("rows").to_pylist()
    group_bytes = table.column("group_bytes").to_pylist()
    footers = table.column("footer").to_pylist()
    digests = table.column("digest").to_pylist()
    numbers = table.column("schema").to_numpy()
    runs_wanted = series is not None and header.get("series") == series and header.get("key_dtype") is not None
    if runs_wanted:
        key_dtype = np.dtype(header["key_dtype"])
        lists = [table.column(c).combine_chunks() for c in ("run_starts", "run_lengths", "run_keys")]
        offsets = lists[0].offsets.to_numpy()  # (files + 1,) the same for the three columns
        known = lists[0].is_valid().to_numpy(zero_copy_only=False)  # (files,) runs were written
        flat = np.stack([np.asarray(a.values.to_numpy(), np.int64) for a in lists])  # (3, runs of all files)
    opened = {}
    for path in files:
        i = position[path]
        size = int(sizes[i])
        version = versions[i]
        found = None
        if local:
            found = None if version is None else FileIdentity(size, int(version))
            if check and found is not None:
                try:
                    now = identity.local(path)
                except OSError:
                    raise stale(path, "cannot be read (deleted?)") from None
                if now != found:
                    raise stale(path, f"changed (indexed: {found.describe()}; now {now.describe()})")
        elif check:
            now = identity.from_info(listed.get(path))
            if (now.size is not None and now.size != size) or (
                now.version is not None and version is not None and now.version != version
            ):
                raise stale(path, f"changed (indexed: {FileIdentity(size, version).describe()}; now {now.describe()})")
        splits = split_sizes(group_bytes[i], partition_bytes)
        told = None
        if runs_wanted and len(splits) == 1 and known[i]:
            told = (flat[:, offsets[i] : offsets[i + 1]], key_dtype)  # (3, runs): starts, lengths, keys
        footer = IndexedFooter(footers[i], size, tuple(rows[i]), digests[i], kv_fields[numbers[i]])
        opened[path] = _Opened(footer, schemas[numbers[i]], splits, told, found)
    return opened
