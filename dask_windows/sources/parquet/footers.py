"""Opening Parquet files: one listing, one tail read per file, and only what planning needs kept.

``list_files`` is one ``find`` or ``glob``, which also gives the sizes. Each file's last
``FOOTER_BYTES`` are read once (again only for a larger footer); a ``Footer`` keeps the serialized
bytes, not the parsed ``FileMetaData`` (about 12 KiB of C++ objects), which a read parses again in
tens of microseconds."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SourceReadError
from dask_windows.planning.windows import find_runs
from dask_windows.settings.tuning import FOOTER_BYTES, TAIL_BATCH

__all__ = [
    "FOOTER_BYTES",
    "TAIL_BATCH",
    "Footer",
    "folder_of",
    "footer_reader",
    "is_local",
    "list_files",
    "map_in_blocks",
    "pack_runs",
    "paused_gc",
    "read_local",
    "split_sizes",
    "tail_runs",
    "unpack_runs",
]


class Footer:
    """What is kept of a file after opening it: ``raw``, the serialized footer (thrift, length, magic);
    ``size`` in bytes (a lower bound when not listed); ``rows`` of each row group."""

    __slots__ = ("raw", "rows", "size")

    def __init__(self, raw: bytes, size: int, rows: tuple[int, ...]) -> None:
        self.raw, self.size, self.rows = raw, size, rows

    @property
    def metadata(self) -> Any:
        """The parsed ``pyarrow.parquet.FileMetaData`` (parsed on every access: keep it while needed)."""
        return metadata_from_bytes(self.raw)

    @property
    def num_rows(self) -> int:
        return sum(self.rows)

    def __reduce__(self) -> tuple:
        return Footer, (self.raw, self.size, self.rows)


def metadata_from_bytes(raw: bytes) -> Any:
    """A serialized footer parsed into a ``FileMetaData`` by pyarrow's public reader, which raises on damaged
    bytes (its private unpickling path aborts the process)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.ParquetFile(pa.BufferReader(raw)).metadata


def footer_reader(tail: bytes, path: str) -> tuple[Any, int]:
    """``(pyarrow ParquetReader opened on the footer in tail, bytes needed)``, the reader ``None`` if ``tail``
    is short (not its ``FileMetaData``, whose ``schema`` makes a reference cycle)."""
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        raise SourceReadError(f"{path} does not end with the Parquet magic bytes: it is not Parquet or is truncated")
    needed = int.from_bytes(tail[-8:-4], "little") + 8
    if needed > len(tail):
        return None, needed
    buffer_reader, parquet_reader = _readers()
    source = buffer_reader(tail[-needed:] if needed < len(tail) else tail)
    if parquet_reader is None:  # pragma: no cover - a pyarrow without it: read_metadata's own reader
        import pyarrow.parquet as pq

        return pq.ParquetFile(source), needed
    reader = parquet_reader()  # what read_metadata does, without ParquetFile's Python set-up
    reader.open(source)
    return reader, needed


@functools.cache
def _readers() -> tuple[Any, Any]:
    """``(pyarrow.BufferReader, pyarrow._parquet.ParquetReader or None)``, imported once (not per file)."""
    import pyarrow as pa

    try:
        from pyarrow._parquet import ParquetReader
    except ImportError:  # pragma: no cover - a pyarrow without it
        ParquetReader = None
    return pa.BufferReader, ParquetReader


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's local filesystem."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def read_local(path: str, nbytes: int = FOOTER_BYTES) -> tuple[bytes, os.stat_result]:
    """``(tail, stat)`` of a local file: its last ``nbytes`` (its whole footer when larger) in one ``open``,
    ``fstat``, ``pread`` and ``close``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        stat = os.fstat(fd)
        size = stat.st_size
        tail = os.pread(fd, nbytes, max(0, size - nbytes))
        if len(tail) >= 12 and tail[-4:] == b"PAR1":
            needed = int.from_bytes(tail[-8:-4], "little") + 8
            if len(tail) < needed <= size:
                tail = os.pread(fd, needed, size - needed)
        return tail, stat
    finally:
        os.close(fd)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No full garbage collection inside: opening many files makes a few lasting objects per file, which
    every full collection would walk again."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 10**9)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def map_in_blocks(fn: Callable, items: list, threads: int) -> list:
    """``[fn(item) for item in items]`` on ``threads`` threads, a contiguous block of items per task."""
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    bounds = np.linspace(0, len(items), min(len(items), threads * 4) + 1).astype(int)
    blocks = [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    with ThreadPoolExecutor(min(threads, len(blocks))) as pool:
        return [result for block in pool.map(lambda b: [fn(item) for item in b], blocks) for result in block]


def tail_runs(meta: Any, schema: Any, series: str, tail: bytes, size: int) -> tuple[np.ndarray, ...] | None:
    """``(run_starts, run_lengths, run_keys)`` of a whole file decoded from ``tail`` when it is the whole
    file (``len(tail) == size``), else ``None``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if series not in schema.names or len(tail) < size:
        return None
    reader = pq.ParquetFile(pa.BufferReader(tail), metadata=meta, pre_buffer=False)
    keys = reader.read(columns=[series], use_threads=False).column(series).to_numpy()
    starts, lengths = find_runs(keys)
    return starts, lengths, keys[starts]


def pack_runs(runs: tuple) -> Any:
    """``(starts, lengths, keys)`` as ``((3, R) int64 array, key dtype)`` when the keys are integers: one
    array per file instead of three (kept for every small file between open and the series scan)."""
    if len(runs) == 2:  # packed already
        return runs
    starts, lengths, keys = runs
    keys = np.asarray(keys)
    if keys.dtype.kind in "iu" and keys.dtype.itemsize <= 8:
        packed = np.empty((3, len(keys)), np.int64)
        packed[0], packed[1], packed[2] = starts, lengths, keys  # uint64 keys wrap, as astype did
        return packed, keys.dtype
    return runs


def unpack_runs(packed: Any) -> tuple | None:
    """Undo ``pack_runs``: the three arrays, keys in their own dtype."""
    if packed is None or len(packed) == 3:
        return packed
    stacked, key_dtype = packed
    return stacked[0], stacked[1], stacked[2].astype(key_dtype)


def split_sizes(group_bytes: list[int], partition_bytes: int) -> list[tuple[int, ...]]:
    """Row groups of ``group_bytes`` bytes each cut into consecutive partitions of at most ``partition_bytes``
    (a row group larger than that is a partition of its own)."""
    groups: list[list[int]] = [[]]
    nbytes = 0
    for g, size in enumerate(group_bytes):
        if groups[-1] and nbytes + size > partition_bytes:
            groups.append([])
            nbytes = 0
        groups[-1].append(g)
        nbytes += size
    return [tuple(g) for g in groups]


def folder_of(fs: Any, data: Any) -> str | None:
    """The folder or prefix ``data`` names on ``fs`` (no protocol, no trailing ``/``); ``None`` for a glob or list."""
    if not isinstance(data, (str, os.PathLike)) or any(ch in os.fspath(data) for ch in "*?["):
        return None
    return fs._strip_protocol(os.fspath(data)).rstrip("/")


def list_files(
    data: Any,
    storage_options: dict | None,
    suffixes: tuple[str, ...],
    listed: dict | None = None,
    stat_local: bool = True,
) -> tuple[Any, list[str], list[int | None], str]:
    """``(fs, files, sizes, description)`` of a path, glob, URL or list of them, in one listing.

    ``listed`` receives the listing's ``info`` by path. In a folder, hidden files (``_SUCCESS``, ``.crc``)
    are left out, and files ending in ``suffixes`` kept when there are any; a path given twice raises.
    ``stat_local=False`` lists a local folder by names only (sizes ``None``)."""
    import fsspec

    options = dict(storage_options or {})
    if isinstance(data, (str, os.PathLike)):
        url = os.fspath(data)
        fs, root = fsspec.core.url_to_fs(url, **options)
        globbed = any(ch in root for ch in "*?[")
        found = fs.glob(root, detail=True) if globbed else _local_find(fs, root, stat_local)
        if found is None:
            found = fs.find(root, detail=True)  # recursive, paginated: one listing however many files
        infos = {p: i for p, i in found.items() if i.get("type", "file") == "file"}
        if not globbed:
            if not infos and not fs.exists(root):
                raise FileNotFoundError(
                    f"{url} does not exist; pass a Parquet file, a folder of them, a glob or a list"
                )
            stripped = root.rstrip("/")
            if len(infos) > 1 or stripped not in {p.rstrip("/") for p in infos}:
                infos = {p: i for p, i in infos.items() if not _hidden(p, root)}
                parquet = {p: i for p, i in infos.items() if p.lower().endswith(suffixes)}
                infos = parquet or infos
        files = sorted(infos)
        if listed is not None:
            listed.update(infos)
        if not files:
            raise FileNotFoundError(f"no Parquet files under {url}; expected files ending in {suffixes}")
        return fs, files, [infos[p].get("size") for p in files], url
    paths = [os.fspath(p) for p in data]
    if not paths:
        raise ConfigError("an empty list of paths was given; pass at least one Parquet file")
    fs, _ = fsspec.core.url_to_fs(paths[0], **options)
    files = [fsspec.core.url_to_fs(p, **options)[1] for p in paths]
    twice = sorted({p for p in files if files.count(p) > 1})
    if twice:
        raise ConfigError(
            f"{twice[0]} is given {files.count(twice[0])} times in the list of paths; each file may appear once "
            "(its windows would be yielded twice per epoch); remove the repeats"
        )
    description = f"{paths[0]} (+{len(paths) - 1} files)" if len(paths) > 1 else paths[0]
    return fs, files, [None] * len(files), description


def _local_find(fs: Any, root: str, stat: bool = True) -> dict[str, Any] | None:
    """``fs.find(root, detail=True)`` of a local folder by ``os.scandir`` (``None`` for anything else), one
    ``stat`` per file kept as ``mtime_ns`` (none with ``stat=False``); a broken link is listed size-less."""
    from fsspec.implementations.local import LocalFileSystem

    if os.name != "posix" or not isinstance(fs, LocalFileSystem) or not os.path.isdir(root):
        return None
    found: dict[str, Any] = {}
    folders = [root.rstrip("/") or "/"]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                try:
                    if entry.is_dir():
                        folders.append(entry.path)
                        continue
                    if not stat:
                        found[entry.path] = _NOT_STATTED
                        continue
                    info = entry.stat()
                except OSError:  # a broken link: listed, and its open reports it
                    found[entry.path] = {"name": entry.path, "size": None, "type": "file"}
                    continue
                found[entry.path] = {
                    "name": entry.path,
                    "size": info.st_size,
                    "type": "file",
                    "mtime": info.st_mtime,
                    "mtime_ns": info.st_mtime_ns,
                }
    return found


#: The one listing entry of every file of a folder listed without ``stat`` (read-only, shared).
_NOT_STATTED = types.MappingProxyType({"size": None, "type": "file"})


def _hidden(path: str, root: str) -> bool:
    """A part of ``path`` below ``root`` starts with ``_`` or ``.``."""
    stripped = root.rstrip("/")
    rel = "/" + (path[len(stripped) + 1 :] if path.startswith(stripped) else path)
    return "/_" in rel or "/." in rel
