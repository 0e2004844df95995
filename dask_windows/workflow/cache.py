"""A workflow's transformed reads kept across epochs: in memory up to a byte budget, past it on a local disk.

``TransformCache`` keeps each range's transformed columns, keyed by partition, rows, columns and the
fitted workflow's checksum (``token``, checked once a pass: a refit clears it). A hit returns the arrays
kept (read-only), equal to a fresh read; a file rewritten after opening is noticed at a miss only.
Policy: keep what fits, never evict (each epoch's new random order would make an LRU evict ranges
before they come round). Memory is per process, on top of ``buffer_bytes``. The disk tier
(``Workflow(cache_dir=...)``): a range past the memory is written once to a file in a private folder
(``tempfile.mkdtemp`` in ``cache_dir``; layout and CRC-32 kept in this process only, so only this run's
files are read back; written under a temporary name, renamed, removed with the cache; a file cut short
or changed is removed and read afresh), within ``disk_bytes`` and ``KEEP_FREE``; past that, or when a
write fails, it stops writing with one ``TransformCacheWarning`` (docs/workflows.md).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
import warnings
import weakref
import zlib
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import numpy as np

from dask_windows.runtime.prefetch import fork_safe_lock

__all__ = ["KEEP_FREE", "TransformCache", "TransformCacheWarning", "held_bytes"]

log = logging.getLogger(__name__)

#: The start of the name of each process's folder inside ``cache_dir``.
FOLDER_PREFIX = "dask-windows-transformed-"
#: The start of a file's name while it is written (renamed when complete).
TEMP_PREFIX = ".tmp-"
#: Bytes the disk tier leaves free on its disk: it stops writing rather than take the free space below.
KEEP_FREE = 1 << 30
#: Each column's bytes start at a multiple of this in its file (views aligned for any dtype).
ALIGN = 64
#: Kinds of dtype written to disk as raw bytes: numbers, booleans, dates (a range holding Python
#: objects, such as strings passed through as they are read, stays off the disk).
RAW_KINDS = frozenset("biufcmM")


class TransformCacheWarning(UserWarning):
    """The disk tier stopped writing (the disk nearly full, a write failed): ranges not kept are read again."""


class _File(NamedTuple):
    """A range written to disk: its path, size in bytes, CRC-32 and each column's (name, dtype, shape, offset)."""

    path: str
    size: int
    crc: int
    layout: tuple


def held_bytes(columns: dict) -> int:
    """The bytes the arrays of ``columns`` keep alive (each view counted as the array it views, once)."""
    roots = {}
    for values in columns.values():
        root = values
        while isinstance(getattr(root, "base", None), np.ndarray):
            root = root.base
        roots[id(root)] = getattr(root, "nbytes", 0)
    return sum(roots.values())


class TransformCache:
    """Transformed row ranges kept up to ``memory`` bytes in memory (``Workflow.cache_bytes``) and, with
    ``directory`` (``Workflow.cache_dir``; created if missing), up to ``disk_bytes`` more in files there
    (``None``: half the space free on that disk now); ``parent``: the opening process's folder, where a
    copy in a DataLoader worker makes its own.

    Counters: ``hits`` (``disk_hits`` from disk), ``misses``, ``damaged`` files; ``held`` / ``disk_held`` bytes,
    never above ``limit`` / ``disk_limit``; ``budget``: memory and disk together (0: off); ``folder``: this
    process's folder (a DataLoader worker's made at its first file).
    """

    def __init__(
        self,
        memory: int,
        directory: str | os.PathLike | None = None,
        disk_bytes: int | None = None,
        parent: str | None = None,
    ) -> None:
        self.memory, self.limit, self.held, self.hits, self.misses = memory, memory, 0, 0, 0
        self.token: Hashable = None
        self._kept: dict[Hashable, dict] = {}
        self._lock = fork_safe_lock()  # (released in a DataLoader worker forked while a reader held it)
        self.directory = None if directory is None else os.fspath(directory)
        self.disk_hits = self.damaged = self.disk_held = 0
        self.folder: str | None = None
        self._files: dict[Hashable, _File | None] = {}  # None: being written
        self._written = 0  # files named so far
        self._generation = 0  # counts the times the files were dropped: a write begun before is not recorded
        self._stopped: str | None = None  # why the disk tier stopped writing
        self._pid, self._parent = os.getpid(), parent
        if self.directory is not None and parent is None:  # the opening process: its folder now (workers' go in it)
            self._open_folder()
        if self.directory is not None and disk_bytes is None:
            disk_bytes = _free(self.folder) // 2 if self.folder is not None else 0
        self.disk_budget = self.disk_limit = (disk_bytes or 0) if self.directory is not None else 0
        self.budget = self.memory + self.disk_budget
        self._warn()

    def check(self, token: Hashable, workers: int = 1) -> None:
        """Forget everything kept if the workflow's ``token`` changed (refitted) since it was kept; keep up
        to ``memory / workers`` bytes in memory and ``disk_bytes / workers`` on disk (each of a rank's
        DataLoader workers reads about its share of the units)."""
        self._own_process()
        with self._lock:
            self.limit, self.disk_limit = self.memory // workers, self.disk_budget // workers
            if token == self.token:
                return
            self._kept.clear()
            self.held, self.token = 0, token
            dropped = [file.path for file in self._files.values() if file is not None]
            self._files.clear()
            self.disk_held, self._generation = 0, self._generation + 1
        for path in dropped:
            _unlink(path)

    def find(self, key: Hashable) -> dict | None:
        """The columns kept under ``key`` in memory or on disk, or ``None`` (counted as a hit or a miss)."""
        if not self.budget:
            return None
        if self.directory is not None:
            self._own_process()
        with self._lock:
            found = self._kept.get(key)
            file = self._files.get(key) if found is None else None
            if file is None:
                self.hits += found is not None
                self.misses += found is None
                return found
        found = _load(file)  # outside the lock: other reader threads go on meanwhile
        with self._lock:
            self.hits += found is not None
            self.disk_hits += found is not None
            self.misses += found is None
            damaged = found is None and self._files.get(key) is file  # (not dropped by a refit meanwhile)
            if damaged:
                del self._files[key]
                self.disk_held -= file.size
                self.damaged += 1
        if damaged:
            log.warning("transformed rows' cache file %s is missing, cut short or changed; reading its rows again",
                        file.path)  # fmt: skip
            _unlink(file.path)
        return found

    def keep(self, key: Hashable, columns: dict) -> dict:
        """``columns`` (a fresh read's), kept under ``key`` if they fit in what is left of the memory budget,
        else written to disk if they fit there."""
        if not self.budget:
            return columns
        size = held_bytes(columns)
        with self._lock:
            if key in self._kept:
                return columns
            if self.held + size <= self.limit:
                for values in columns.values():
                    if isinstance(values, np.ndarray):
                        values.flags.writeable = False  # shared by every later read: a change would show there
                self._kept[key] = columns
                self.held += size
                return columns
        if self.directory is not None:
            self._write(key, columns)
        return columns

    def get(self, key: Hashable, read: Callable[[], dict]) -> dict:
        """``find(key)``, else ``keep(key, read())``."""
        found = self.find(key)
        return found if found is not None else self.keep(key, read())

    # -- the disk tier ------------------------------------------------------------------------

    def _write(self, key: Hashable, columns: dict) -> None:
        """``columns`` written to a file of their own if they fit in what is left of the disk budget."""
        if not all(isinstance(v, np.ndarray) and v.dtype.kind in RAW_KINDS for v in columns.values()):
            return
        layout, size = _layout(columns)
        self._own_process()
        with self._lock:
            if self._stopped or key in self._files or self.disk_held + size > self.disk_limit:
                return
            opened = self.folder is not None or self._open_folder()
            if opened:
                self._files[key] = None  # being written: a second reader of the range does not write it too
                self.disk_held += size
                self._written += 1
                path, generation = os.path.join(self.folder, f"{self._written}.bin"), self._generation  # type: ignore[arg-type]
        if not opened:
            return self._warn()
        try:
            free = _free(os.path.dirname(path))
            if free - size < KEEP_FREE:
                raise OSError(f"{free:,} bytes free there; the cache leaves {KEEP_FREE:,} free (KEEP_FREE)")
            crc = _write_file(path, columns, layout)
        except Exception as exc:  # (a cache that cannot write never ends the epoch: the rows are read again)
            with self._lock:
                if generation == self._generation:
                    del self._files[key]
                    self.disk_held -= size
                self._stop(str(exc))
            self._warn()
            return
        with self._lock:
            if generation == self._generation:
                self._files[key] = _File(path, size, crc, layout)
                return
        _unlink(path)  # the files were dropped (a refit) while this one was written

    def _own_process(self) -> None:
        """In a copy forked into another process (a DataLoader worker started by fork), forget the files
        of the process it was copied from: this one writes to a folder of its own, inside that one's."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._parent, self.folder = os.getpid(), self.folder or self._parent, None
                self._files, self.disk_held, self.disk_hits, self.damaged = {}, 0, 0, 0
                self._generation += 1

    def _open_folder(self) -> bool:
        """Make this process's folder (in the opening process's where it still exists); ``False`` (and the
        tier stopped) if it cannot be made."""
        where = self._parent if self._parent is not None and os.path.isdir(self._parent) else self.directory
        try:
            os.makedirs(where, exist_ok=True)  # type: ignore[arg-type]
            self.folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=where)
        except OSError as exc:
            self._stop(f"cannot make a folder there: {exc}")
            return False
        _remove_with(self, self.folder)
        return True

    def _stop(self, reason: str) -> None:
        """Stop writing, for ``reason`` (the first one kept); ``_warn`` says it once, outside the lock."""
        if self._stopped is None:
            self._stopped, self._unsaid = reason, True

    def _warn(self) -> None:
        if self.__dict__.pop("_unsaid", False):
            warnings.warn(
                f"Workflow.cache_dir={self.directory!r}: the transformed rows' disk cache stops writing "
                f"({self._stopped}); the {len(self._files)} ranges written are still read back, the others are "
                "read and transformed again each epoch. Free space there, or pass another cache_dir or a smaller "
                "cache_disk_bytes",
                TransformCacheWarning,
                stacklevel=2,
            )

    def __getstate__(self) -> dict:
        """Pickled (to a DataLoader worker) empty: each process keeps its own, its files in a folder of its own."""
        return {"memory": self.memory, "directory": self.directory, "disk_bytes": self.disk_budget,
                "parent": self.folder or self._parent, "stopped": self._stopped}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["memory"], state["directory"], state["disk_bytes"], state["parent"])  # type: ignore[misc]
        self._stopped = state["stopped"]  # (said by the process it was copied from)

    def __repr__(self) -> str:
        disk = f", {self.disk_held:,} of {self.disk_budget:,} on disk" if self.directory is not None else ""
        return (f"TransformCache({self.held:,} of {self.memory:,} bytes{disk}, {self.hits} hits, "
                f"{self.misses} misses)")  # fmt: skip


def _layout(columns: dict) -> tuple[tuple, int]:
    """Each column's (name, dtype, shape, offset) in a file of ``columns``, and the file's size."""
    layout, end = [], 0
    for name, values in columns.items():
        offset = -(-end // ALIGN) * ALIGN
        layout.append((name, values.dtype, values.shape, offset))
        end = offset + values.nbytes
    return tuple(layout), end


def _write_file(path: str, columns: dict, layout: tuple) -> int:
    """Write ``columns`` at ``layout``'s offsets to ``path`` (under a temporary name, then renamed); their CRC-32."""
    temp = os.path.join(os.path.dirname(path), TEMP_PREFIX + os.path.basename(path))
    crc, at = 0, 0
    try:
        with open(temp, "wb") as f:
            for name, _, _, offset in layout:
                raw = np.ascontiguousarray(columns[name]).reshape(-1).view(np.uint8)
                gap = bytes(offset - at)
                f.write(gap)
                f.write(raw.data)
                crc = zlib.crc32(raw.data, zlib.crc32(gap, crc))
                at = offset + raw.nbytes
        os.replace(temp, path)
    except BaseException:
        _unlink(temp)
        raise
    return crc


def _load(file: _File) -> dict | None:
    """The columns in ``file``, read-only views of its bytes; ``None`` if it is missing, of another size
    or its bytes changed."""
    data = np.empty(file.size, np.uint8)
    try:
        with open(file.path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size != file.size:
                return None
            view, done = data.data, 0
            while done < file.size:  # (one read but for files over 2 GiB)
                count = f.readinto(view[done:])
                if not count:
                    return None
                done += count
    except OSError:
        return None
    if zlib.crc32(data.data) != file.crc:
        return None
    data.flags.writeable = False
    out: dict[Any, np.ndarray] = {}
    for name, dtype, shape, offset in file.layout:
        out[name] = data[offset : offset + dtype.itemsize * int(np.prod(shape))].view(dtype).reshape(shape)
    return out


def _free(folder: str) -> int:
    """Bytes free on the disk of ``folder`` (0 if it cannot be told)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _remove_with(owner: object, folder: str) -> None:
    """Remove ``folder`` when ``owner`` is collected or this process exits; in this process only (a copy of
    ``owner`` forked into a DataLoader worker leaves it alone)."""
    pid = os.getpid()
    weakref.finalize(owner, _remove, folder, pid)
    if multiprocessing.parent_process() is not None:  # a worker ends with os._exit: no atexit, multiprocessing's hooks
        multiprocessing.util.Finalize(owner, _remove, args=(folder, pid), exitpriority=0)


def _remove(folder: str, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)
