"""DataLoader workers that would outlive their training process watch it and end with it.

A ``forkserver`` worker is a child of the fork server, so torch's watchdog never fires when the
training process dies hard (``os._exit``, an OOM kill); it runs a daemon thread that waits for the
process that pickled its dataset (a ``pidfd``, else a check every ``POLL_SECONDS``) and then exits.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Any

from dask_windows.runtime.prefetch import GuardedThread, fork_safe_lock
from dask_windows.settings.tuning import WATCH_POLL_SECONDS as POLL_SECONDS

__all__ = ["POLL_SECONDS", "record_pickler", "watch_pickler", "watch_training_process"]

log = logging.getLogger(__name__)


_watched: set[int] = set()  # training pids this process already watches
_watched_lock = fork_safe_lock()


def watch_training_process(pid: int | None) -> bool:
    """End this process when process ``pid`` ends (one daemon thread per pid); whether a watch runs."""
    if pid is None or pid == os.getpid():
        return False
    with _watched_lock:
        if pid in _watched:
            return True
        _watched.add(pid)
    handle = _pidfd(pid)
    if handle is None and not _alive(pid):
        _end(pid)  # gone already: the worker has no one to work for
    GuardedThread(target=_watch, args=(pid, handle), name=f"dask-windows-watch-{pid}", daemon=True).start()
    return True


def record_pickler(state: dict) -> dict:
    """Note in a dataset's pickled ``state`` the process pickling it: the training process, for its workers."""
    state["_pickled_by"] = os.getpid()
    return state


def watch_pickler(obj: Any) -> bool:
    """In a DataLoader worker: end with the process that pickled ``obj`` for it unless that is the parent
    (torch's watchdog covers a spawned worker; a forked one inherited no pickle of its own). Whether a
    watch runs."""
    pid = getattr(obj, "_pickled_by", None)
    if pid is None or pid == os.getppid() or pid == os.getpid():
        return False
    return watch_training_process(pid)


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits), or ``None`` where pidfds are missing."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except ProcessLookupError:
        _end(pid)
    except OSError:  # an old kernel, or not permitted: poll instead
        return None
    return None  # pragma: no cover - _end does not return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: a recycled pid of another user
        return False
    return True


def _watch(pid: int, handle: int | None) -> None:
    """The watch thread: wait for ``pid`` to end, then end this process."""
    if handle is not None:
        select.select([handle], [], [])  # readable when the process has exited
    else:
        stop = threading.Event()  # never set: a bounded wait between checks, not a busy loop
        while _alive(pid):
            stop.wait(POLL_SECONDS)
    _end(pid)


def _end(pid: int) -> None:
    log.warning("the training process %d ended; worker %d exits", pid, os.getpid())
    os._exit(1)
