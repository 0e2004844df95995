"""The dataset index built on a Dask cluster (``write_index(client=...)``, ``dask-windows index
--scheduler``): the store listed once here, blocks of files opened on workers, the entries gathered
and written as a one-node build would; every footer passes through the client."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BLOCK_FILES", "WORKER_WAIT_SECONDS", "Listing", "cluster_entries", "listed_entries"]

#: Most files of one task: enough tasks to spread a store over the workers (four per worker) and report
#: progress, few enough that a task's scheduling (a few ms) stays small beside its reads.
BLOCK_FILES = 2_000
#: Seconds to wait for a worker when the scheduler has none (workers still starting), then raise: a build
#: on a cluster without workers would otherwise wait for ever.
WORKER_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Listing:
    """A dataset's files as listed here, the URLs the workers open, and on an object store each file's
    identity from the listing (``None`` on local disk: a worker's ``fstat`` gives it)."""

    files: list[str]
    urls: list[str]
    identities: dict[str, Any] | None


def listed_entries(url: str, storage_options: dict | None) -> tuple[Listing, str | None]:
    """``(the listing of url, the series column of its convert manifest or None)``."""
    import os

    from dask_windows.sources import identity
    from dask_windows.sources.manifest import read_manifest
    from dask_windows.sources.parquet import PARQUET_SUFFIXES
    from dask_windows.sources.parquet.footers import is_local, list_files

    listed: dict = {}
    fs, files, _, _ = list_files(url, storage_options, PARQUET_SUFFIXES, listed, stat_local=False)
    local = is_local(fs)
    manifest_series = None
    root = fs._strip_protocol(os.fspath(url)).rstrip("/")
    if not any(ch in url for ch in "*?[") and fs.isdir(root):
        manifest = read_manifest(root, fs)
        manifest_series = None if manifest is None else manifest["series"]
    urls = files if local else [fs.unstrip_protocol(p) for p in files]
    identities = None if local else {p: identity.from_info(listed.get(p)) for p in files}
    return Listing(files, urls, identities), manifest_series


def cluster_entries(
    client: Any,
    entries_of: Callable[[Any, str | None, int], list[tuple]],
    urls: list[str],
    storage_options: dict | None,
    open_series: str | None,
    scan_series: str | None,
    threads: int,
    listing: Listing | None = None,
) -> list[tuple]:
    """``entries_of(source, scan_series, threads)`` of ``urls``, each block opened on one of ``client``'s
    workers; ``listing``'s identities replace those a worker cannot know (an object store's)."""
    workers = len(client.scheduler_info().get("workers", {}))
    if workers == 0:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError as exc:
            raise ConnectionError(
                f"the Dask scheduler at {client.scheduler.address} has no worker (none joined in "
                f"{WORKER_WAIT_SECONDS:g} s), so no footer can be read there; start workers on it "
                "(`dask worker ADDRESS`), or build the index without a cluster (leave out --scheduler / client=)"
            ) from exc
        workers = max(len(client.scheduler_info().get("workers", {})), 1)
    per = max(min(BLOCK_FILES, math.ceil(len(urls) / (4 * workers))), 1)
    settings = (storage_options, open_series, scan_series, threads)
    futures = [
        client.submit(_block_entries, entries_of, urls[lo : lo + per], *settings, pure=False)
        for lo in range(0, len(urls), per)
    ]
    try:
        entries = [entry for block in client.gather(futures) for entry in block]
    finally:
        client.cancel(futures)
    if listing is not None and listing.identities is not None:
        known = listing.identities
        entries = [
            (path, footer, known.get(path, ident), schema, runs) for path, footer, ident, schema, runs in entries
        ]
    return entries


def _block_entries(
    entries_of: Callable[[Any, str | None, int], list[tuple]],
    urls: list[str],
    storage_options: dict | None,
    open_series: str | None,
    scan_series: str | None,
    threads: int,
) -> list[tuple]:
    """On a worker: the entries of one block of files, opened as a list (no listing, no index)."""
    from dask_windows.sources.parquet import ParquetSource

    source = ParquetSource(urls, storage_options, threads=threads, series=open_series, index=False)
    return entries_of(source, scan_series, threads)
