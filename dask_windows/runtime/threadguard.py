"""Threads whose failed start raises ``MemoryError`` instead of hanging the caller.

``threading.Thread.start`` waits, without a timeout, for the new thread to
signal that it runs. A thread that the OS created but that fails in Python's
own bootstrap, before that signal (the allocation of its thread state or
locks, when memory is exhausted), exits silently, and ``start`` then waits
forever: a loader that starts a thread late in an epoch (the read pool's
starter, the next pass's timer, a lane helper, the prefetch threads of each
pass) hangs where it should fail.

``GuardedThread`` is a ``threading.Thread`` whose bootstrap, when it fails,
records the error and wakes ``start``, which raises ``MemoryError`` naming the
thread and the remedy. An OS refusal to create the thread (``RuntimeError:
can't start new thread``: memory or a thread limit) raises the same way. The
trade-off: it relies on ``Thread._bootstrap`` and ``Thread._started``, private
but unchanged from Python 3.8 to 3.13; on a Python without them it behaves as a
plain thread.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["GuardedThread"]

_REMEDY = (
    "the process is out of memory (or at its thread limit); lower buffer_partitions, prefetch_partitions, "
    "batch_size or the DataLoader's num_workers, or give the process more memory"
)


class GuardedThread(threading.Thread):
    """A ``threading.Thread`` whose ``start`` raises ``MemoryError`` when the thread cannot start."""

    _start_error: BaseException | None = None

    def _bootstrap(self) -> None:
        try:
            super()._bootstrap()  # type: ignore[misc]
        except BaseException as exc:  # the thread's own bookkeeping failed: run() never ran
            self._start_error = exc
            if hasattr(self, "_is_stopped"):
                self._is_stopped = True  # so join() returns (Python <= 3.12)
            started: Any = getattr(self, "_started", None)
            if started is not None:
                started.set()  # wake start(), which raises

    def start(self) -> None:
        """Start the thread; raise ``MemoryError`` if it could not start.

        Raises:
            MemoryError: naming the thread, chained to what failed.
        """
        try:
            super().start()
        except RuntimeError as exc:
            if "start" not in str(exc) or "new thread" not in str(exc):
                raise  # started twice, or not initialised: a bug, not a resource
            raise MemoryError(f"cannot start the thread {self.name!r} ({exc}): {_REMEDY}") from exc
        if self._start_error is not None:
            error = self._start_error
            raise MemoryError(
                f"the thread {self.name!r} died while starting ({type(error).__name__}: {error}): {_REMEDY}"
            ) from error
