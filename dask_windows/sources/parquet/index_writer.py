"""Writing the dataset index (``footer_index``): ``write_index`` and ``index_bytes``.

Apart from ``footer_index`` because writing opens a ``ParquetSource`` (which
reads indexes through ``footer_share``): the writer may import the source,
the reader may not.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from dask_windows.sources.parquet.footer_index import INDEX_NAME, entries_bytes, is_index
from dask_windows.sources.parquet.footers import map_in_blocks

__all__ = ["index_bytes", "verify_index", "write_index"]


def index_bytes(
    source: Any, root: str, series: str | None, compact: bool = True, where: str | None = None, threads: int = 16
) -> bytes:
    """The index of an opened ``ParquetSource`` (index=False) as bytes; runs of one-partition files that
    the open did not tell are scanned from the series column (``series``) on ``threads`` threads.
    ``where``: the folder the index goes to (its paths are written relative to it), ``None`` to keep
    ``root`` as it is (an index on another filesystem or bucket)."""
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
    return entries_bytes(
        source.files,
        root,
        [source._footers[p] for p in source.files],
        [source._identities.get(p) for p in source.files],
        source._schema_numbers,
        source._schemas,
        runs,
        series,
        source.local,
        compact,
        base=where,
        manifest=source.manifest_series is not None,
    )


def write_index(
    data: str | os.PathLike,
    out: str | None = None,
    *,
    series: str | None = None,
    storage_options: dict | None = None,
    threads: int = 16,
) -> dict:
    """Write the index of the Parquet dataset ``data`` (a folder, prefix, glob or file).

    Args:
        data: The dataset.
        out: Where to write it (default: ``INDEX_NAME`` in the folder or prefix ``data``). An existing
            file there is replaced only when it is an index this library wrote.
        series: The series column whose runs the index holds (default: the manifest's, if any).
        storage_options: fsspec options.
        threads: Threads reading the footers.

    Returns:
        ``{"index": url, "files": n, "bytes": size, "bytes_per_file": ...}``.

    Raises:
        FileExistsError: ``out`` holds a file that is not an index of this library.
        ValueError: ``data`` is a glob or a list and no ``out`` was given.
    """
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
    source = ParquetSource(url, storage_options, threads=threads, series=series, index=False)
    if series is None:
        series = source.manifest_series
    base = posixpath.dirname(root) if globbed else root
    same_fs = type(out_fs) is type(fs) and _bucket(out_fs, target) == _bucket(fs, base)
    blob = index_bytes(source, base, series, where=posixpath.dirname(target) if same_fs else None, threads=threads)
    _refuse_foreign(out_fs, target)
    if _is_local(out_fs):
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "wb") as dst:
            dst.write(blob)
        os.replace(tmp, target)
    else:
        out_fs.pipe_file(target, blob)
    shown = target if _is_local(out_fs) else out_fs.unstrip_protocol(target)
    return {
        "index": shown,
        "files": len(source.files),
        "bytes": len(blob),
        "bytes_per_file": len(blob) / len(source.files),
        "series": series,
    }


def _bucket(fs: Any, path: str) -> str:
    """The part of ``path`` a relative path cannot leave: the bucket on an object store, else ``""``."""
    return "" if _is_local(fs) else path.lstrip("/").split("/", 1)[0]


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _refuse_foreign(fs: Any, target: str) -> None:
    """Raise ``FileExistsError`` when ``target`` exists and is not an index of this library."""
    if not fs.exists(target):
        return
    if not is_index(fs.cat_file(target)):
        raise FileExistsError(
            f"{target} exists and is not a dask_windows index; the index is never written over another file: "
            "choose another out path or remove it"
        )


def verify_index(data: str | os.PathLike, index: Any = None, *, storage_options: dict | None = None) -> dict:
    """List the dataset ``data`` and compare every file with its index (``index``: as ``ParquetSource``'s).

    Opening an object store's folder from its index does not list it (``footer_share.open_unlisted``);
    this is the check on request: a file added, deleted, or of another size or version than indexed
    raises, naming it.

    Returns:
        ``{"index": where, "files": n}`` when every file is the one indexed.

    Raises:
        DataError: The index is stale (naming the first file that differs and the remedy), damaged, or
            of an earlier format.
        FileNotFoundError: No index there.
    """
    from dask_windows.sources.parquet import PARQUET_SUFFIXES
    from dask_windows.sources.parquet.footer_index import find_index
    from dask_windows.sources.parquet.footers import list_files
    from dask_windows.sources.parquet.index_open import IndexedIdentities, open_index

    url = os.fspath(data)
    listed: dict = {}
    fs, files, _, _ = list_files(data, storage_options, PARQUET_SUFFIXES, listed)
    local = _is_local(fs)
    found = find_index(fs, data, True if index is None else index)
    assert found is not None
    path, blob = found
    show = (lambda p: p) if local else fs.unstrip_protocol
    where = show(path) if index is None else os.fspath(index)
    root = None if any(ch in url for ch in "*?[") else fs._strip_protocol(url).rstrip("/")
    opened = open_index(blob, where, files, listed, local, None, root, show, True, posixpath.dirname(path))
    if local:
        identities = IndexedIdentities(opened)
        for file in files:
            identities.check_local(file)
    return {"index": where, "files": len(files)}
