"""Writing the dataset index (``footer_index``); apart from it because writing opens a ``ParquetSource``."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from dask_windows.errors import DataError
from dask_windows.sources.parquet.footer_index import INDEX_NAME, entries_bytes, is_index
from dask_windows.sources.parquet.footers import folder_of, is_local, map_in_blocks

__all__ = ["entries_index", "source_entries", "verify_index", "write_index"]


def entries_index(
    entries: list[tuple],
    root: str,
    series: str | None,
    local: bool,
    compact: bool = True,
    where: str | None = None,
    manifest: bool = False,
) -> bytes:
    """The index of ``source_entries``'s entries (of one source or several) as bytes."""
    paths, footers, identities, file_schemas, runs = zip(*sorted(entries, key=lambda e: e[0]))
    schemas: list = []
    numbers = []
    for schema in file_schemas:  # one number per distinct schema over both sources
        found = next((k for k, known in enumerate(schemas) if known.equals(schema, check_metadata=True)), None)
        if found is None:
            found = len(schemas)
            schemas.append(schema)
        numbers.append(found)
    return entries_bytes(
        paths, root, footers, identities, numbers, schemas, runs, series, local, compact, base=where, manifest=manifest
    )


def source_entries(source: Any, series: str | None, threads: int) -> list[tuple]:
    """``(path, footer, identity, schema, runs)`` of each file of ``source``, untold runs scanned on threads."""
    from dask_windows.sources.base import Source

    one_partition = {
        p.key[0]: i for i, p in enumerate(source.partitions) if len(p.key[1]) == len(source._footers[p.key[0]].rows)
    }
    runs = [source._tail_runs.get(path) if series == source._tail_series else None for path in source.files]
    scan = [i for i, (path, told) in enumerate(zip(source.files, runs)) if told is None and path in one_partition]
    if series is not None and scan:
        # the series column of each file whose runs the open did not tell: one read each, many at once
        # (an object store answers concurrent requests in about the time of one)
        found = map_in_blocks(lambda i: Source.read_runs(source, one_partition[source.files[i]], series), scan, threads)
        for i, told in zip(scan, found):
            runs[i] = told
    return [
        (path, source._footers[path], source._identities.get(path), source._schemas[number], told)
        for path, number, told in zip(source.files, source._schema_numbers, runs)
    ]


def write_index(
    data: str | os.PathLike,
    out: str | None = None,
    *,
    series: str | None = None,
    storage_options: dict | None = None,
    threads: int = 16,
    client: Any = None,
) -> dict:
    """Write the index of the Parquet dataset ``data`` (a folder, prefix, glob or file).

    Args:
        out: Where to write it (default: ``INDEX_NAME`` in the folder ``data``); an existing file there is
            replaced only when it is an index this library wrote.
        series: The series column whose runs the index holds (default: the manifest's, if any).
        threads: Threads reading the footers (on each Dask worker with ``client``).
        client: A ``distributed.Client`` whose workers read the footers (``index_cluster``).

    Returns:
        ``{"index", "files", "bytes", "bytes_per_file", "series", "footers_read"}``.

    Raises:
        FileExistsError: ``out`` holds a file that is not an index of this library.
        ValueError: ``data`` is a glob or a list and no ``out`` was given."""
    import fsspec

    from dask_windows.sources.parquet import ParquetSource

    url = os.fspath(data)
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    globbed = any(ch in root for ch in "*?[")
    if out is None:
        if globbed or not fs.isdir(root):
            raise ValueError(
                f"{url} is not a folder or prefix, so the index has no place of its own; pass out=PATH "
                "(--out PATH) and open the dataset with index=PATH"
            )
        target, out_fs = posixpath.join(root, INDEX_NAME), fs
    else:
        out_fs, target = fsspec.core.url_to_fs(os.fspath(out), **(storage_options or {}))
    base = posixpath.dirname(root) if globbed else root
    same_fs = type(out_fs) is type(fs) and _bucket(out_fs, target) == _bucket(fs, base)
    where = posixpath.dirname(target) if same_fs else None
    split = _incremental(fs, url, out_fs, target, where, series, storage_options) if not globbed else None
    manifest = False
    if split is not None:  # the previous index tells the files it holds unchanged: only the others are read
        (kept, added), series = split
        previous = target if is_local(out_fs) else out_fs.unstrip_protocol(target)
        opened = ParquetSource(kept, storage_options, threads=threads, series=series, index=previous)
        entries = source_entries(opened, series, threads)
        if added and client is None:
            added_source = ParquetSource(added, storage_options, threads=threads, series=series, index=False)
            entries += source_entries(added_source, series, threads)
        elif added:  # the added files' footers read on the cluster, as a list of files (no listing there)
            from dask_windows.sources.parquet.index_cluster import cluster_entries

            entries += cluster_entries(client, source_entries, added, storage_options, series, series, threads)
        files, read = len(kept) + len(added), len(added)
    elif client is not None:  # listed here, every footer (and series column) read on the cluster
        from dask_windows.sources.parquet.index_cluster import cluster_entries, listed_entries

        listing, manifest_series = listed_entries(url, storage_options)
        scan = series if series is not None else manifest_series
        entries = cluster_entries(client, source_entries, listing.urls, storage_options, series, scan, threads, listing)
        files = read = len(listing.files)
        series, manifest = scan, manifest_series is not None
    else:
        source = ParquetSource(url, storage_options, threads=threads, series=series, index=False)
        series = series if series is not None else source.manifest_series
        entries = source_entries(source, series, threads)
        files = read = len(source.files)
        manifest = source.manifest_series is not None
    blob = entries_index(entries, base, series, is_local(fs), where=where, manifest=manifest)
    if out_fs.exists(target) and not is_index(out_fs.cat_file(target)):
        raise FileExistsError(
            f"{target} exists and is not a dask_windows index; the index is never written over another file: "
            "choose another out path or remove it"
        )
    if is_local(out_fs):
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "wb") as dst:
            dst.write(blob)
        os.replace(tmp, target)
    else:
        out_fs.pipe_file(target, blob)
    shown = target if is_local(out_fs) else out_fs.unstrip_protocol(target)
    return {
        "index": shown,
        "files": files,
        "bytes": len(blob),
        "bytes_per_file": len(blob) / files,
        "series": series,
        "footers_read": read,
    }


def _incremental(
    fs: Any, url: str, out_fs: Any, target: str, where: str | None, series: str | None, options: dict | None
) -> tuple[tuple[list[str], list[str]], str | None] | None:
    """``((files unchanged in the index at target, files added or changed), its series)`` as URLs when
    ``target`` is a readable index of this folder (of ``series``, if given); else ``None``."""
    from dask_windows.sources.identity import from_info
    from dask_windows.sources.parquet import PARQUET_SUFFIXES
    from dask_windows.sources.parquet.footers import list_files
    from dask_windows.sources.parquet.index_open import index_root, read_index

    try:
        blob = out_fs.cat_file(target)
        table, header = read_index(blob, target)
    except (OSError, DataError):
        return None  # none there, damaged, or of the earlier format: built whole
    if (series is not None and header["series"] != series) or where is None or header["local"] != is_local(fs):
        return None
    root = index_root(header, where)
    listed: dict = {}
    _, files, _, _ = list_files(url, options, PARQUET_SUFFIXES, listed)
    if fs._strip_protocol(url).rstrip("/") != root:
        return None
    rows = {root + "/" + p: i for i, p in enumerate(table.column("path").to_pylist())}
    sizes, versions = table.column("size").to_pylist(), table.column("version").to_pylist()
    kept: list[str] = []
    added: list[str] = []
    for path in files:
        i, info = rows.get(path), listed.get(path) or {}
        now = info.get("mtime_ns") if is_local(fs) else from_info(info).version  # as the index writes it
        now = None if now is None else str(now)
        same = i is not None and info.get("size") == sizes[i] and now is not None and now == versions[i]
        (kept if same else added).append(path if is_local(fs) else fs.unstrip_protocol(path))
    return ((kept, added), header["series"]) if kept else None


def _bucket(fs: Any, path: str) -> str:
    """The part of ``path`` a relative path cannot leave: the bucket on an object store, else ``""``."""
    return "" if is_local(fs) else path.lstrip("/").split("/", 1)[0]


def verify_index(data: str | os.PathLike, index: Any = None, *, storage_options: dict | None = None) -> dict:
    """List the dataset ``data`` and compare every file with its index; ``{"index": where, "files": n}``, or
    ``DataError`` naming the first file added, deleted or changed (``FileNotFoundError``: no index)."""
    from dask_windows.sources.parquet import PARQUET_SUFFIXES
    from dask_windows.sources.parquet.footer_index import find_index
    from dask_windows.sources.parquet.footers import list_files
    from dask_windows.sources.parquet.index_open import IndexedIdentities, open_index

    url = os.fspath(data)
    listed: dict = {}
    fs, files, _, _ = list_files(data, storage_options, PARQUET_SUFFIXES, listed)
    local = is_local(fs)
    found = find_index(fs, data, True if index is None else index)
    assert found is not None
    path, blob = found
    show = (lambda p: p) if local else fs.unstrip_protocol
    where = show(path) if index is None else os.fspath(index)
    root = folder_of(fs, url)
    opened = open_index(blob, where, files, listed, local, None, root, show, True, posixpath.dirname(path))
    if local:
        identities = IndexedIdentities(opened)
        for file in files:
            identities.check_local(file)
    return {"index": where, "files": len(files)}
