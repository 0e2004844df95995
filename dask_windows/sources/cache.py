"""A local disk cache of the byte ranges read from remote objects, shared by processes.

``ParquetSource(cache_dir=...)`` hands every remote partition read (the
coalesced column-chunk ranges of one partition, fetched by one
``cat_ranges`` call) to ``RangeCache.fetch``. The first read stores the
bytes as one file named by a digest of the object's URL, size, version
(ETag, or modification time) and the ranges; later reads of the same ranges,
in any process on the machine, open that file and make no request. An object
rewritten since has another size or version, so another key: it is fetched
again and the stale entry ages out.

Sharing between processes (DDP ranks, DataLoader workers) is safe without a
server:

* an entry is written to a temporary name in the cache folder and renamed into
  place (``os.replace`` is atomic on POSIX), so a reader never sees a partial
  file; a writer killed half-way leaves only a temporary file, which no reader
  opens and a later eviction removes; an entry whose length is not the sum of
  its ranges is taken as a miss and removed;
* writers hold an exclusive ``flock`` on ``.lock`` while they evict and write, so
  the folder's bytes (entries and temporary files) never exceed ``max_bytes``;
* eviction unlinks the least recently used entries (modification time, touched
  on every hit); a reader that already opened an entry keeps reading it
  (an open descriptor survives ``unlink`` on POSIX), and one that loses the race
  to open it fetches the bytes from the store.

The trade-off: an entry is a partition's ranges for one set of columns, so
reading other columns of the same partition is a miss (and another entry), and
the eviction scan lists the folder on every write (cheap for thousands of
entries). Readers take no lock; writers serialise on one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dask_windows.errors import ConfigError

__all__ = ["RangeCache", "object_version"]

log = logging.getLogger(__name__)

ENTRY_SUFFIX = ".bin"
TEMP_PREFIX = ".tmp-"
LOCK_NAME = ".lock"
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
    """Byte ranges of remote objects kept in a local folder under a byte budget.

    Args:
        directory: The cache folder (created if missing); share it between the processes of a machine.
        max_bytes: Most bytes the folder may hold; ``None``: no limit.

    Attributes:
        hits: Reads served from disk in this process.
        misses: Reads fetched from the store in this process.
    """

    def __init__(self, directory: str | os.PathLike, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise ConfigError(f"cache_bytes={max_bytes!r} must be an int >= 0 (bytes) or None for no limit")
        self.directory = os.fspath(directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the cache folder cache_dir={self.directory!r}: {exc}") from exc
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    def path_of(self, url: str, version: str, ranges: Sequence[tuple[int, int]]) -> str:
        """The entry file of ``ranges`` of one version of ``url``."""
        digest = hashlib.sha256(f"{url}\n{version}\n{list(ranges)}".encode()).hexdigest()[:40]
        return os.path.join(self.directory, digest + ENTRY_SUFFIX)

    def fetch(
        self,
        url: str,
        version: str,
        ranges: Sequence[tuple[int, int]],
        fetch: Callable[[], list[bytes]],
    ) -> list[Any]:
        """The bytes of ``ranges`` of ``url``: from the cache, or ``fetch()`` and stored.

        Args:
            url: The object.
            version: Its ``object_version``.
            ranges: ``[start, stop)`` byte ranges.
            fetch: Reads the ranges from the store, one ``bytes`` per range.
        """
        path = self.path_of(url, version, ranges)
        expected = sum(b - a for a, b in ranges)
        data = self._read(path, expected)
        if data is not None:
            self.hits += 1
            return _split(data, ranges)
        self.misses += 1
        blobs = fetch()
        self._store(path, blobs, expected)
        return blobs

    def _read(self, path: str, expected: int) -> bytes | None:
        try:
            with open(path, "rb") as f:  # once open, an eviction cannot take the bytes away
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) != expected:  # not written by this code (or the disk lost it): a miss
            log.warning("cache entry %s holds %d bytes, expected %d; fetching again", path, len(data), expected)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        return data

    def _store(self, path: str, blobs: list[bytes], size: int) -> None:
        if self.max_bytes is not None and size > self.max_bytes:
            log.debug("not caching %s: %d bytes exceed cache_bytes=%d", path, size, self.max_bytes)
            return
        try:
            with self._locked():
                if os.path.exists(path):  # another process stored it meanwhile
                    return
                self._evict(size)
                fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self.directory)
                try:
                    with os.fdopen(fd, "wb") as f:
                        for blob in blobs:
                            f.write(blob)
                    os.replace(temp, path)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(temp)
                    raise
        except OSError as exc:  # a full or read-only disk: the read still succeeds, uncached
            log.warning("cannot store %s in the cache folder %s: %s", path, self.directory, exc)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        with open(os.path.join(self.directory, LOCK_NAME), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _evict(self, incoming: int) -> None:
        """Under the lock: remove stale temporary files, then LRU entries until ``incoming`` bytes fit."""
        entries, total = [], 0
        for item in _scan(self.directory):
            name, stat = item
            if name.startswith(TEMP_PREFIX):  # no writer holds the lock: a killed writer's leftover
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))
                continue
            if name.endswith(ENTRY_SUFFIX):
                entries.append((stat.st_mtime_ns, name, stat.st_size))
                total += stat.st_size
        entries.sort()
        while self.max_bytes is not None and entries and total + incoming > self.max_bytes:
            _, name, size = entries.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
            total -= size

    def disk_bytes(self) -> int:
        """Bytes the cache folder holds now (entries and temporary files)."""
        return sum(stat.st_size for name, stat in _scan(self.directory) if name != LOCK_NAME)

    def __repr__(self) -> str:
        return f"RangeCache({self.directory!r}, max_bytes={self.max_bytes})"


def _scan(directory: str) -> Iterator[tuple[str, Any]]:
    with os.scandir(directory) as it:
        for entry in it:
            try:
                yield entry.name, entry.stat()
            except FileNotFoundError:  # removed while listing
                continue


def _split(data: bytes, ranges: Sequence[tuple[int, int]]) -> list[Any]:
    view, out, at = memoryview(data), [], 0
    for a, b in ranges:
        out.append(view[at : at + b - a])
        at += b - a
    return out
