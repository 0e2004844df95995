"""A local disk cache of the byte ranges read from remote objects, shared by processes.

``ParquetSource(cache_dir=...)`` hands every remote partition read (the
byte ranges of its column chunks) to ``RangeCache.fetch``. Each column chunk
is one entry: a file named by a digest of the object's URL, size, version
(ETag, or modification time) and the chunk's byte range. Chunks found on disk
are taken from there; the missing ones are fetched together (close ones
merged into one request, as without a cache) and stored. Later reads, in any
process on the machine and whatever rows or pieces of the partition they
group, make no request for a stored chunk. An object rewritten since has
another size or version, so other keys: it is fetched again and the stale
entries age out.

The entries live in a folder the cache owns, ``OWN_FOLDER`` inside
``cache_dir``, marked by a ``MARKER_NAME`` file the cache writes when it makes
the folder: eviction and the removal of temporary files look only there, so a
``cache_dir`` holding the user's own files (``"."``, ``"~/models"``) never loses
one. A folder of that name holding files but no marker is refused.

Each entry's CRC-32 covers its key (the digest naming it) and its bytes, so an
entry whose bytes belong to another range or object (entries exchanged or
copied under another name) fails the check like a damaged one: a miss.

Sharing between processes (DDP ranks, DataLoader workers) is safe without a
server:

* an entry is written to a temporary name in the cache folder and renamed into
  place (``os.replace`` is atomic on POSIX), so a reader never sees a partial
  file; a writer killed half-way leaves only a temporary file, which no reader
  opens and a later eviction removes; an entry whose length is not the sum of
  its ranges, or whose CRC-32 (``CHECK_BYTES`` after its bytes) does not match
  them, is taken as a miss and removed;
* writers hold an exclusive ``flock`` on ``.lock`` while they evict and write, so
  the folder's bytes (entries and temporary files) never exceed ``max_bytes``;
* eviction unlinks the least recently used entries (modification time, touched
  on every hit); a reader that already opened an entry keeps reading it
  (an open descriptor survives ``unlink`` on POSIX), and one that loses the race
  to open it fetches the bytes from the store.

The trade-off: one file per column chunk (row group x column) means many small
files for datasets of small row groups, and a writer lists the folder once per
partition it stores (cheap for thousands of entries; slower for millions).
Readers take no lock; writers serialise on one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dask_windows.errors import ConfigError

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
    """Byte ranges of remote objects kept in a local folder under a byte budget.

    Args:
        directory: The cache folder (created if missing); share it between the processes of a machine.
            The entries go into its subfolder ``OWN_FOLDER`` (``root``); other files are left alone.
        max_bytes: Most bytes the entries may take; ``None``: no limit.

    Raises:
        ConfigError: the folder cannot be made, or ``OWN_FOLDER`` exists holding files the cache did
            not write (no ``MARKER_NAME``).

    Attributes:
        root: The folder holding the entries.
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
        self.root = os.path.join(self.directory, OWN_FOLDER)
        _claim(self.root, self.directory)
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    def fetch(
        self,
        url: str,
        version: str,
        ranges: Sequence[tuple[int, int]],
        fetch: Callable[[list[tuple[int, int]]], list[Any]],
    ) -> list[Any]:
        """The bytes of ``ranges`` (column chunks) of ``url``: from the cache, the missing ones fetched and stored.

        Args:
            url: The object.
            version: Its ``object_version``.
            ranges: ``[start, stop)`` byte ranges; each is one entry.
            fetch: Reads a list of ranges from the store (in as few requests as it likes), one
                bytes-like per range.

        Returns:
            One bytes-like per range of ``ranges``.
        """
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
        """Write ``(path, bytes)`` entries that fit the budget, evicting the least recently used first."""
        try:
            with self._locked():
                room = _Room(self.root, self.max_bytes)
                for path, blob in entries:
                    size = len(blob) + CHECK_BYTES
                    if os.path.exists(path) or not room.make(size):  # stored meanwhile, or larger than the budget
                        continue
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
    """Under the lock: the folder's entries by age, stale temporary files removed, LRU eviction."""

    def __init__(self, directory: str, max_bytes: int | None) -> None:
        self.directory, self.max_bytes = directory, max_bytes
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
        """Evict until ``size`` more bytes fit; ``False`` if they never can."""
        if self.max_bytes is None:
            return True
        if size > self.max_bytes:
            return False
        while self.entries and self.total + size > self.max_bytes:
            _, name, old = self.entries.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
            self.total -= old
        return self.total + size <= self.max_bytes

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
