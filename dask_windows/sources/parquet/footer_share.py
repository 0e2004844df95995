"""Where a Parquet dataset's footers come from at open: its index, another rank, or the files.

``open_footers`` tries an index (beside the data, or ``index=PATH``: one read, checked against the
listing); else, on an object store with more than one rank, the first rank to open a listing reads
the footers and hands them to the others in the index's format through the process group's
key-value store (``footer_group=``: nothing collective, so a rank opening a dataset alone never
hangs; a rank that waits past ``SHARE_WAIT_SECONDS`` reads its own); else every footer is read.
docs/startup.md tells the protocol; ``DASK_WINDOWS_SHARE_FOOTERS=0`` turns the sharing off."""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import posixpath
from collections.abc import Callable
from typing import Any

from dask_windows.errors import DataError
from dask_windows.settings.tuning import SHARE_WAIT_SECONDS, switches
from dask_windows.sources.manifest import MANIFEST_NAME
from dask_windows.sources.parquet.footer_index import entries_bytes, find_index
from dask_windows.sources.parquet.footers import folder_of
from dask_windows.sources.parquet.index_open import OldIndex, open_index
from dask_windows.sources.parquet.opening import number_schemas

__all__ = ["SHARE_WAIT_SECONDS", "open_footers", "open_unlisted", "shared_open"]

log = logging.getLogger("dask_windows.sources.parquet")

_FAILED = b"-"
_OPENS: dict[str, int] = {}  # listing digest -> times this process opened it


def open_footers(
    source: Any,
    data: Any,
    files: list[str],
    sizes: list,
    listed: dict,
    threads: int,
    partition_bytes: int,
    series: str | None,
    index: Any,
) -> Any:
    """Every file opened from the cheapest place: ``opening._Opened`` by path, or an index's columns
    (``index_open.IndexedFiles``)."""
    found = find_index(source.fs, data, index)
    if found is not None:
        path, blob = found
        data_root = folder_of(source.fs, data)
        where = source._url(path) if index in (None, True) else os.fspath(index)
        try:
            opened = open_index(
                blob, where, files, listed, source.local, series, data_root, source._url, index_dir=_folder(path)
            )
            if source.local and index in (None, True) and data_root is not None and _has_manifest(source, data_root):
                # converted data: every file checked now (one stat each), not at its first read, so that a
                # file changed after convert reaches the manifest's checks below and their remedy
                from dask_windows.sources.parquet.index_open import IndexedIdentities

                identities = IndexedIdentities(opened)
                for file in opened.files:
                    identities.check_local(file)
        except OldIndex as exc:
            if index not in (None, True):
                raise
            log.warning("%s; reading every footer instead", exc)  # found beside the data: still opens
        except DataError as exc:
            # The index `convert` wrote beside its manifest: the manifest's checks, which run next on
            # footers read afresh, name what changed and the remedy of converted data (rerun convert).
            if index not in (None, True) or data_root is None or not _has_manifest(source, data_root):
                raise
            log.warning("%s; reading every footer so the convert manifest's checks can name the change", exc)
        else:
            log.info("opened %s from its index %s (%d files, one read)", source.description, where, len(files))
            return opened
    return shared_open(
        source,
        files,
        sizes,
        listed,
        partition_bytes,
        series,
        lambda: source._open_files(files, sizes, threads, partition_bytes, series),
    )


def open_unlisted(fs: Any, data: Any, index: Any, series: str | None, url: Callable[[str], str]) -> Any:
    """``(files, sizes, IndexedFiles)`` of an object-store folder opened from its index without listing the
    store (one GET), or ``None`` where the index does not answer alone (none there, a glob or list, an
    index of another folder). The index is then the source of truth: an object
    added since is not opened, one deleted or rewritten fails at its first read, naming the index and
    `dask-windows index --verify`."""
    from dask_windows.sources.parquet.footer_index import INDEX_NAME
    from dask_windows.sources.parquet.index_open import index_root, read_index

    data_root = folder_of(fs, data)  # (ParquetSource asks only with index=False left out, off local disk)
    if data_root is None:
        return None
    if index in (None, True):
        path, where = posixpath.join(data_root, INDEX_NAME), None
        try:
            blob = fs.cat_file(path, start=0)  # a ranged GET: no HEAD first (fsspec sizes a whole-object read)
        except FileNotFoundError:
            if index is True:
                raise FileNotFoundError(
                    f"no dataset index at {url(path)}; write one with `dask-windows index {os.fspath(data)}`"
                ) from None
            return None
        where = url(path)
    else:
        import fsspec

        index_fs, path = fsspec.core.url_to_fs(os.fspath(index), **getattr(fs, "storage_options", {}))
        if type(index_fs) is not type(fs):
            return None
        try:
            blob = index_fs.cat_file(path, start=0)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"index={os.fspath(index)!r} does not exist; write it with `dask-windows index`"
            ) from exc
        where = os.fspath(index)
    try:
        table, header = read_index(blob, where)
    except OldIndex:
        if index not in (None, True):
            raise
        return None  # listed, and open_footers warns and reads every footer
    root = index_root(header, _folder(path))
    if root != data_root or header["local"]:
        return None  # an index of another folder, or of local files: the listing picks the files
    prefix = root + "/" if root else ""
    files = [prefix + p for p in table.column("path").to_pylist()]
    opened = open_index(blob, where, files, {}, False, series, data_root, url, False, _folder(path), (table, header))
    opened.unlisted = True
    log.info("opened %s from its index %s (%d objects, one read, no listing)", url(data_root), where, len(files))
    return files, opened.sizes.tolist(), opened


def _folder(path: str) -> str:
    """The folder of ``path`` (an index's: the folder its paths are relative to)."""
    return posixpath.dirname(path.rstrip("/"))


def _has_manifest(source: Any, root: str) -> bool:
    """Whether ``root`` holds the manifest ``dask-windows convert`` writes."""
    try:
        return bool(source.fs.exists(f"{root}/{MANIFEST_NAME}"))
    except OSError:
        return False


def shared_open(
    source: Any,
    files: list[str],
    sizes: list,
    listed: dict,
    partition_bytes: int,
    series: str | None,
    open_here: Callable[[], dict],
) -> Any:
    """``open_here()`` on the first rank to open this listing; the others take its footers (see above)."""
    # Local files (page-cached, tens of microseconds a footer) open faster than the exchange: on 2
    # ranks 1,000 local files took 1.2 s each reading, 2.4 s shared (benchmarks/bench_startup.py).
    wanted = not source.local and switches().share_footers
    group = getattr(source, "footer_group", None) if wanted else None  # (store, world): the dataset's
    if group is None:
        return open_here()
    store, world = group
    versions = [str((listed.get(p) or {}).get("ETag") or (listed.get(p) or {}).get("mtime")) for p in files]
    digest = hashlib.sha256(repr((files, sizes, versions, partition_bytes, series)).encode()).hexdigest()[:32]
    _OPENS[digest] = _OPENS.get(digest, 0) + 1
    key = f"dask_windows/footers/{digest}/{_OPENS[digest]}"
    if store.add(key + "/claim", 1) == 1:
        try:
            opened = open_here()
        except BaseException:
            store.set(key, _FAILED)  # the others read on their own, and report what this rank reports
            raise
        blob = _FAILED
        if len(opened) == len(files):  # files skipped at open (on_error="skip"): each rank decides its own
            try:
                blob = _exchange_bytes(source, files, opened, series)
            except Exception:
                log.warning("could not share the footers of %s with the other ranks", source.description, exc_info=True)
        store.set(key, blob)
        return opened
    wait = SHARE_WAIT_SECONDS + 0.01 * len(files)
    try:
        store.wait([key], datetime.timedelta(seconds=wait))
        blob = store.get(key)
    except Exception:
        log.warning("no rank shared the footers of %s within %.0f s: reading them here", source.description, wait)
        return open_here()
    if store.add(key + "/taken", 1) >= world - 1:
        try:
            store.delete_key(key)
        except Exception:  # a store without deletes keeps it
            pass
    if blob == _FAILED:
        return open_here()
    return open_index(
        blob, "the footers another rank shared", files, listed, source.local, series, None, source._url, False
    )


def _exchange_bytes(source: Any, files: list[str], opened: dict, series: str | None) -> bytes:
    """The opened files in the index format, full footers (no compaction pass), paths absolute."""
    schemas, numbers = number_schemas(opened, files)
    footers, identities = [opened[p].footer for p in files], [opened[p].identity for p in files]
    runs = [opened[p].runs for p in files]
    return entries_bytes(files, "", footers, identities, numbers, schemas, runs, series, source.local, compact=False)
