"""The loader's threads: items read ahead of the consumer, in order, bounded.

``Prefetcher(read, keys, depth, threads=N)`` calls ``read(key)`` on ``N`` named daemon threads, at most
``depth`` results read or being read but not taken, handed over in key order; ``Ahead(items, depth)``
runs an iterator on one thread alike. The end and any exception travel to the consumer as values
(re-raised there). ``close()`` (at the end, a break, collection, or from another thread: a waiting
consumer then gets ``PrefetchClosed``) stops and joins the threads; ``depth=0`` reads on the consumer's
thread. Trade-off: ``N`` reads in flight hold ``N`` read buffers, and threads help only where a read
releases the GIL.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dask_windows.settings.tuning import EXIT_JOIN_SECONDS as _EXIT_JOIN_SECONDS
from dask_windows.settings.tuning import THREAD_WATCH_SECONDS

__all__ = ["Ahead", "GuardedThread", "PrefetchClosed", "Prefetcher", "fork_safe_lock"]


_FORK_SAFE: weakref.WeakSet = weakref.WeakSet()  # every fork_safe_lock of this process


def fork_safe_lock() -> threading.Lock:
    """A lock released in a forked child. A child (a DataLoader worker started by fork) keeps only the
    forking thread: a lock another thread held at the fork would stay held there, and its first use hang."""
    lock = threading.Lock()
    _FORK_SAFE.add(lock)
    return lock


def _release_after_fork() -> None:
    for lock in list(_FORK_SAFE):
        lock._at_fork_reinit()  # type: ignore[attr-defined]  # (what the standard library's own locks use)


os.register_at_fork(after_in_child=_release_after_fork)


class PrefetchClosed(RuntimeError):
    """The prefetcher was closed while a consumer waited for its next item."""


class _Failure:
    def __init__(self, key: Any, exc: BaseException) -> None:
        self.key = key
        self.exc = exc


class _Results:
    """Results by position, handed over in order; shared by the threads and the consumer."""

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}
        self.ready = threading.Condition()
        self.next_key = 0  # next position a reader claims
        self.closed = False

    def claim(self) -> int:
        with self.ready:
            k, self.next_key = self.next_key, self.next_key + 1
            return k

    def put(self, k: int, item: Any) -> None:
        with self.ready:
            self.items[k] = item
            self.ready.notify_all()

    def take(self, k: int, alive: Callable[[], bool] | None = None) -> Any:
        """Item ``k``, once put; ``alive`` (the producers run) is checked every ``THREAD_WATCH_SECONDS``."""
        with self.ready:
            while k not in self.items and not self.closed:
                if alive is None:
                    self.ready.wait()
                elif not self.ready.wait(THREAD_WATCH_SECONDS) and not alive() and k not in self.items:
                    return _Failure(k, MemoryError(_died(k)))  # its thread is gone: it will never come
            if k not in self.items:
                raise PrefetchClosed("the prefetcher was closed while waiting for its next item")
            return self.items.pop(k)

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify_all()

    def failed(self) -> bool:
        """Whether an exception waits among the results not yet taken."""
        with self.ready:
            return any(isinstance(item, _Failure) for item in self.items.values())


def _read_ahead(
    read: Callable[[Any], Any],
    keys: Sequence[Any],
    results: _Results,
    slots: threading.Semaphore,
    stop: threading.Event,
) -> None:
    while True:
        slots.acquire()
        if stop.is_set():
            return
        k = results.claim()
        if k >= len(keys):
            return
        try:
            item = read(keys[k])
        except BaseException as exc:  # relayed to the consumer, never swallowed
            results.put(k, _Failure(keys[k], exc))
            return
        results.put(k, item)


def _iterate_ahead(items: Iterator[Any], results: _Results, slots: threading.Semaphore, stop: threading.Event) -> None:
    k = 0
    while True:
        slots.acquire()
        if stop.is_set():
            return
        try:
            item = next(items)
        except StopIteration:
            results.put(k, _END)
            return
        except BaseException as exc:  # relayed to the consumer, never swallowed
            results.put(k, _Failure(k, exc))
            return
        results.put(k, item)
        k += 1


_END = object()


def _died(k: int) -> str:
    """Why item ``k`` never came: its thread ended without handing it over or an error."""
    return (
        f"a dask_windows reader or builder thread ended without handing over item {k} or an error (it failed where "
        f"it could not report, as when memory runs out: see the 'Exception in thread' above, if printed): {_REMEDY}"
    )


_LIVE: weakref.WeakSet[_Threads] = weakref.WeakSet()  # every prefetcher's threads not yet collected


def _stop_at_exit() -> None:
    """Stop and join, bounded, the threads of passes still open at exit (``atexit``): a reader left
    inside pyarrow while the interpreter finalises can abort the process (apache/arrow#34314)."""
    live = list(_LIVE)
    for threads in live:
        threads.signal()
    deadline = time.monotonic() + _EXIT_JOIN_SECONDS
    for threads in live:
        for thread in threads.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_stop_at_exit)


class _Threads:
    """Threads of one prefetcher, their bound and their results; ``close()`` joins them."""

    def __init__(
        self, target: Callable[..., None], args: tuple, depth: int, threads: int, name: str, burst: int = 0
    ) -> None:
        # Kept here: ``close`` may run while the interpreter exits, when module globals are gone.
        self._current_thread = threading.current_thread
        self._finalizing = sys.is_finalizing
        self.results = _Results()
        self.slots = threading.Semaphore(depth + burst)
        self.burst = burst  # the first ``burst`` items taken give back no slot: they were read beyond ``depth``
        self.stop = threading.Event()
        self.threads = [
            GuardedThread(
                target=target,
                args=(*args, self.results, self.slots, self.stop),
                name=name if i == 0 else f"{name}-{i}",
                daemon=True,
            )
            for i in range(threads)
        ]
        try:
            for thread in self.threads:
                thread.start()
        except BaseException:  # MemoryError: the threads already started stop, the caller sees the error
            self.signal()
            raise
        _LIVE.add(self)

    def take(self, k: int) -> Any:
        item = self.results.take(k, self.alive)
        if k >= self.burst:
            self.slots.release()
        return item

    def signal(self, interrupt: Callable[[], None] | None = None) -> None:
        """Tell the threads to stop and wake them wherever they wait; joins nothing."""
        self.stop.set()
        for _ in self.threads:
            self.slots.release()  # wake every thread waiting for a slot
        if interrupt is not None:
            interrupt()  # wake a thread waiting on something else, now that it will see the stop
        self.results.close()  # wake a consumer waiting in another thread

    def close(self, interrupt: Callable[[], None] | None = None, timeout: float | None = None) -> None:
        self.signal(interrupt)
        if self._finalizing():  # an iterator left open at exit: daemon threads are stopped, not joined
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            if thread is not self._current_thread():
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


class _Background:
    """What ``Prefetcher`` and ``Ahead`` share: their threads, ``alive``, and ``close`` when collected."""

    _threads: _Threads | None

    def close(self) -> None:  # pragma: no cover - both subclasses define it
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        """Whether a background thread is running."""
        return self._threads is not None and self._threads.alive()

    @property
    def failed(self) -> bool:
        """Whether an exception of the thread waits for the consumer (relayed when its item is taken)."""
        threads = self._threads
        return threads is not None and threads.results.failed()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class Prefetcher(_Background):
    """Iterate ``read(key)`` for ``keys`` in order, reading up to ``depth`` ahead (the items being read
    included) on ``threads`` threads named ``name``, ``name-1``...; ``read`` must be safe to call from them
    at once. Keys are claimed in order; the first ``burst`` are read without waiting for the consumer."""

    def __init__(
        self,
        read: Callable[[Any], Any],
        keys: Sequence[Any],
        depth: int,
        name: str = "dask-windows-prefetch",
        threads: int = 1,
        burst: int = 0,
    ) -> None:
        self._read = read
        self._keys = list(keys)
        self._taken = 0
        self._closed = False
        self._threads: _Threads | None = None
        if depth > 0 and self._keys:
            count = max(1, min(threads, depth + burst, len(self._keys)))
            self._threads = _Threads(_read_ahead, (read, self._keys), depth, count, name, burst)

    @property
    def keys(self) -> list[Any]:
        """What is read, in order."""
        return self._keys

    def widen(self, burst: int) -> None:
        """Read the first ``burst`` keys without waiting for the consumer (before any item is taken)."""
        threads = self._threads
        if threads is not None and burst > threads.burst and self._taken == 0:
            more, threads.burst = burst - threads.burst, burst
            threads.slots.release(more)

    @property
    def started(self) -> int:
        """Keys whose read has begun (on the threads, or taken without them)."""
        threads = self._threads
        if threads is None:
            return self._taken
        with threads.results.ready:
            return min(max(threads.results.next_key, self._taken), len(self._keys))

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._taken >= len(self._keys):
            self.close()
            raise StopIteration
        threads = self._threads
        if threads is None:
            if self._closed:
                raise PrefetchClosed(f"the prefetcher was closed with {len(self._keys) - self._taken} items not taken")
            item = self._read(self._keys[self._taken])
        else:
            item = threads.take(self._taken)
            if isinstance(item, _Failure):
                self.close()
                raise item.exc
        self._taken += 1
        return item

    def close(self, timeout: float | None = None) -> None:
        """Stop reading ahead and join the threads, at most ``timeout`` seconds (idempotent, from any thread)."""
        threads, self._threads = self._threads, None
        self._closed = True
        if threads is not None:
            threads.close(timeout=timeout)


class Ahead(_Background):
    """Iterate ``items`` on one background thread named ``name``, producing up to ``depth`` (>= 1) items
    ahead: it is resumed for item ``k + depth`` once item ``k`` is taken (its ``close`` is not called there)."""

    def __init__(self, items: Iterable[Any], depth: int = 1, name: str = "dask-windows-build") -> None:
        self._taken = 0
        self._threads: _Threads | None = _Threads(_iterate_ahead, (iter(items),), max(depth, 1), 1, name)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        threads = self._threads
        if threads is None:
            raise StopIteration
        item = threads.take(self._taken)
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        self._taken += 1
        return item

    def close(self, interrupt: Callable[[], None] | None = None, timeout: float | None = None) -> None:
        """Stop the thread and join it, at most ``timeout`` seconds (idempotent); ``interrupt`` is called
        between the stop and the join, to wake the thread where it waits on something else."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.close(interrupt, timeout)


# -- threads whose failed start raises ``MemoryError`` instead of hanging the caller ------------------
# ``Thread.start`` waits without a timeout for the new thread to signal that it runs; a thread that
# fails before that (under ``RLIMIT_AS`` it cannot allocate its first frame) would hang it forever.
# ``GuardedThread`` hands ``start`` a bootstrap method only the new thread holds (``start`` keeps a
# weak reference) and a ``_started`` event whose wait checks that reference every
# ``THREAD_WATCH_SECONDS``: a thread gone unstarted ends the wait and ``start`` raises. It relies on
# ``Thread._bootstrap``, ``_started`` and ``threading._limbo`` (private, unchanged in 3.8-3.13);
# without them it behaves as a plain thread.

_REMEDY = (
    "the process is out of memory (or at its thread limit); lower buffer_partitions, prefetch_partitions, "
    "batch_size or the DataLoader's num_workers, or give the process more memory"
)


class _Started(threading.Event):
    """A thread's ``_started`` event whose unbounded ``wait`` ends when the thread is gone unstarted."""

    def __init__(self, gone: Callable[[], bool]) -> None:
        super().__init__()
        self._gone = gone

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return super().wait(timeout)
        while not super().wait(THREAD_WATCH_SECONDS):
            if self._gone():
                return self.is_set()  # set just before it ended: started after all
        return True


class GuardedThread(threading.Thread):
    """A ``threading.Thread`` whose ``start`` raises ``MemoryError`` when the thread cannot start."""

    _start_error: BaseException | None = None
    _handed: Callable[[], Any] | None = None  # weak reference to the bootstrap only the new thread holds

    @property  # type: ignore[override]
    def _bootstrap(self) -> Callable[[], None]:
        """What ``Thread.start`` runs on the new thread: a fresh bound method, held by that thread alone."""
        method = self._guarded_bootstrap
        self._handed = weakref.ref(method)
        return method

    def _guarded_bootstrap(self) -> None:
        try:
            threading.Thread._bootstrap(self)  # type: ignore[attr-defined]
        except BaseException as exc:  # the thread's own bookkeeping failed: run() never ran
            self._start_error = exc
            started: Any = getattr(self, "_started", None)
            if started is not None:
                started.set()  # wake start(), which raises

    def _gone(self) -> bool:
        """Whether the new thread has ended (it released its bootstrap), whether or not it started."""
        handed = self._handed
        return handed is not None and handed() is None

    def start(self) -> None:
        """Start the thread; raise ``MemoryError`` if it could not start.

        Raises:
            MemoryError: naming the thread, chained to what failed.
        """
        started: Any = getattr(self, "_started", None)
        if isinstance(started, threading.Event) and not started.is_set():
            started = self._started = _Started(self._gone)
        try:
            super().start()
        except RuntimeError as exc:
            if "start" not in str(exc) or "new thread" not in str(exc):
                raise  # started twice, or not initialised: a bug, not a resource
            raise MemoryError(f"cannot start the thread {self.name!r} ({exc}): {_REMEDY}") from exc
        error = self._start_error
        if error is None and (started is None or started.is_set()):
            return
        self._forget()
        if error is not None:
            raise MemoryError(
                f"the thread {self.name!r} died while starting ({type(error).__name__}: {error}): {_REMEDY}"
            ) from error
        raise MemoryError(f"the thread {self.name!r} died while starting, before it could run any code: {_REMEDY}")

    def _forget(self) -> None:
        """A thread that never ran: stopped for ``join``, no longer listed by ``threading.enumerate``."""
        if hasattr(self, "_is_stopped"):
            self._is_stopped = True  # so join() returns (Python <= 3.12)
        started: Any = getattr(self, "_started", None)
        if started is not None:
            started.set()  # join() of a thread never started raises; this one ended
        limbo, lock = getattr(threading, "_limbo", None), getattr(threading, "_active_limbo_lock", None)
        if limbo is not None and lock is not None:
            with lock:
                limbo.pop(self, None)
