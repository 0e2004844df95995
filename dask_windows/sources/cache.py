"""A local disk cache of the byte ranges read from remote objects, shared by processes.

Each column chunk is one entry: a file named by a digest of the object's URL, version and byte
range, followed by a CRC-32 of its key and bytes (a damaged entry is a miss). Entries live in
``OWN_FOLDER`` of ``cache_dir``, marked by ``MARKER_NAME``: nothing outside it is removed. Writers
rename entries into place and hold an ``flock`` while they evict (``cache_policy``) and write, so the
folder never exceeds ``max_bytes``; readers take no lock. Small row groups make many small files."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dask_windows.errors import ConfigError
from dask_windows.sources.cache_policy import KEEP_SECONDS, evictions

__all__ = ["RangeCache", "object_version", "split_merged"]

log = logging.getLogger(__name__)

ENTRY_SUFFIX = ".bin"
TEMP_PREFIX = ".tmp-"
LOCK_NAME = ".lock"
#: The folder inside ``cache_dir`` holding the entries; nothing outside it is ever removed.
OWN_FOLDER = "dask-windows-cache"
#: The file in ``OWN_FOLDER`` that says the cache made the folder (and may remove files in it).
MARKER_NAME = ".dask-windows-cache"
#: Bytes of the CRC-32 stored after each entry's bytes: an entry damaged on the local disk is a miss, not data.
CHECK_BYTES = 4
#: Keys of fsspec ``info()`` that change when an object is rewritten, in order of preference.
VERSION_KEYS = ("ETag", "etag", "md5Hash", "VersionId", "mtime", "LastModified", "last_modified", "created")


def object_version(info: dict) -> str:
    """What identifies one version of an object from its fsspec ``info()``: size and ETag/mtime."""
    parts = [f"size={info.get('size')}"]
    for key in VERSION_KEYS:
        if info.get(key) is not None:
            parts.append(f"{key}={info[key]}")
            break
    return ";".join(parts)


class RangeCache:
    """Byte ranges of remote objects kept in the folder ``directory`` (its ``OWN_FOLDER``: ``root``) under
    ``max_bytes`` (``None``: no limit); entries used within ``keep_seconds`` are not evicted. ``hits``
    and ``misses`` count reads served from disk and from the store in this process.

    Raises:
        ConfigError: The folder cannot be made, or ``OWN_FOLDER`` holds files without ``MARKER_NAME``."""

    def __init__(
        self, directory: str | os.PathLike, max_bytes: int | None = None, keep_seconds: float = KEEP_SECONDS
    ) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise ConfigError(f"cache_bytes={max_bytes!r} must be an int >= 0 (bytes) or None for no limit")
        self.directory = os.fspath(directory)
        self.root = os.path.join(self.directory, OWN_FOLDER)  # made with its parents by _claim
        _claim(self.root, self.directory)
        self.max_bytes = max_bytes
        self.keep_seconds = keep_seconds
        self.hits = 0
        self.misses = 0

    def fetch(
        self,
        url: str,
        version: str,
        ranges: Sequence[tuple[int, int]],
        fetch: Callable[[list[tuple[int, int]]], list[Any]],
    ) -> list[Any]:
        """The bytes of ``ranges`` (column chunks, one entry each) of ``url`` at ``version``: from the cache,
        the missing ones read by ``fetch`` (a list of ranges -> one bytes-like each) and stored."""
        paths = [self.path_of(url, version, r) for r in ranges]
        blobs: list[Any] = [self._read(path, b - a) for path, (a, b) in zip(paths, ranges)]
        missing = [i for i, blob in enumerate(blobs) if blob is None]
        if not missing:
            self.hits += 1
            return blobs
        self.misses += 1
        fetched = fetch([ranges[i] for i in missing])
        for i, blob in zip(missing, fetched):
            blobs[i] = blob
        self._store([(paths[i], blobs[i]) for i in missing])
        return blobs

    def path_of(self, url: str, version: str, byte_range: tuple[int, int]) -> str:
        """The entry file of one byte range of one version of ``url``."""
        digest = hashlib.sha256(f"{url}\n{version}\n{tuple(byte_range)}".encode()).hexdigest()[:40]
        return os.path.join(self.root, digest + ENTRY_SUFFIX)

    def _read(self, path: str, expected: int) -> memoryview | None:
        try:
            with open(path, "rb") as f:  # once open, an eviction cannot take the bytes away
                data = f.read()
        except FileNotFoundError:
            return None
        view = memoryview(data)[:expected]
        if len(data) != expected + CHECK_BYTES or _check(path, view) != int.from_bytes(data[expected:], "little"):
            # not written by this code, cut short, damaged on the disk or another key's bytes: a miss
            # (the CRC-32 would otherwise let flipped bits or exchanged entries through as values)
            log.warning("cache entry %s is damaged or of another version (%d bytes for %d); fetching again", path,
                        len(data), expected)  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        return view

    def _store(self, entries: list[tuple[str, Any]]) -> None:
        """Write ``(path, bytes)`` entries, all or none, evicting stale entries (``cache_policy``) for room."""
        try:
            with self._locked():
                room = _Room(self.root, self.max_bytes, self.keep_seconds)
                entries = [(path, blob) for path, blob in entries if not os.path.exists(path)]  # not stored meanwhile
                if not room.make(sum(len(blob) + CHECK_BYTES for _, blob in entries)):
                    return  # kept entries in use need the room: these stay uncached
                for path, blob in entries:
                    size = len(blob) + CHECK_BYTES
                    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self.root)
                    try:
                        with os.fdopen(fd, "wb") as f:
                            f.write(blob)
                            f.write(_check(path, blob).to_bytes(CHECK_BYTES, "little"))
                        os.replace(temp, path)
                    except BaseException:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(temp)
                        raise
                    room.add(os.path.basename(path), size)
        except OSError as exc:  # a full or read-only disk: the read still succeeds, uncached
            log.warning("cannot store entries in the cache folder %s: %s", self.root, exc)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        with open(os.path.join(self.root, LOCK_NAME), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def disk_bytes(self) -> int:
        """Bytes the cache's folder holds now (entries and temporary files)."""
        return sum(stat.st_size for name, stat in _scan(self.root) if name not in (LOCK_NAME, MARKER_NAME))

    def __repr__(self) -> str:
        return f"RangeCache({self.directory!r}, max_bytes={self.max_bytes})"


def _check(path: str, blob: Any) -> int:
    """The CRC-32 stored after an entry's bytes: of its key (the entry's file name) and its bytes."""
    return zlib.crc32(blob, zlib.crc32(os.path.basename(path).encode()))


def _claim(root: str, directory: str) -> None:
    """Make ``root`` the cache's own folder, or check that it is; raise if it holds files of someone else."""
    marker = os.path.join(root, MARKER_NAME)
    try:
        os.makedirs(root, exist_ok=True)
        if os.path.exists(marker):
            return
        others = sorted(os.listdir(root))
        if others:
            raise ConfigError(
                f"cache_dir={directory!r}: {root} holds files dask_windows did not write (first: {others[0]!r}) "
                f"and no {MARKER_NAME} marker; the cache removes files in that folder, so it will not use it: "
                "move those files or pass another cache_dir"
            )
        with open(marker, "a") as f:
            f.write("dask_windows RangeCache entries; files here are evicted and may be removed\n")
    except OSError as exc:
        raise ConfigError(f"cannot create the cache folder {root} (cache_dir={directory!r}): {exc}") from exc


def _scan(directory: str) -> Iterator[tuple[str, Any]]:
    with os.scandir(directory) as it:
        for entry in it:
            try:
                yield entry.name, entry.stat()
            except FileNotFoundError:  # removed while listing
                continue


class _Room:
    """Under the lock: the folder's entries by age, stale temporary files removed, eviction by ``cache_policy``."""

    def __init__(self, directory: str, max_bytes: int | None, keep_seconds: float = KEEP_SECONDS) -> None:
        self.directory, self.max_bytes, self.keep_seconds = directory, max_bytes, keep_seconds
        self.entries: list[tuple[int, str, int]] = []  # (mtime_ns, name, size), oldest first
        self.total = 0
        for name, stat in _scan(directory):
            if name.startswith(TEMP_PREFIX):  # no writer holds the lock: a killed writer's leftover
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
            elif name.endswith(ENTRY_SUFFIX):
                self.entries.append((stat.st_mtime_ns, name, stat.st_size))
                self.total += stat.st_size
        self.entries.sort()

    def make(self, size: int) -> bool:
        """Evict stale entries until ``size`` more bytes fit; ``False`` if they may not."""
        chosen = evictions(self.entries, self.total, self.max_bytes, size, time.time_ns(), self.keep_seconds)
        if chosen is None:
            return False
        for i in chosen:  # a prefix: the oldest first
            _, name, old = self.entries[i]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
            self.total -= old
        del self.entries[: len(chosen)]
        return True

    def add(self, name: str, size: int) -> None:
        self.entries.append((2**63, name, size))  # newest
        self.total += size


def split_merged(
    wanted: Sequence[tuple[int, int]], merged: Sequence[tuple[int, int]], blobs: Sequence[Any]
) -> list[memoryview]:
    """The bytes of each of ``wanted`` (sorted) out of ``blobs`` fetched for ``merged`` ranges covering them."""
    out, k = [], 0
    for a, b in wanted:
        while merged[k][1] < b:
            k += 1
        start = merged[k][0]
        out.append(memoryview(blobs[k])[a - start : b - start])
    return out
